#!/usr/bin/env python3
"""Starts a Spark application of bench/compare on a real local Spark cluster (spark-submit
--master local-cluster[2,4,1024]: a master, 2 workers, 2 executor JVMs of 4 cores, all on
loopback) with the virtual environment's python on the driver and the executors, and checks
that nothing of it is left afterwards. Used by compare.py (measures "spark" and "pyspark").

  spark_cluster.py --bin BIN --python VENV_PY --jar hvd-bridge.jar --tasks 2,4,8 --runs 5 --out F
      spark_app.py: Horovod against hvd-bridge's JVM path (HorovodSpark.run through py4j);
      hvd-bridge.jar (the only --jars) must have org.hvdbridge.spark.HorovodSpark: CMake puts
      it in when it finds Spark's jars.
  spark_cluster.py --app python --mode time|rss --pythonpath BUILD/python --python VENV_PY
                   --tasks 2,4,8 --runs 5 [--warmups 1] --out F
      pyspark_app.py: the same Python function through horovod.spark.run and
      hvd_bridge.spark.run (the package from --pythonpath, on the driver and the executors);
      mode rss runs with spark.python.worker.reuse=false and samples memory (proc_sampler.py)
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
sys.path.insert(0, os.path.join(REPO, "tests", "spark"))
import hvdtest  # noqa: E402
import sparktest  # noqa: E402  (find_spark_home, private_spark_home)

TRIVIAL_ENTRY_C = r'''
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "hvd/entry.h"
/* The trivial entry point: returns the wall clock at entry, as text. */
int trivial_entry(const hvd_entry_ctx *ctx, hvd_entry_result *out) {
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    out->data = malloc(32);
    if (!out->data) return 1;
    out->len = (size_t)snprintf((char *)out->data, 32, "%.6f", ts.tv_sec + ts.tv_nsec / 1e9);
    return 0;
}
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--app", choices=("jvm", "python"), default="jvm")
    ap.add_argument("--mode", choices=("time", "rss"), default="time", help="--app python only")
    ap.add_argument("--bin", default="")
    ap.add_argument("--python", required=True)
    ap.add_argument("--pythonpath", default="", help="where hvd_bridge is (--app python)")
    ap.add_argument("--jar", default="")
    ap.add_argument("--tasks", default="2,4,8")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmups", type=int, default=1, help="--app python: untimed calls of each first")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=int, default=900)
    a = ap.parse_args()

    spark_home = sparktest.find_spark_home()
    if not spark_home:
        print("spark_cluster: no Spark (install pyspark: scripts/install-spark.sh)", file=sys.stderr)
        return 2
    if a.app == "jvm":
        if not os.path.isfile(a.jar or "/nonexistent"):
            print("spark_cluster: %s is missing (build with the JNI layer: Java 17 and CMake)" % a.jar,
                  file=sys.stderr)
            return 2
        with zipfile.ZipFile(a.jar) as z:
            if "org/hvdbridge/spark/HorovodSpark.class" not in z.namelist():
                print("spark_cluster: %s has no org.hvdbridge.spark.HorovodSpark (Spark's jars were not "
                      "found when CMake ran: run scripts/install-spark.sh, then cmake again)" % a.jar,
                      file=sys.stderr)
                return 2
    elif not os.path.isdir(os.path.join(a.pythonpath, "hvd_bridge")):
        print("spark_cluster: no hvd_bridge package in --pythonpath %r (build it: cmake --build build)"
              % a.pythonpath, file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="hvd-compare-spark.")
    home = sparktest.private_spark_home(spark_home, work)
    marker = "compare-" + uuid.uuid4().hex[:12]
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=a.python,
               PYSPARK_DRIVER_PYTHON=a.python, **{hvdtest.MARKER_VAR: marker})
    env.pop("PYTHONPATH", None)
    cmd = [os.path.join(home, "bin", "spark-submit"),
           "--master", "local-cluster[2,4,1024]",
           "--conf", "spark.ui.enabled=false",
           "--conf", "spark.log.level=WARN",
           "--conf", "spark.local.dir=" + os.path.join(work, "local")]
    if a.app == "jvm":
        so = os.path.join(work, "libtrivial_entry.so")
        src = os.path.join(work, "trivial_entry.c")
        with open(src, "w") as f:
            f.write(TRIVIAL_ENTRY_C)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-I", os.path.join(REPO, "include"), "-o", so, src],
                       check=True)
        env["HVD_BIN_DIR"] = os.path.abspath(a.bin)
        cmd += ["--conf", "spark.executorEnv.HVD_BIN_DIR=" + os.path.abspath(a.bin),
                "--conf", "spark.executor.extraLibraryPath=" + os.path.dirname(os.path.abspath(a.jar)),
                "--jars", os.path.abspath(a.jar),
                os.path.join(HERE, "spark_app.py"), os.path.abspath(a.out), os.path.abspath(a.bin), so,
                a.tasks, str(a.runs)]
    else:
        pp = os.path.abspath(a.pythonpath)
        env["PYTHONPATH"] = pp
        cmd += ["--conf", "spark.executorEnv.PYTHONPATH=" + pp]
        for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
            if k in os.environ:
                cmd += ["--conf", "spark.executorEnv.%s=%s" % (k, os.environ[k])]
        if a.mode == "rss":
            cmd += ["--conf", "spark.python.worker.reuse=false"]
        cmd += [os.path.join(HERE, "pyspark_app.py"), os.path.abspath(a.out), a.mode, a.tasks, str(a.runs),
                str(a.warmups)]
        if a.mode == "rss":
            cmd.append(os.path.join(HERE, "proc_sampler.py"))
    t0 = time.time()
    rc = 1
    try:
        rc = subprocess.run(cmd, env=env, cwd=work, stdin=subprocess.DEVNULL, timeout=a.timeout,
                            start_new_session=True).returncode
    except subprocess.TimeoutExpired:
        print("spark_cluster: spark-submit ran past %d s" % a.timeout, file=sys.stderr)
    finally:
        left = hvdtest.leftovers(marker, 20, var=hvdtest.MARKER_VAR)
        for p in left:
            print("spark_cluster: left running after the application: %s (killed)" % p, file=sys.stderr)
        subprocess.run(["rm", "-rf", work])
    print("spark_cluster: spark-submit exited %d after %.0f s" % (rc, time.time() - t0), file=sys.stderr)
    return 0 if rc == 0 and not left else 1


if __name__ == "__main__":
    sys.exit(main())
