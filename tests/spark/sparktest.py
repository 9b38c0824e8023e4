"""sparktest: what the Spark tests (tests/spark, tests/python) and bench/compare share to run
Spark on this machine, from the pyspark package (scripts/install-spark.sh) or $SPARK_HOME.

    sys.path.insert(0, os.path.join(<repo>, "tests", "spark"))
    import sparktest  # noqa: E402

  find_spark_home()     SPARK_HOME if it looks like Spark, else the pyspark package's directory
  private_spark_home()  a SPARK_HOME of links, so that a cluster's work dirs stay out of it
  StandaloneCluster     a standalone master and workers started with spark-class, Spark
                        authentication on, optionally (fake) GPUs on each worker through
                        Spark's resource discovery

Python 3 standard library only, plus tests/lib/hvdtest.py.
"""
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import hvdtest  # noqa: E402


def find_spark_home():
    """SPARK_HOME if it looks like Spark, else the installed pyspark package (pip)."""
    def ok(d):
        return d and os.path.isfile(os.path.join(d, "bin", "spark-submit")) and \
            glob.glob(os.path.join(d, "jars", "spark-core_*.jar"))
    if ok(os.environ.get("SPARK_HOME")):
        return os.environ["SPARK_HOME"]
    spec = importlib.util.find_spec("pyspark")
    if spec and spec.origin and ok(os.path.dirname(spec.origin)):
        return os.path.dirname(spec.origin)
    for py in ("python3", "python"):  # pip may have installed it for another interpreter
        exe = shutil.which(py)
        if not exe or os.path.realpath(exe) == os.path.realpath(sys.executable):
            continue
        r = subprocess.run([exe, "-c", "import importlib.util, os; "
                            "print(os.path.dirname(importlib.util.find_spec('pyspark').origin))"],
                           capture_output=True, text=True)
        if r.returncode == 0 and ok(r.stdout.strip()):
            return r.stdout.strip()
    return None


def private_spark_home(spark_home, work):
    """A SPARK_HOME of links into the installed one: local-cluster workers keep their
    application directories in $SPARK_HOME/work, which must not grow in the package."""
    home = os.path.join(work, "spark-home")
    os.makedirs(home)
    for d in ("bin", "sbin", "jars", "conf"):
        if os.path.isdir(os.path.join(spark_home, d)):
            os.symlink(os.path.join(spark_home, d), os.path.join(home, d))
    return home


class StandaloneCluster:
    """A standalone Spark cluster on loopback, started with spark-class: a master and `workers`
    workers of `cores` cores and 1 GiB each, with Spark authentication on (a fresh secret,
    given to the master and the workers; confs() gives it to the application). With gpus (a
    list of ids), every worker offers those (fake) GPUs through Spark's resource discovery (a
    script that prints them), and confs() asks for all of a worker's GPUs per executor and one
    per task, so that each task gets a GPU of its own.

        with StandaloneCluster(home, work, env, gpus=["0", "1"]) as c:
            spark-submit --master c.master --conf c.confs()[0] ...

    home: a SPARK_HOME (private_spark_home()); work: the directory for the daemons' logs
    (master.log, workerI.log), the workers' application directories (worker/) and the
    discovery script; env: the daemons' environment (the executors inherit it; a marker in it
    finds them in /proc). start() (or entering the with) raises hvdtest.Failure when the master
    does not listen within 60 s; stop() (or leaving the with) ends the daemons, whose executors
    end with them."""

    def __init__(self, home, work, env, workers=2, cores=2, gpus=None):
        self.home, self.work, self.workers, self.cores = home, work, workers, cores
        self.gpus = list(gpus or [])
        self.secret = uuid.uuid4().hex
        self.daemons = []
        self.master = None
        opts = "-Dspark.authenticate=true -Dspark.authenticate.secret=%s" % self.secret
        if self.gpus:
            self.gpu_script = os.path.join(work, "gpus.sh")  # Spark's resource discovery
            with open(self.gpu_script, "w") as f:
                f.write("#!/bin/sh\necho '{\"name\": \"gpu\", \"addresses\": [%s]}'\n"
                        % ", ".join('"%s"' % g for g in self.gpus))
            os.chmod(self.gpu_script, 0o755)
            opts += (" -Dspark.worker.resource.gpu.amount=%d"
                     " -Dspark.worker.resource.gpu.discoveryScript=%s"
                     % (len(self.gpus), self.gpu_script))
        self.env = dict(env, SPARK_MASTER_OPTS=opts, SPARK_WORKER_OPTS=opts,
                        SPARK_WORKER_DIR=os.path.join(work, "worker"))

    def _start(self, cls, args, log):
        cmd = [os.path.join(self.home, "bin", "spark-class"), cls] + args
        with open(os.path.join(self.work, log), "w") as f:
            self.daemons.append(subprocess.Popen(cmd, env=self.env, cwd=self.work,
                                                 stdin=subprocess.DEVNULL, stdout=f,
                                                 stderr=subprocess.STDOUT, start_new_session=True))

    def start(self):
        port, ui = hvdtest.free_port(), hvdtest.free_port()
        self._start("org.apache.spark.deploy.master.Master",
                    ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
                    "master.log")
        hvdtest.wait_for(lambda: hvdtest.port_open("127.0.0.1", port), 60, "the Spark master")
        self.master = "spark://127.0.0.1:%d" % port
        for i in range(self.workers):
            self._start("org.apache.spark.deploy.worker.Worker",
                        ["--host", "127.0.0.1", "--cores", str(self.cores), "--memory", "1g",
                         "--webui-port", str(hvdtest.free_port()), self.master],
                        "worker%d.log" % i)
        return self

    def confs(self):
        """The application's confs ("name=value"): the secret, one executor per worker (all of
        its cores, 512 MiB) and, with GPUs, all of a worker's GPUs per executor, one per task."""
        c = ["spark.authenticate=true", "spark.authenticate.secret=" + self.secret,
             "spark.executor.cores=%d" % self.cores, "spark.executor.memory=512m"]
        if self.gpus:
            c += ["spark.executor.resource.gpu.amount=%d" % len(self.gpus),
                  "spark.executor.resource.gpu.discoveryScript=" + self.gpu_script,
                  "spark.task.resource.gpu.amount=1"]
        return c

    def stop(self):
        for d in self.daemons:
            hvdtest.stop(d, 15, sig=15)
        self.daemons = []

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()
        return False
