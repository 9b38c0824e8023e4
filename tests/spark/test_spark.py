#!/usr/bin/env python3
"""The Spark integration end to end (label spark): examples/spark's application
(HvdSparkExample, over org.hvdbridge.spark.HorovodSpark in hvd-bridge.jar) on real Spark
clusters on loopback, submitted with the pyspark package's spark-submit, with hvd-bridge.jar as
the only --jars.

  local_cluster    local-cluster mode (a master, 2 workers and 2 executor JVMs):
    1. 4 ranks over 2 executors: results in rank order, each rank a descendant of an executor
       JVM (CoarseGrainedExecutorBackend) whose embedded task service ran orted, 2 ranks in
       each executor;
    2. a failing entry point: the Spark job fails with the rank's error text;
  standalone_gpus  a standalone master and 2 workers started with spark-class, each worker
                   offering two fake GPUs ("0", "1") through Spark's resource discovery, one per
                   task (spark.task.resource.gpu.amount=1):
    3. the shared-object probe: each rank's ctx->gpus is its Spark task's GPU (one each, the
       two ranks of an executor on different ones);
    4. a command: each rank has its task's GPU as HVD_GPUS and CUDA_VISIBLE_DEVICES, and its
       result text is empty (a command returns no result bytes);
and after each application, no process of it is left (its processes carry a marker in their
environment, looked for in /proc).

  test_spark.py --bin DIR --jar hvd-bridge.jar --jvm-probe libjvm_probe.so
                [--example-jar J] --example-src DIR [CASE ...]

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
import uuid
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, HERE)
import hvdtest  # noqa: E402
import sparktest  # noqa: E402
from hvdtest import Failure, skip  # noqa: E402

ARGS = None
LOCAL_CLUSTER = "local-cluster[2,2,1024]"


def fail(why, output=None):
    if output:
        why += "\n---- output ----\n" + output[-20000:] + "\n----------------"
    raise Failure(why)


def await_no_marked(marker, seconds, output):
    """Fails unless every process carrying the marker is gone within seconds (those left are
    killed)."""
    left = hvdtest.leftovers(marker, seconds, var=hvdtest.MARKER_VAR)
    if left:
        fail("processes of the application outlived it:\n  " + "\n  ".join(left), output)


def build_example(work):
    """The example's jar: the one CMake built, else compiled here against Spark's jars and
    hvd-bridge.jar."""
    if ARGS.example_jar and os.path.isfile(ARGS.example_jar):
        return ARGS.example_jar
    classes = os.path.join(work, "example-classes")
    os.makedirs(classes)
    sources = sorted(glob.glob(os.path.join(ARGS.example_src, "java", "org", "hvdbridge", "spark",
                                            "*.java")))
    cp = os.path.join(ARGS.spark_home, "jars", "*") + ":" + ARGS.jar
    r = subprocess.run([ARGS.javac, "--release", "8", "-Xlint:all,-options,-path", "-cp", cp,
                        "-d", classes] + sources, capture_output=True, text=True)
    if r.returncode != 0:
        fail("javac of the Spark example failed", r.stdout + r.stderr)
    jar = os.path.join(work, "hvd-bridge-spark-example.jar")
    subprocess.run([ARGS.jar_tool, "cf", jar, "-C", classes, "."], check=True)
    return jar


def spark_submit(home, work, marker, app_args, timeout, master=LOCAL_CLUSTER, confs=None):
    """spark-submit of the example with hvd-bridge.jar in --jars; confs ("name=value"; default:
    Spark authentication with a fresh secret) on top of the test's. The driver, and through
    spark.executorEnv the executors and everything they start, carry the marker. Returns
    (status, output, seconds)."""
    env = dict(os.environ)
    env.update({
        "SPARK_HOME": home,
        "SPARK_LOCAL_IP": "127.0.0.1",           # the whole cluster on loopback
        "HVD_BIN_DIR": ARGS.bin,
        hvdtest.MARKER_VAR: marker,              # inherited by everything the job starts
    })
    if ARGS.java_home:
        env["JAVA_HOME"] = ARGS.java_home
    if confs is None:
        confs = ["spark.authenticate=true", "spark.authenticate.secret=" + uuid.uuid4().hex]
    confs = ["spark.ui.enabled=false",
             "spark.log.level=WARN",
             "spark.local.dir=" + os.path.join(work, "local"),
             "spark.executorEnv.HVD_BIN_DIR=" + ARGS.bin,
             "spark.executorEnv.%s=%s" % (hvdtest.MARKER_VAR, marker),
             "spark.executor.extraLibraryPath=" + os.path.dirname(ARGS.jar),
             "spark.network.crypto.enabled=true"] + list(confs)
    cmd = [os.path.join(home, "bin", "spark-submit"), "--master", master]
    for c in confs:
        cmd += ["--conf", c]
    cmd += ["--jars", ARGS.jar, "--class", "org.hvdbridge.spark.HvdSparkExample",
            ARGS.example] + app_args
    try:
        rc, out, _, took = hvdtest.run(cmd, env, timeout, work, merge=True, new_session=True)
    except subprocess.TimeoutExpired as e:
        hvdtest.kill(hvdtest.processes_with(marker, hvdtest.MARKER_VAR))  # do not leave the cluster behind
        fail("spark-submit ran past %d s" % timeout, (e.stdout or b"").decode(errors="replace"))
    return rc, out, took


def common_args():
    return ["--np", "4", "--executors", "2", "--host-hash-per-executor", "--start-timeout", "60",
            "--timeout", "60"]


def probe_entry():
    return ["--entry", "%s:jvm_probe" % ARGS.jvm_probe]


def probe_results(out, marker):
    """The probe's RESULT lines: 4 ranks in rank order, each a descendant of an executor JVM
    with the executor's environment, 2 ranks in each of 2 executor JVMs. Returns
    ({jvm: [rank]}, [(rank, task, fields)])."""
    ranks = re.findall(r"^RESULT rank=(\d+) task=(\d+) host=(\S+) status=(\d+) text=(.*)$", out, re.M)
    if [int(r[0]) for r in ranks] != [0, 1, 2, 3]:
        fail("want the results of ranks 0..3 in rank order, got %s" % [r[0] for r in ranks], out)
    jvms, found = {}, []
    for rank, task, host, status, text in ranks:
        f = hvdtest.parse_kv(text)
        if f["rank"] != rank or f["size"] != "4" or f["task"] != task or status != "0":
            fail("rank %s reported %r" % (rank, text), out)
        if f["executor"] != "1" or f["jvm"] == "-1":
            fail("rank %s does not descend from an executor JVM: %r" % (rank, text), out)
        if f["marker"] != marker:
            fail("rank %s lacks the environment of its executor: %r" % (rank, text), out)
        jvms.setdefault(f["jvm"], []).append(int(rank))
        found.append((int(rank), task, f))
    if ranks[0][1] != "0":
        fail("rank 0 must run for task 0, not task %s" % ranks[0][1], out)
    if len(jvms) != 2 or sorted(len(v) for v in jvms.values()) != [2, 2]:
        fail("want 2 ranks in each of 2 executor JVMs, got %s" % jvms, out)
    return jvms, found


def test_local_cluster():
    """4 ranks over 2 executors; a failing rank fails the Spark job with its text; more ranks
    than task slots are refused after the start timeout."""
    work = tempfile.mkdtemp(prefix="hvd-spark-test-")
    try:
        home = sparktest.private_spark_home(ARGS.spark_home, work)
        common = common_args() + probe_entry()

        # 1. 4 ranks over 2 executors.
        marker = "spark-ok-" + uuid.uuid4().hex
        rc, out, took = spark_submit(home, work, marker, common, 100)
        print("run 1 (4 ranks): exit %d in %.1f s" % (rc, took))
        if rc != 0:
            fail("the job failed (exit %d)" % rc, out)
        jvms, _ = probe_results(out, marker)
        print("  ranks per executor JVM: %s" % jvms)
        await_no_marked(marker, 15, out)

        # 2. A failing rank fails the Spark job with its text.
        marker = "spark-fail-" + uuid.uuid4().hex
        rc, out, took = spark_submit(home, work, marker, common + ["--entry-arg", "fail=2"], 100)
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

        # 3. More ranks than task slots (2 executors x 2 cores): refused once the start
        # timeout has passed, saying so, with no barrier stage submitted (one waiting for slots
        # cannot be cancelled: the job failed 150 s late, asking about hvd-task's --driver).
        marker = "spark-slots-" + uuid.uuid4().hex
        args = [a if a != "4" else "6" for a in common_args()]
        args[args.index("--start-timeout") + 1] = "5"
        rc, out, took = spark_submit(home, work, marker, args + probe_entry(), 100)
        print("run 3 (6 ranks, 4 slots): exit %d in %.1f s" % (rc, took))
        if rc != 1 or not re.search(r"^hvd-bridge-spark: hvd-bridge job did not run: timed out after 5000 ms waiting for 6 "
                                    r"Spark task slots: the application has 4 ", out, re.M):
            fail("more ranks than task slots is not refused after the start timeout", out)
        if "hvd-task" in out or took > 60:
            fail("the refusal took %.0f s or asked about hvd-task" % took, out)
        await_no_marked(marker, 15, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_one_gpu_each(gpus, what, out):
    """gpus: {rank: GPU ids}; every rank has one of its worker's two, each used by two ranks."""
    if any(g not in ("0", "1") for g in gpus.values()) or sorted(gpus.values()) != ["0", "0", "1", "1"]:
        fail("want each rank on one GPU of its Spark task (0 or 1, each twice), got %s %s"
             % (what, gpus), out)


