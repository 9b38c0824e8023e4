"""``hvd_bridge.spark.run``: ``horovod.spark.run`` on hvd-bridge (and ``run_elastic``,
``horovod.spark.run_elastic``: see its docstring). The driver service runs in
this (the Spark driver's) process; the task services run inside PySpark's Python workers, one
per task of a barrier stage; mpirun reaches them through ``hvd-rsh``; each rank unpickles the
function, calls it, and sends back its pickled return value."""
import base64
import os
import re
import shutil
import socket
import sys
import threading
import time

from .. import _core, _job, bin_dir

_WAIT_TICK_S = 0.2  # the driver thread wakes this often, so that Ctrl-C gets through

# How the executor check's error begins (the driver finds it in the Spark job's failure).
_NO_DAEMON = "hvd_bridge: the executor on host "
_NO_DAEMON_LINE = re.compile(r"(%s[^\n]*)" % re.escape(_NO_DAEMON))
# A Java exception's line in py4j's text: ": org.apache.spark.SparkException: Job 0 cancelled"
_JAVA_EXCEPTION_LINE = re.compile(r"^:?\s*(?:[\w$]+\.)+[\w$]*(?:Exception|Error): (.+)")
# Open MPI's and PRRTE's launch agent (the daemon's command) set through the environment.
_LAUNCH_AGENT_VARS = ("OMPI_MCA_orte_launch_agent", "OMPI_MCA_prte_launch_agent",
                      "PRTE_MCA_prte_launch_agent")


def _daemon_need(mpi_args):
    """What each Spark task checks before it starts its task service: {"daemon", "dirs",
    "mpi", "impl"}, the daemon the driver's mpirun will start there ("orted" for Open MPI 4,
    "prted", "hydra_pmi_proxy"), the directories besides the executor's PATH that mpirun may
    run it from (those of the driver's mpirun: run by its full path, as Hydra does and as Open
    MPI's --prefix and prefix-by-default builds do; --prefix's bin), the MPI with its version
    ("Open MPI 4.1.4") and its kind ("openmpi4", "openmpi5", "mpich"). None
    when the driver cannot tell (no mpirun, or not one it knows: the launch then says so) or
    when mpi_args name the daemon's command themselves (a launch agent)."""
    if any("launch_agent" in a or "launch-agent" in a for a in mpi_args) or any(
            os.environ.get(v) for v in _LAUNCH_AGENT_VARS):
        return None
    try:
        impl, version, daemon = _core.mpi_detect()
    except _core.HvdError:
        return None
    dirs = []
    mpirun = shutil.which("mpirun")
    if mpirun:
        dirs += [os.path.dirname(os.path.abspath(mpirun)),
                 os.path.dirname(os.path.realpath(mpirun))]
    for i, a in enumerate(mpi_args):
        if a in ("--prefix", "-prefix") and i + 1 < len(mpi_args):
            dirs.append(os.path.join(mpi_args[i + 1], "bin"))
        elif a.startswith(("--prefix=", "-prefix=")):
            dirs.append(os.path.join(a.split("=", 1)[1], "bin"))
    return {"daemon": daemon, "dirs": list(dict.fromkeys(dirs)), "mpi": version or impl,
            "impl": impl}


def _check_daemon(index, need):
    """Raises RuntimeError, one line, when this executor has no need["daemon"] (_daemon_need):
    not on its PATH, nor in any of need["dirs"]. Its shell could not start it, and mpirun
    would fail with a message that names neither the host nor the fix."""
    daemon = need["daemon"]
    if shutil.which(daemon) or any(os.access(os.path.join(d, daemon), os.X_OK)
                                   for d in need["dirs"]):
        return
    where = "on its PATH" + (" nor in " + ", ".join(need["dirs"]) if need["dirs"] else "")
    if need["impl"] == "mpich":  # Hydra runs its proxy by the path mpiexec has
        fix = ("install %s (the driver's MPI) on every executor, at the path it has on the "
               "driver" % need["mpi"])
    elif need["impl"] == "openmpi5":  # prterun often gives prted's full path
        fix = ("install %s (the driver's MPI) on every executor, at the path it has on the "
               "driver, or give extra_mpi_args='--prefix <its install dir there>'" % need["mpi"])
    else:
        fix = ("install %s (the driver's MPI; Debian: openmpi-bin) on every executor, or give "
               "extra_mpi_args='--prefix <its install dir>', or put its bin dir on the "
               "executors' PATH (spark.executorEnv.PATH)" % need["mpi"])
    raise RuntimeError("%s%s (Spark task %d) has no %s (mpirun's daemon) %s: %s" % (
        _NO_DAEMON, socket.gethostname(), index, daemon, where, fix))


