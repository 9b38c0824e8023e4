#!/usr/bin/env python3
"""The Spark integration end to end (label spark): examples/spark's application (over
org.hvdbridge.spark.HorovodSpark in hvd-bridge.jar) on a real Spark cluster on loopback
(local-cluster mode: a master, 2 workers and 2 executor JVMs), started from the pyspark
package's spark-submit with hvd-bridge.jar as the only --jars.

  1. 4 ranks over 2 executors: results in rank order, each rank a descendant of an executor
     JVM (CoarseGrainedExecutorBackend) whose embedded task service ran orted, 2 ranks in
     each executor;
  2. a failing entry point: the Spark job fails with the rank's error text;
and after each application, no process of it is left (its processes carry a marker in their
environment, looked for in /proc).

Exits 77 (skip) with the reason when Java, the JNI layer (or its Spark classes), pyspark or
mpirun is missing.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, HERE)
import hvdtest  # noqa: E402
import sparktest  # noqa: E402
from hvdtest import skip  # noqa: E402


def fail(why, output=None):
    if output:
        print("---- output ----\n" + output[-20000:] + "\n----------------")
    print("FAIL: " + why)
    sys.exit(1)


def await_no_marked(marker, seconds, output):
    """Fails unless every process carrying the application's marker is gone within seconds
    (those left are killed)."""
    left = hvdtest.leftovers(marker, seconds, var=hvdtest.MARKER_VAR)
    if left:
        fail("processes of the application outlived it:\n  " + "\n  ".join(left), output)


def build_example(args, spark_home, work):
    """The example's jar: the one CMake built, else compiled here against Spark's jars and
    hvd-bridge.jar."""
    if args.example_jar and os.path.isfile(args.example_jar):
        return args.example_jar
    classes = os.path.join(work, "example-classes")
    os.makedirs(classes)
    sources = sorted(glob.glob(os.path.join(args.example_src, "java", "org", "hvdbridge", "spark",
                                            "*.java")))
    cp = os.path.join(spark_home, "jars", "*") + ":" + args.jar
    r = subprocess.run([args.javac, "--release", "8", "-Xlint:all,-options,-path", "-cp", cp,
                        "-d", classes] + sources, capture_output=True, text=True)
    if r.returncode != 0:
        fail("javac of the Spark example failed", r.stdout + r.stderr)
    jar = os.path.join(work, "hvd-bridge-spark-example.jar")
    subprocess.run([args.jar_tool, "cf", jar, "-C", classes, "."], check=True)
    return jar


def spark_submit(args, spark_home, example_jar, work, marker, app_args, timeout):
    env = dict(os.environ)
    env.update({
        "SPARK_HOME": spark_home,
        "SPARK_LOCAL_IP": "127.0.0.1",           # the whole cluster on loopback
        "HVD_BIN_DIR": args.bin,
        hvdtest.MARKER_VAR: marker,              # inherited by everything the job starts
    })
    if args.java_home:
        env["JAVA_HOME"] = args.java_home
    lib_dir = os.path.dirname(args.jar)
    cmd = [os.path.join(spark_home, "bin", "spark-submit"),
           "--master", "local-cluster[2,2,1024]",
           "--conf", "spark.ui.enabled=false",
           "--conf", "spark.log.level=WARN",
           "--conf", "spark.local.dir=" + os.path.join(work, "local"),
           "--conf", "spark.executorEnv.HVD_BIN_DIR=" + args.bin,
           "--conf", "spark.executor.extraLibraryPath=" + lib_dir,
           "--conf", "spark.authenticate=true",
           "--conf", "spark.authenticate.secret=" + uuid.uuid4().hex,
           "--conf", "spark.network.crypto.enabled=true",
           "--jars", args.jar,
           "--class", "org.hvdbridge.spark.HvdSparkExample",
           example_jar] + app_args
    try:
        rc, out, _, took = hvdtest.run(cmd, env, timeout, work, merge=True, new_session=True)
    except subprocess.TimeoutExpired as e:
        hvdtest.kill(hvdtest.processes_with(marker, hvdtest.MARKER_VAR))  # do not leave the cluster behind
        fail("spark-submit ran past %d s" % timeout, (e.stdout or b"").decode(errors="replace"))
    return rc, out, took


def has_spark_classes(jar):
    with zipfile.ZipFile(jar) as z:
        return "org/hvdbridge/spark/HorovodSpark.class" in z.namelist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the hvd binaries (hvd-rsh, hvd-exec)")
    ap.add_argument("--jar", default="", help="hvd-bridge.jar ('' when the JNI layer was not built)")
    ap.add_argument("--jvm-probe", required=True, help="libjvm_probe.so")
    ap.add_argument("--example-jar", default="")
    ap.add_argument("--example-src", required=True)
    ap.add_argument("--java-home", default="")
    ap.add_argument("--sanitize", default="")
    args = ap.parse_args()

    for a in ("bin", "jar", "jvm_probe", "example_jar", "example_src"):  # spark-submit runs elsewhere
        if getattr(args, a):
            setattr(args, a, os.path.abspath(getattr(args, a)))
    if args.sanitize:
        skip("a JVM cannot host the %s build of libhvd_jni.so" % args.sanitize)
    args.javac = shutil.which("javac", path=os.path.join(args.java_home, "bin")) if args.java_home else None
    args.javac = args.javac or shutil.which("javac")
    args.jar_tool = shutil.which("jar", path=os.path.dirname(args.javac)) if args.javac else None
    if not args.javac or not args.jar_tool or not shutil.which("java"):
        skip("no JDK (java, javac, jar) on this machine")
    if not args.jar or not os.path.isfile(args.jar):
        skip("hvd-bridge.jar was not built (no JDK or JNI headers when CMake ran)")
    if not has_spark_classes(args.jar):
        skip("hvd-bridge.jar has no org.hvdbridge.spark (Spark's jars were not found when CMake ran)")
    if not shutil.which("mpirun"):
        skip("mpirun (Open MPI) is not installed")
    spark_home = sparktest.find_spark_home()
    if not spark_home:
        skip("pyspark is not installed (run scripts/install-spark.sh) and SPARK_HOME is not set")
    print("Spark from %s" % spark_home)

    work = tempfile.mkdtemp(prefix="hvd-spark-test-")
    t_start = time.time()
    try:
        example_jar = build_example(args, spark_home, work)
        spark_home = sparktest.private_spark_home(spark_home, work)
        probe = "%s:jvm_probe" % args.jvm_probe
        common = ["--np", "4", "--executors", "2", "--host-hash-per-executor", "--start-timeout", "60",
                  "--timeout", "60", "--entry", probe]

        # 1. 4 ranks over 2 executors.
        marker = "spark-ok-" + uuid.uuid4().hex
        rc, out, took = spark_submit(args, spark_home, example_jar, work, marker, common, 100)
        print("run 1 (4 ranks): exit %d in %.1f s" % (rc, took))
        if rc != 0:
            fail("the job failed (exit %d)" % rc, out)
        ranks = re.findall(r"^RESULT rank=(\d+) task=(\d+) host=(\S+) status=(\d+) text=(.*)$", out, re.M)
        if [int(r[0]) for r in ranks] != [0, 1, 2, 3]:
            fail("want the results of ranks 0..3 in rank order, got %s" % [r[0] for r in ranks], out)
        jvms = {}
        for rank, task, host, status, text in ranks:
            f = hvdtest.parse_kv(text)
            if f["rank"] != rank or f["size"] != "4" or f["task"] != task or status != "0":
                fail("rank %s reported %r" % (rank, text), out)
            if f["executor"] != "1" or f["jvm"] == "-1":
                fail("rank %s does not descend from an executor JVM: %r" % (rank, text), out)
            if f["marker"] != marker:
                fail("rank %s lacks the environment of its executor: %r" % (rank, text), out)
            jvms.setdefault(f["jvm"], []).append(int(rank))
        if ranks[0][1] != "0":
            fail("rank 0 must run for task 0, not task %s" % ranks[0][1], out)
        if len(jvms) != 2 or sorted(len(v) for v in jvms.values()) != [2, 2]:
            fail("want 2 ranks in each of 2 executor JVMs, got %s" % jvms, out)
        print("  ranks per executor JVM: %s" % jvms)
        await_no_marked(marker, 15, out)

        # 2. A failing rank fails the Spark job with its text.
        marker = "spark-fail-" + uuid.uuid4().hex
        rc, out, took = spark_submit(args, spark_home, example_jar, work, marker,
                                     common + ["--entry-arg", "fail=2"], 100)
        print("run 2 (rank 2 fails): exit %d in %.1f s" % (rc, took))
        text = "rank 2 failed on purpose (jvm_probe 'fail=2')"
        if rc != 1:
            fail("want exit status 1 for a failed rank, got %d" % rc, out)
        if not re.search(r"^hvd-bridge-spark: job failed: rank 2 \(task \d+ on \S+\) exited with status 3: "
                         + re.escape(text), out, re.M):
            fail("the job's failure does not name rank 2 and its text", out)
        spark_said = out[out.find("hvd-bridge-spark: Spark said:"):]
        if "hvd-bridge-spark: Spark said:" not in out or text not in spark_said:
            fail("the Spark job did not fail with the rank's text", out)
        if "Could not recover from a failed barrier ResultStage" not in spark_said:
            fail("the Spark job did not fail as a barrier stage", out)
        await_no_marked(marker, 15, out)
        print("PASS spark (%.1f s)" % (time.time() - t_start))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
