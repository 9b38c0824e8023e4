#!/usr/bin/env python3
"""hvd_bridge.spark.run on executors without Open MPI (label python, spark): each Spark task
checks that the MPI's daemon (orted) is there before it starts its task service, and fails
with one line naming its host and what to install (docs/python.md, "Install").

spark_no_daemon_app.py runs hvd_bridge.spark.run in Spark's local mode (the driver and one
executor in one JVM, the Python workers under it), with spark.executorEnv.PATH an empty
directory: the Python workers' PATH holds no orted. The driver reaches the system's mpirun
through a directory of its own (a wrapper script), so that the other place mpirun may run
orted from (the driver's mpirun's directory) has none either. Checks: run raises JobError,
within a minute (not after the start timeout), its message one line: "the Spark job failed:
hvd_bridge: the executor on host H (Spark task I) has no orted (mpirun's daemon) on its PATH
nor in DIR: install Open MPI 4.1.x (...) on every executor, or give extra_mpi_args='--prefix
...', or put its bin dir on the executors' PATH (...)". After the application nothing of it is
left running (its processes carry a marker) and nothing is left in its TMPDIR. The same
application on executors that have orted runs its job (the check passes where it should).

Exits 77 (skip) when Java, pyspark, cloudpickle or mpirun is missing, when mpirun is not Open
MPI 4 (the sentence is its), or under a sanitizer build.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "spark"))
import hvdtest  # noqa: E402
import sparktest  # noqa: E402  (find_spark_home, private_spark_home)
from hvdtest import check  # noqa: E402

ARGS = None
NUM_PROC = 2


def run_app(mpirun_dir=None, executor_path=None):
    """Runs spark_no_daemon_app.py (the driver's PATH led by mpirun_dir, the executors' PATH
    executor_path, when given) and returns its no_daemon case; checks that nothing of the
    application is left running and nothing in its TMPDIR."""
    work = tempfile.mkdtemp(prefix="hvd-pyspark-nompi.")
    marker = "pyspark-nompi-" + uuid.uuid4().hex[:12]
    tmp = os.path.join(work, "tmp")
    os.makedirs(tmp)
    try:
        home = sparktest.private_spark_home(ARGS.spark_home, work)
        env = hvdtest.marked_env(None, **{hvdtest.MARKER_VAR: marker})
        env.update(SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1", TMPDIR=tmp,
                   PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   PYTHONPATH=ARGS.pythonpath)
        if mpirun_dir:
            env["PATH"] = mpirun_dir + os.pathsep + env["PATH"]
        confs = ["spark.ui.enabled=false", "spark.log.level=WARN",
                 "spark.local.dir=" + os.path.join(work, "local"),
                 "spark.executorEnv.PYTHONPATH=" + ARGS.pythonpath,
                 "spark.executorEnv.TMPDIR=" + tmp,
                 "spark.executorEnv.OMPI_ALLOW_RUN_AS_ROOT=1",
                 "spark.executorEnv.OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"]
        if executor_path:
            confs.append("spark.executorEnv.PATH=" + executor_path)
        rc, out, err, secs = hvdtest.run(
            [sys.executable, os.path.join(HERE, "spark_no_daemon_app.py"), str(NUM_PROC)] + confs,
            env=env, cwd=work, timeout=300, new_session=True)
        tail = "\n--- output ---\n" + (out + "\n" + err[-6000:])[-6000:]
        check(rc == 0, "the application exited %d%s" % (rc, tail))
        m = re.search(r"^CASE no_daemon (.*)$", out, re.M)
        check(m, "no no_daemon case" + tail)
        case = json.loads(m.group(1))
        case["tail"] = tail
    finally:
        left = hvdtest.leftovers(marker, 30, var=hvdtest.MARKER_VAR)
        files = [f for f in os.listdir(tmp) if not f.startswith(("spark-", "blockmgr-"))] \
            if os.path.isdir(tmp) else []
        shutil.rmtree(work, ignore_errors=True)
    check(not left, "processes of the application left behind:\n  " + "\n  ".join(left))
    check(not files, "files left in the application's TMPDIR: %s" % files)
    return case


def test_no_orted():
    """Executors whose PATH holds no orted: one line, at once."""
    mpirun = shutil.which("mpirun")
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout
    if not re.search(r"\(Open MPI\) 4\.", version):
        raise hvdtest.Skip("mpirun is not Open MPI 4: %r" % version[:80])
    with tempfile.TemporaryDirectory(prefix="hvd-nompi-bin.") as bins:
        # The driver's mpirun, in a directory without orted.
        mpirun_dir = os.path.join(bins, "mpirun-only")
        os.mkdir(mpirun_dir)
        with open(os.path.join(mpirun_dir, "mpirun"), "w") as f:
            f.write('#!/bin/sh\nexec %s "$@"\n' % mpirun)
        os.chmod(os.path.join(mpirun_dir, "mpirun"), 0o755)
        # The executors' PATH: nothing in it (a Python worker needs no program from PATH).
        nompi = os.path.join(bins, "bin-without-mpi")
        os.mkdir(nompi)
        case = run_app(mpirun_dir, nompi)
    check(case.get("raised") and case.get("type") == "JobError",
          "run raised JobError: %r" % case)
    msg = case["message"]
    want = (r"the Spark job failed: hvd_bridge: the executor on host %s \(Spark task [01]\) "
            r"has no orted \(mpirun's daemon\) on its PATH nor in %s: install Open MPI 4\.\S+ "
            r"\(the driver's MPI; Debian: openmpi-bin\) on every executor, or give "
            r"extra_mpi_args='--prefix <its install dir>', or put its bin dir on the "
            r"executors' PATH \(spark.executorEnv.PATH\)$"
            % (re.escape(socket.gethostname()), re.escape(mpirun_dir)))
    check(re.match(want, msg), "one line naming the host, orted and the fix: %r" % msg)
    check(case["seconds"] < 60, "it failed after %.1f s (start timeout 90 s)" % case["seconds"])


def test_with_orted():
    """The same application on executors that have orted: the check lets the job run."""
    case = run_app()
    check(not case.get("raised") and case.get("values") == ["a rank ran"] * NUM_PROC,
          "the job ran: %r%s" % (case, case.get("tail", "")))


def main():
    global ARGS
    ARGS = hvdtest.package_test_args(("mpirun", "java"), ("cloudpickle", "pyspark"))
    ARGS.spark_home = sparktest.find_spark_home()
    if not ARGS.spark_home:
        hvdtest.skip("no Spark (scripts/install-spark.sh)")
    return hvdtest.run_cases(hvdtest.cases_in(globals()), ARGS.cases)


if __name__ == "__main__":
    sys.exit(main())