def test_standalone_gpus():
    work = tempfile.mkdtemp(prefix="hvd-spark-test-")
    cluster_marker = "spark-cluster-" + uuid.uuid4().hex
    output = ""
    try:
        home = sparktest.private_spark_home(ARGS.spark_home, work)
        env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1",
                   **{hvdtest.MARKER_VAR: cluster_marker})
        if ARGS.java_home:
            env["JAVA_HOME"] = ARGS.java_home
        with sparktest.StandaloneCluster(home, work, env, gpus=["0", "1"]) as cluster:
            # 3. The shared-object probe: ctx->gpus.
            marker = "spark-gpus-" + uuid.uuid4().hex
            rc, out, took = spark_submit(home, work, marker, common_args() + probe_entry(), 150,
                                         master=cluster.master, confs=cluster.confs())
            output = out
            print("run 3 (4 ranks, a GPU each, shared object): exit %d in %.1f s" % (rc, took))
            if rc != 0:
                fail("the job failed (exit %d)" % rc, out)
            jvms, found = probe_results(out, marker)
            gpus = {rank: f["gpus"] for rank, _, f in found}
            check_one_gpu_each(gpus, "ctx->gpus", out)
            for jvm, ranks in jvms.items():  # an executor's two tasks hold its two GPUs
                if sorted(gpus[r] for r in ranks) != ["0", "1"]:
                    fail("the ranks %s of executor JVM %s share a GPU: %s" % (ranks, jvm, gpus), out)
            print("  GPUs: %s, ranks per executor JVM: %s" % (gpus, jvms))
            await_no_marked(marker, 30, out)

            # 4. A command: HVD_GPUS and CUDA_VISIBLE_DEVICES; no result bytes.
            marker = "spark-gpus-cmd-" + uuid.uuid4().hex
            cmd = ["--", "sh", "-c",
                   'echo "GPUS rank=$HOROVOD_RANK hvd_gpus=$HVD_GPUS cuda=$CUDA_VISIBLE_DEVICES"']
            rc, out, took = spark_submit(home, work, marker, common_args() + cmd, 150,
                                         master=cluster.master, confs=cluster.confs())
            output = out
            print("run 4 (4 ranks, a GPU each, command): exit %d in %.1f s" % (rc, took))
            if rc != 0:
                fail("the job failed (exit %d)" % rc, out)
            results = re.findall(r"^RESULT rank=(\d+) task=\d+ host=\S+ status=(\d+) text=(.*)$", out, re.M)
            if [(int(r), s, t) for r, s, t in results] != [(i, "0", "") for i in range(4)]:
                fail("want ranks 0..3 with status 0 and an empty text (a command's result), got %s"
                     % results, out)
            seen = re.findall(r"GPUS rank=(\d+) hvd_gpus=(\S*) cuda=(\S*)$", out, re.M)
            env_gpus = {int(r): g for r, g, _ in seen}
            if sorted(env_gpus) != [0, 1, 2, 3] or any(g != c for _, g, c in seen):
                fail("want one line per rank with HVD_GPUS = CUDA_VISIBLE_DEVICES, got %s" % seen, out)
            check_one_gpu_each(env_gpus, "HVD_GPUS", out)
            print("  HVD_GPUS: %s" % env_gpus)
            await_no_marked(marker, 30, out)
        left = hvdtest.leftovers(cluster_marker, 15, var=hvdtest.MARKER_VAR)
        if left:
            fail("processes of the standalone cluster outlived it:\n  " + "\n  ".join(left), output)
    finally:
        hvdtest.kill(hvdtest.processes_with(cluster_marker, hvdtest.MARKER_VAR))
        shutil.rmtree(work, ignore_errors=True)


def has_spark_classes(jar):
    with zipfile.ZipFile(jar) as z:
        return "org/hvdbridge/spark/HorovodSpark.class" in z.namelist()


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the hvd binaries (hvd-rsh, hvd-exec)")
    ap.add_argument("--jar", default="", help="hvd-bridge.jar ('' when the JNI layer was not built)")
    ap.add_argument("--jvm-probe", required=True, help="libjvm_probe.so")
    ap.add_argument("--example-jar", default="")
    ap.add_argument("--example-src", required=True)
    ap.add_argument("--java-home", default="")
    ap.add_argument("--sanitize", default="")
    ap.add_argument("cases", nargs="*", help="local_cluster, standalone_gpus (default: both)")
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
    args.spark_home = sparktest.find_spark_home()
    if not args.spark_home:
        skip("pyspark is not installed (run scripts/install-spark.sh) and SPARK_HOME is not set")
    print("Spark from %s" % args.spark_home)
    ARGS = args

    work = tempfile.mkdtemp(prefix="hvd-spark-example-")
    try:
        try:
            args.example = build_example(work)
        except Failure as e:
            print("FAIL: %s" % e)
            return 1
        return hvdtest.run_cases(hvdtest.cases_in(globals()), args.cases)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