def _task_fn(addrs, secret, start_timeout, net_timeout, log_level, elastic=False, need=None,
             warm_imports=None):
    """The function every Spark task runs: a task service for the partition's index (an
    elastic one, in a plain stage, for run_elastic), after checking that the MPI's daemon is
    there (need: _daemon_need's answer; None: no check); with warm_imports (comma-separated
    modules), a warm interpreter of the worker's Python with them imported."""

    def task(index, iterator):
        if need is not None:
            _check_daemon(index, need)
        from pyspark import BarrierTaskContext, TaskContext

        from hvd_bridge import _core as core

        ctx = TaskContext.get() if elastic else BarrierTaskContext.get()
        resources = ctx.resources() if ctx is not None else {}
        gpus = list(resources["gpu"].addresses) if "gpu" in resources else None
        # The ranks run in this worker's Python unless the driver names another.
        os.environ["HVD_PYTHON"] = sys.executable
        t = core.Task(index, addrs, secret, gpus=gpus, work_dir=os.getcwd(),
                      start_timeout=start_timeout, net_timeout=net_timeout, log_level=log_level,
                      elastic=elastic, warm_python=sys.executable if warm_imports else None,
                      warm_imports=warm_imports)
        try:
            code = t.run()
        except core.HvdError as e:
            if e.code != "shutting down":  # the driver ended the job: not this task's failure
                raise
            code = None
        finally:
            t.stop()
        yield index, code

    return task


class _SparkJob(threading.Thread):
    """Runs the barrier stage of task services; a failure aborts the driver's job."""

    def __init__(self, sc, group, num_proc, task_fn, driver, barrier=True):
        super().__init__(name="hvd-bridge spark", daemon=True)
        self.sc, self.group, self.num_proc = sc, group, num_proc
        self.task_fn, self.driver, self.barrier = task_fn, driver, barrier
        self.error = None
        self.executor_problem = None  # _check_daemon's line, when a task failed it

    def run(self):
        try:
            self.sc.setJobGroup(self.group, "hvd_bridge.spark.run", interruptOnCancel=True)
            rdd = self.sc.range(0, self.num_proc, numSlices=self.num_proc)
            # An elastic job's tasks come and go one by one (a lost executor's are run again
            # elsewhere), which a barrier stage would not allow.
            rdd = rdd.barrier() if self.barrier else rdd
            rdd.mapPartitionsWithIndex(self.task_fn).collect()
        except Exception as e:  # noqa: BLE001 - any Spark failure ends the job
            self.error = _spark_error_line(e)
            m = _NO_DAEMON_LINE.search(str(e))
            if m:
                self.error = self.executor_problem = m.group(1).strip()
            self.driver.abort("the Spark job failed: %s" % self.error)


def _spark_error_line(e):
    """The line of a Spark failure that says what happened, at most 600 characters: for py4j's
    Py4JJavaError the Java exception's message ("Job 0 cancelled as part of cancellation of all
    jobs"), not py4j's first line ("An error occurred while calling ...") and the stack."""
    text = str(e).strip()
    for line in text.splitlines():
        m = _JAVA_EXCEPTION_LINE.match(line)
        if m:
            return m.group(1).strip()[:600]
    return (text.splitlines()[0] if text else type(e).__name__)[:600]


