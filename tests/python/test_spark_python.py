#!/usr/bin/env python3
"""hvd_bridge.spark.run on real Spark clusters (label python, spark): spark_app.py, a PySpark
application, runs on

  local_cluster  Spark's local-cluster mode (a master, 2 workers and 2 executors, started by
                 PySpark itself), and
  standalone     a standalone cluster this test starts with spark-class: a master and two
                 workers, Spark authentication on with one secret given to the master, the
                 workers and the application; each worker offers two (fake) GPUs through
                 Spark's resource discovery, one per task;

and in each: a function with args and kwargs returns the values in rank order, its output
reaches an io.StringIO with the rank prefixes, each rank runs under its Spark task's Python
worker; a function that raises on rank 2 gives a JobError naming rank 2, its task and host,
with its traceback; a job after that failure runs as usual; a task slot held by another job
fails the job soon after start_timeout, saying so; a cancelled Spark job is one line; Ctrl-C (SIGINT) while the ranks
run raises KeyboardInterrupt once the job is down, and a job after it runs; on the standalone cluster each
rank gets its task's Spark GPU (CUDA_VISIBLE_DEVICES, HVD_GPUS); on the local cluster, an MLP trained
with hvd_bridge.torch's DistributedOptimizer on 1, 2 and 4 ranks reaches the same parameters
and at least 0.95 test accuracy. After each application nothing of
it is left running (its processes carry a marker) and nothing is left in its TMPDIR or in
/dev/shm (the shared-memory directories its MPI processes were given).

Exits 77 (skip) when Java, pyspark, cloudpickle or mpirun is missing, or under a sanitizer
build.
"""
import json
import os
import re
import shutil
import sys
import tempfile
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "spark"))
import hvdtest  # noqa: E402
import sparktest  # noqa: E402  (find_spark_home, private_spark_home, StandaloneCluster)
from hvdtest import check  # noqa: E402

ARGS = None
NUM_PROC = 4


class App:
    """One application's surroundings: a private work dir and SPARK_HOME, a marker."""

    def __init__(self, spark_home):
        self.work = tempfile.mkdtemp(prefix="hvd-pyspark-test.")
        self.home = sparktest.private_spark_home(spark_home, self.work)
        self.tmp = os.path.join(self.work, "tmp")
        os.makedirs(self.tmp)
        self.marker = "pyspark-" + uuid.uuid4().hex[:12]
        self.shm = None  # the /dev/shm directories the application's MPI processes were given
        self.env = hvdtest.marked_env(None, **{hvdtest.MARKER_VAR: self.marker})
        self.env.update(SPARK_HOME=self.home, SPARK_LOCAL_IP="127.0.0.1", TMPDIR=self.tmp,
                        PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                        PYTHONPATH=ARGS.pythonpath, SPARK_LOG_DIR=os.path.join(self.work, "logs"),
                        SPARK_PID_DIR=os.path.join(self.work, "pids"))

    def confs(self):
        return ["spark.ui.enabled=false", "spark.log.level=WARN",
                "spark.local.dir=" + os.path.join(self.work, "local"),
                "spark.executorEnv.PYTHONPATH=" + ARGS.pythonpath,
                "spark.executorEnv.TMPDIR=" + self.tmp,
                "spark.executorEnv.OMPI_ALLOW_RUN_AS_ROOT=1",
                "spark.executorEnv.OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"]

    def run(self, master, extra_confs=(), timeout=420):
        cmd = [sys.executable, os.path.join(HERE, "spark_app.py"), master, str(NUM_PROC)]
        self.shm = self.shm or hvdtest.ShmWatch(self.marker, var=hvdtest.MARKER_VAR)
        rc, out, err, secs = hvdtest.run(cmd + self.confs() + list(extra_confs), env=self.env,
                                        cwd=self.work, timeout=timeout, new_session=True)
        cases = {}
        for line in out.splitlines():
            m = re.match(r"^CASE (\w+) (.*)$", line)
            if m:
                cases[m.group(1)] = json.loads(m.group(2))
        return rc, cases, out + "\n" + err[-8000:]

    def finish(self, output, expect_shm=False):
        """Fails for processes, TMPDIR files or /dev/shm directories the application left;
        with expect_shm, also when no /dev/shm directory was seen at all (the check could not
        have failed)."""
        left = hvdtest.leftovers(self.marker, 30, var=hvdtest.MARKER_VAR)
        shm = self.shm.left() if self.shm else []
        # Spark's and torch's own scratch (torch.compile's cache) are theirs to keep.
        files = [f for f in os.listdir(self.tmp)
                 if not f.startswith(("spark-", "blockmgr-", "torchinductor_"))]
        shutil.rmtree(self.work, ignore_errors=True)
        check(not left, "processes of the application left behind:\n  " + "\n  ".join(left))
        check(not files, "files left in the application's TMPDIR: %s" % files)
        check(not expect_shm or (self.shm and self.shm.seen), "no /dev/shm directory of the "
              "application's MPI processes was seen, so what it left there could not be checked")
        check(not shm, "left in /dev/shm: %s" % shm)


