#!/usr/bin/env python3
"""hvd_bridge.spark.run_elastic on a real Spark cluster (label python, spark, elastic):
spark_elastic_app.py trains an MLP with hvd_bridge.torch.elastic on Spark's local-cluster mode
(2 executors of 2 cores: 4 task services); once its ranks have committed twice, this test
SIGKILLs one executor JVM (with its PySpark workers and the task services in them). The job
is reset over the other executor's tasks, goes on from the last commit, and ends with the
model of an undisturbed run; nothing of the application is left running. The job runs with
warm=True: while it trains, each task service has a warm interpreter and the ranks are
forked from them.

Exits 77 (skip) when Java, pyspark, torch, scikit-learn or mpirun is missing, or under a
sanitizer build.
"""
import os
import re
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "spark"))
sys.path.insert(0, HERE)
import hvdtest  # noqa: E402
import sparktest  # noqa: E402  (find_spark_home)
import test_spark_python  # noqa: E402  (App)
from hvdtest import Failure, check  # noqa: E402

ARGS = None


def executors(marker):
    return sorted(pid for pid, p in hvdtest.processes_with(marker, hvdtest.MARKER_VAR).items()
                  if "CoarseGrainedExecutorBackend" in p.cmdline)


def warm_processes(marker):
    return sorted(pid for pid, p in hvdtest.processes_with(marker, hvdtest.MARKER_VAR).items()
                  if "hvd_bridge._warm" in p.cmdline)


def commits(log):
    try:
        with open(log) as f:
            return sum(1 for l in f if " commit " in l)
    except OSError:
        return 0


def test_executor_killed():
    app = test_spark_python.App(ARGS.spark_home)
    log = os.path.join(app.work, "train.log")
    cmd = [sys.executable, os.path.join(HERE, "spark_elastic_app.py"), "local-cluster[2,2,1024]",
           log] + app.confs()
    out_path = os.path.join(app.work, "app.out")
    output = ""
    with open(out_path, "w+") as out:
        proc = subprocess.Popen(cmd, env=app.env, cwd=app.work, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            hvdtest.wait_for(lambda: commits(log) >= 2 or proc.poll() is not None, 600,
                             "two commits of the elastic job")
            if proc.poll() is not None:
                out.seek(0)
                raise Failure("the application ended before the kill (%d):\n%s" % (
                    proc.returncode, out.read()[-6000:]))
            execs = executors(app.marker)
            check(len(execs) == 2, "two executors while it trains: %s" % execs)
            warm = warm_processes(app.marker)
            forked = [p for p in warm if hvdtest.parent_of(p) in warm]
            check(len(warm) - len(forked) == 4 and len(forked) == 4,
                  "4 warm interpreters and 4 ranks forked from them: %s" % warm)
            os.kill(execs[-1], signal.SIGKILL)
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            out.seek(0)
            output = out.read()
    try:
        check(proc.returncode == 0, "the application exited %d:\n%s" % (proc.returncode,
                                                                       output[-6000:]))
        m = re.search(r"^CASE elastic (.*)$", output, re.M)
        check(m, "no result:\n%s" % output[-6000:])
        import json
        case = json.loads(m.group(1))
        check(any(re.match(r"hvd_bridge: reset 1: task \d+ of host \S+ went away", l)
                  for l in case["resets"]),
              "a reset for the lost executor's tasks: %s" % case["resets"])
        check(case["diff"] <= 1e-5, "the model differs from an undisturbed run's by %g" %
              case["diff"])
    finally:
        app.finish(output)


def main():
    global ARGS
    ARGS = hvdtest.package_test_args(("mpirun", "java"), ("cloudpickle", "pyspark", "torch",
                                                          "sklearn"))
    ARGS.spark_home = sparktest.find_spark_home()
    if not ARGS.spark_home:
        hvdtest.skip("no Spark (scripts/install-spark.sh)")
    test_spark_python.ARGS = ARGS
    return hvdtest.run_cases(hvdtest.cases_in(globals()), ARGS.cases)


if __name__ == "__main__":
    sys.exit(main())