def _task_slots(sc):
    """The task slots the application has now: the count Spark's barrier stage checks against
    (executors' cores / spark.task.cpus); None when this Spark does not say (its private
    maxNumConcurrentTasks has another form)."""
    try:
        jsc = sc._jsc.sc()
        return int(jsc.maxNumConcurrentTasks(
            jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # noqa: BLE001 - py4j's errors, another Spark: do not wait, as before
        return None


def _wait_for_slots(sc, num_proc, timeout_s):
    """Waits until the application has num_proc task slots, before the barrier stage is
    submitted. A barrier stage submitted with too few (executors still registering, say)
    waits for Spark's next check, 15 s later, and cannot be cancelled meanwhile (it is not an
    active job yet): a job asking for more slots than there are would leave it behind for
    10 minutes. Raises JobError, with nothing started, when timeout_s passes first. (With
    dynamic allocation, which barrier stages do not allow, Spark's own error comes at once.)"""
    if (sc.getConf().get("spark.dynamicAllocation.enabled", "false").lower() == "true" and
            not sc.master.startswith("local")):
        return  # Spark refuses a barrier stage then, at once and saying so: no slots to wait for
    deadline = time.monotonic() + timeout_s
    slots = _task_slots(sc)
    while slots is not None and slots < num_proc:
        if time.monotonic() >= deadline:
            raise _job.JobError(
                "timed out after %g s waiting for %d Spark task slots: the application has %d "
                "(executors x cores / spark.task.cpus); the %d tasks run at once in a barrier "
                "stage: start more executors, ask for fewer ranks or a longer start_timeout"
                % (timeout_s, num_proc, slots, num_proc))
        time.sleep(_WAIT_TICK_S)
        slots = _task_slots(sc)


def _run_job(driver, run=None, **kw):
    """driver.run_job (or run) on a thread of its own, so that this thread stays interruptible:
    Ctrl-C aborts the job (mpirun and the ranks are stopped) and is raised once it is down."""
    box = {}
    # The job's end is an Event, not Thread.join: a join that Ctrl-C interrupts can mark a
    # thread that still runs as stopped (CPython 3.11), and a later join returns at once.
    done = threading.Event()

    def target():
        try:
            box["outcome"] = (run or driver.run_job)(**kw)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=target, name="hvd-bridge job", daemon=True).start()
    try:
        while not done.wait(_WAIT_TICK_S):
            pass
    except KeyboardInterrupt:
        driver.abort("interrupted (KeyboardInterrupt)")
        while True:  # until the job is down, also through another Ctrl-C
            try:
                if done.wait(_WAIT_TICK_S):
                    break
            except KeyboardInterrupt:
                pass
        raise
    if "error" in box:
        raise box["error"]
    return box["outcome"]


def run(fn, args=(), kwargs={}, num_proc=None, start_timeout=None, use_mpi=None,
        use_gloo=None, extra_mpi_args=None, env=None, stdout=None, stderr=None, verbose=1,
        nics=None, prefix_output_with_timestamp=False, executable=None):
    """Runs ``fn(*args, **kwargs)`` on ``num_proc`` ranks inside the Spark application's
    executors and returns the return values in rank order (``horovod.spark.run``).

    num_proc: ranks = Spark tasks (default: spark.default.parallelism); the stage is a barrier
    stage, so that many task slots must be free at once. start_timeout: seconds for the tasks
    to start and find each other (default $HOROVOD_SPARK_START_TIMEOUT, else 600).
    extra_mpi_args: more mpirun arguments (a string); env: variables for the ranks.
    stdout, stderr: text streams for the ranks' output (default this process's sys.stdout and
    sys.stderr, e.g. a notebook cell), one line at a time, prefixed "[1,rank]<stdout>:";
    prefix_output_with_timestamp adds mpirun's timestamps (Open MPI; MPICH has none: a
    warning). verbose: 2 logs progress.
    nics: the interfaces to use (default: those every pair of tasks can reach each other on).
    executable: the Python of the ranks (default: that of the PySpark workers).
    A task with Spark GPU resources gives them to its rank (CUDA_VISIBLE_DEVICES, HVD_GPUS).
    Raises hvd_bridge.JobError naming the rank, task and host that failed first, with its
    traceback; hvd_bridge._core.HvdError when the job could not start (its text says why).
    """
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError("Could not find an active SparkContext, are you running in a PySpark "
                           "session?")
    _job.only_mpi(use_gloo, use_mpi)
    num_proc = _job.rank_count(num_proc if num_proc is not None else sc.defaultParallelism,
                               "num_proc")
    verbose = _job.verbosity(verbose)
    nics = _job.nic_list(nics)
    stdout = _job.text_stream(stdout, sys.stdout, "stdout")
    stderr = _job.text_stream(stderr, sys.stderr, "stderr")
    start = _job.timeout_s(start_timeout, "HOROVOD_SPARK_START_TIMEOUT", 600,
                           "start_timeout")
    mpi_args = _job.mpi_args(extra_mpi_args, env, prefix_output_with_timestamp)
    payload = _job.payload(fn, args, kwargs)
    _wait_for_slots(sc, num_proc, start)
    driver = _core.Driver(num_proc, _job.rank_argv(executable), payload=payload, nics=nics,
                          verbose=verbose >= 2)
    group = "hvd_bridge.spark.run.%d.%d" % (os.getpid(), id(driver))
    secret = base64.b64decode(driver.job_env()["HVD_SECRET"])
    task_fn = _task_fn(driver.addresses, secret, start, _core.NET_TIMEOUT_DEFAULT_S,
                       "info" if verbose >= 2 else "warn", need=_daemon_need(mpi_args))
    spark = _SparkJob(sc, group, num_proc, task_fn, driver)
    out = _job.OutputForwarder(stdout)
    err = _job.OutputForwarder(stderr)
    return _drive(sc, group, spark, driver, out, err, lambda: _run_job(
        driver, bin_dir=bin_dir(), mpi_args=mpi_args, start_timeout=start, stdout_fd=out.fd,
        stderr_fd=err.fd)[0])


def run_elastic(fn, args=(), kwargs=None, num_proc=None, min_np=None, max_np=None,
                start_timeout=None, elastic_timeout=None, reset_limit=None, env=None, stdout=None,
                stderr=None, verbose=1, nics=None, prefix_output_with_timestamp=False,
                min_num_proc=None, max_num_proc=None, extra_mpi_args=None, executable=None,
                warm=False, warm_imports=("torch", "torch._dynamo")):
    """Runs ``fn(*args, **kwargs)`` as an elastic job inside the Spark application's executors
    (``horovod.spark.run_elastic``) and returns the return values of the last launch's ranks
    in rank order.

    max_np (or max_num_proc; default num_proc) Spark tasks each run an elastic task service,
    in a plain (not barrier) stage: an executor that is lost takes its tasks' task services
    with it, the job is reset over the others (between min_np and max_np ranks, min_np
    defaulting to num_proc), and when Spark runs the lost tasks again elsewhere, the job grows
    back to them at the ranks' next commit. num_proc (default spark.default.parallelism): the
    ranks the first launch waits for. fn should use hvd_bridge.torch.elastic (TorchState,
    @hvd.elastic.run) to commit its state and resume from it; each reset is one line on stderr.
    elastic_timeout: seconds with fewer than min_np slots before the job fails (default 600);
    reset_limit: most resets (default: none). warm=True: every task service keeps a warm
    interpreter (the worker's Python with warm_imports imported) from which the ranks are
    forked, so that a reset does not import torch again (docs/elastic.md, "Warm Python
    ranks"); it costs an interpreter's memory per task. The other arguments are run()'s.
    """
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError("Could not find an active SparkContext, are you running in a PySpark "
                           "session?")
    num_proc = _job.rank_count(num_proc if num_proc is not None else sc.defaultParallelism,
                               "num_proc")
    verbose = _job.verbosity(verbose)
    nics = _job.nic_list(nics)
    stdout = _job.text_stream(stdout, sys.stdout, "stdout")
    stderr = _job.text_stream(stderr, sys.stderr, "stderr")
    min_np = _job.either(min_np, "min_np", min_num_proc, "min_num_proc")
    min_np = _job.rank_count(min_np, "min_np") if min_np is not None else num_proc
    max_np = _job.either(max_np, "max_np", max_num_proc, "max_num_proc")
    max_np = _job.rank_count(max_np, "max_np") if max_np is not None else max(num_proc, min_np)
    if not min_np <= num_proc <= max_np:
        raise ValueError("need 1 <= min_np (%d) <= num_proc (%d) <= max_np (%d)" % (
            min_np, num_proc, max_np))
    start = _job.timeout_s(start_timeout, "HOROVOD_SPARK_START_TIMEOUT", 600,
                           "start_timeout")
    elastic = _job.timeout_s(elastic_timeout, "HOROVOD_ELASTIC_TIMEOUT", 600,
                             "elastic_timeout")
    mpi_args = _job.mpi_args(extra_mpi_args, env, prefix_output_with_timestamp)
    driver = _core.Driver(max_np, _job.rank_argv(executable), payload=_job.payload(fn, args,
                          kwargs or {}), nics=nics, verbose=verbose >= 2)
    group = "hvd_bridge.spark.run_elastic.%d.%d" % (os.getpid(), id(driver))
    secret = base64.b64decode(driver.job_env()["HVD_SECRET"])
    task_fn = _task_fn(driver.addresses, secret, start, _core.NET_TIMEOUT_DEFAULT_S,
                       "info" if verbose >= 2 else "warn", elastic=True,
                       need=_daemon_need(mpi_args),
                       warm_imports=",".join(warm_imports) if warm else None)
    spark = _SparkJob(sc, group, max_np, task_fn, driver, barrier=False)
    out = _job.OutputForwarder(stdout)
    err = _job.OutputForwarder(stderr)
    return _drive(sc, group, spark, driver, out, err, lambda: _run_job(
        driver, run=driver.run_elastic, bin_dir=bin_dir(), min_np=min_np, max_np=max_np,
        np=num_proc, reset_limit=-1 if reset_limit is None else int(reset_limit),
        elastic_timeout=elastic, mpi_args=mpi_args, start_timeout=start, stdout_fd=out.fd,
        stderr_fd=err.fd)[0])


def _not_started(why, spark, sc):
    """The error for Spark tasks that did not all start in time, from the driver's sentence
    (its question about hvd-task's --driver is for task services started by hand)."""
    why = why.split(": are the executors running hvd-task")[0]
    num_proc, slots = spark.num_proc, sc.defaultParallelism
    if num_proc > slots:
        return ("%s (%d Spark tasks must run at once, and the application has %d task slots "
                "(spark.default.parallelism): start more executors or ask for fewer ranks)" % (
                    why, num_proc, slots))
    return ("%s: not all of the job's %d Spark tasks started%s: other jobs may hold the "
            "application's %d task slots; wait for them, ask for fewer ranks, or give a longer "
            "start_timeout" % (why, num_proc, " (a barrier stage runs them at once)"
                               if spark.barrier else "", slots))


def _drive(sc, group, spark, driver, out, err, launch):
    """Starts the Spark stage of task services, runs launch() (-> mpirun's status) and returns
    the ranks' values, or raises naming what failed first; then ends the tasks, the stage
    (cancelled if it does not end by itself), the driver and the output forwarders."""
    spark.start()
    never_started = False
    try:
        status = launch()
        reason = "the Spark job failed: %s" % spark.error if spark.error else None
        failure, first_failed = driver.failure()
        return _job.values_or_raise(driver.results(), status, reason, failure, first_failed)
    except _core.HvdError as e:
        if spark.executor_problem is not None:  # one line says it all
            raise _job.JobError("the Spark job failed: %s" % spark.executor_problem) from e
        if spark.error is not None:
            raise _job.JobError("%s (the Spark job failed: %s)" % (e, spark.error)) from e
        never_started = str(e).startswith("timed out") and "to register" in str(e)
        if never_started:
            raise _job.JobError(_not_started(str(e), spark, sc)) from e
        raise
    finally:
        driver.shutdown_tasks()
        if never_started:  # tasks still waiting for a slot cannot end by themselves
            sc.cancelJobGroup(group)
        spark.join(30)
        if spark.is_alive():
            sc.cancelJobGroup(group)
            spark.join(30)
        driver.stop()
        out.join(5)
        err.join(5)