def check_cases(rc, cases, output):
    tail = "\n--- output ---\n" + output[-6000:]
    check(rc == 0, "the application exited %d%s" % (rc, tail))
    v = cases.get("values")
    check(v is not None, "no values case" + tail)
    vals = v["values"]
    check([x["rank"] for x in vals] == list(range(NUM_PROC)), "rank order: %r" % vals)
    check(all(x["size"] == NUM_PROC and x["value"] == 10 * x["rank"] + 1 for x in vals),
          "args and kwargs: %r" % vals)
    for x in vals:  # orted, and so the rank, runs under a PySpark worker of an executor
        chain = x["ancestors"]
        check(any("pyspark.daemon" in c or "pyspark.worker" in c for c in chain) and
              any("CoarseGrainedExecutorBackend" in c for c in chain),
              "rank %d under a PySpark worker of an executor: %r" % (x["rank"], chain))
    for r in range(NUM_PROC):
        check("[1,%d]<stdout>:rank %d says hello" % (r, r) in v["stdout"],
              "rank %d's output in the StringIO: %r" % (r, v["stdout"]))
    e = cases.get("exception", {})
    check(e.get("raised") and e.get("type") == "JobError" and e.get("rank") == 2,
          "JobError naming rank 2: %r" % e)
    check(re.match(r"^rank 2 \(task \d+ on \S+\) raised ValueError: rank two fails on purpose",
                   e.get("message", "")), "the message: %r" % e.get("message"))
    check("fails_on_two" in (e.get("traceback") or ""), "the remote traceback: %r" % e)
    # hvd-exec names the program python, not the /bin/sh that starts the worker's ($HVD_PYTHON).
    check((e.get("rank_errors") or [""] * 3)[2].startswith("python exited with status 1: "),
          "rank 2's error names python: %r" % e.get("rank_errors"))
    check([x["rank"] for x in cases.get("again", {}).get("values", [])] == list(range(NUM_PROC)),
          "a job after the failure: %r" % cases.get("again"))
    errors = cases.get("refused", {}).get("errors") or [None] * 3
    for got, want in zip(errors, ("TypeError: stdout must be a text stream with a write method",
                                  "ValueError: min_np=1 and min_num_proc=2 name the same thing",
                                  "ValueError: max_np must be a whole number of at least 1")):
        check(got and got.startswith(want), "refused before a stage: %r, want %r" % (got, want))
    sl = cases.get("slots", {})
    m = re.match(r"JobError: timed out after 3 s waiting for (\d+) Spark task slots: the "
                 r"application has (\d+) ", sl.get("raised") or "")
    check(m and int(m.group(1)) == sl.get("want") and int(m.group(2)) < sl.get("want"),
          "more ranks than task slots is refused after start_timeout: %r" % sl)
    check(sl.get("active_jobs") == [] and sl.get("spark_threads") == [],
          "no Spark job or thread left after it: %r" % sl)
    b = cases.get("busy", {})
    check(re.match(r"JobError: timed out after \d+ ms waiting for tasks to register: .*: not all "
                   r"of the job's %d Spark tasks started \(a barrier stage runs them at once\): "
                   r"other jobs may hold" % NUM_PROC, b.get("raised") or "") and
          "hvd-task" not in b["raised"], "a slot held by another job: %r" % b)
    # The stage that could not start is cancelled at once (it was waited for 30 s first).
    check(b.get("seconds", 99) < 5 + 20, "raised %.1f s after the call" % b.get("seconds", 99))
    c = cases.get("cancel", {})
    check(re.match(r"JobError: the job was stopped: the Spark job failed: Job \d+ cancelled",
                   c.get("raised") or "") and "\n" not in c["raised"] and
          "An error occurred while calling" not in c["raised"],
          "a cancelled Spark job in one line: %r" % c)
    i = cases.get("interrupt", {})
    check(i.get("raised") == "KeyboardInterrupt",
          "Ctrl-C while the ranks run raises KeyboardInterrupt once the job is down: %r" % i)
    check([x["rank"] for x in cases.get("after_interrupt", {}).get("values", [])] ==
          list(range(NUM_PROC)), "a job after Ctrl-C: %r" % cases.get("after_interrupt"))


def test_local_cluster():
    app = App(ARGS.spark_home)
    rc, cases, output = app.run("local-cluster[2,2,1024]", ["--train", "spark.authenticate=true",
                                "spark.authenticate.secret=" + uuid.uuid4().hex])
    try:
        check_cases(rc, cases, output)
        t = cases.get("train")
        check(t and len(t["max_diff"]) == 2 + 4 and min(t["accuracy"]) >= 0.95 and max(t["max_diff"]) <= 1e-7,
              "training through spark.run, 1, 2 and 4 ranks: accuracy >= 0.95 and the same "
              "parameters: %r" % t)
    finally:
        app.finish(output, expect_shm=True)


def check_gpus(cases):
    """Each task's Spark GPU (a fake one: the discovery script offers 0 and 1 on each of the
    two workers, one per task) is its rank's, as CUDA_VISIBLE_DEVICES and HVD_GPUS: four ranks,
    each worker's two GPUs used once."""
    vals = cases["values"]["values"]
    for x in vals:
        check(x["gpus"] in ("0", "1") and x["cuda"] == x["gpus"],
              "rank %d: HVD_GPUS %r, CUDA_VISIBLE_DEVICES %r" % (x["rank"], x["gpus"], x["cuda"]))
    check(sorted(x["gpus"] for x in vals) == ["0", "0", "1", "1"],
          "each task's own GPU: %r" % [(x["rank"], x["gpus"]) for x in vals])


def test_standalone():
    app = App(ARGS.spark_home)
    output = ""
    try:
        with sparktest.StandaloneCluster(app.home, app.work, app.env, gpus=["0", "1"]) as cluster:
            rc, cases, output = app.run(cluster.master, cluster.confs())
            check_cases(rc, cases, output)
            check_gpus(cases)
    finally:
        app.finish(output, expect_shm=True)


def main():
    global ARGS
    ARGS = hvdtest.package_test_args(("mpirun", "java"), ("cloudpickle", "pyspark"))
    ARGS.spark_home = sparktest.find_spark_home()
    if not ARGS.spark_home:
        hvdtest.skip("no Spark (scripts/install-spark.sh)")
    return hvdtest.run_cases(hvdtest.cases_in(globals()), ARGS.cases)

if __name__ == "__main__":
    sys.exit(main())
