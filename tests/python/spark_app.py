#!/usr/bin/env python3
"""The PySpark application of test_spark_python.py: hvd_bridge.spark.run on the Spark master
given on the command line (local-cluster or a standalone master); prints one line
"CASE <name> <json>" per case for the test to check.

  spark_app.py MASTER NUM_PROC [--train] [conf=value ...]

--train adds the training parity case: tests/python/torch_cases.py's MLP on the digits with
hvd_bridge.torch's DistributedOptimizer, on 1, 2 and 4 ranks.
"""
import io
import json
import os
import sys
import time


def ancestors():
    """The command lines of this process's ancestors, nearest first."""
    out, pid = [], __import__("os").getppid()
    while pid > 1:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                out.append(f.read().replace(b"\0", b" ").decode(errors="replace").strip())
            with open("/proc/%d/stat" % pid) as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    return out


def ranked(base, offset=0):
    import os as _os
    print("rank %s says hello" % _os.environ["RANK"])
    return {"rank": int(_os.environ["RANK"]), "size": int(_os.environ["WORLD_SIZE"]),
            "value": base * int(_os.environ["RANK"]) + offset, "ancestors": ancestors(),
            "gpus": _os.environ.get("HVD_GPUS"), "cuda": _os.environ.get("CUDA_VISIBLE_DEVICES")}


def fails_on_two():
    import os as _os
    import time as _time
    if _os.environ["RANK"] == "2":
        raise ValueError("rank two fails on purpose")
    _time.sleep(2)
    return "ok"


def hangs(d):
    import os as _os
    import time as _time
    open(_os.path.join(d, "started.%s" % _os.environ["RANK"]), "w").close()
    _time.sleep(600)


def interrupt_case(hs, num_proc):
    """Ctrl-C (SIGINT to this process, as a terminal sends it) once every rank has started:
    hs.run raises KeyboardInterrupt once the job is down, and the next job runs."""
    import signal
    import tempfile
    d = tempfile.mkdtemp(prefix="hvd-interrupt.")
    once_ranks_started(d, num_proc, lambda: os.kill(os.getpid(), signal.SIGINT))
    t0 = time.time()
    try:
        hs.run(hangs, args=(d,), num_proc=num_proc, stdout=io.StringIO(), stderr=io.StringIO())
        report("interrupt", {"raised": None})
    except BaseException as e:  # noqa: BLE001 - what it raised is the case's result
        report("interrupt", {"raised": type(e).__name__, "message": str(e),
                             "seconds": time.time() - t0})
    remove_dir(d)
    report("after_interrupt", {"values": hs.run(ranked, args=(1,), num_proc=num_proc)})


def refused_case(hs, num_proc):
    """Arguments that cannot work are refused before a Spark stage starts."""
    got = []
    for run, kw in ((hs.run, dict(stdout=5)),
                    (hs.run_elastic, dict(min_np=1, min_num_proc=2)),
                    (hs.run_elastic, dict(max_np=0))):
        try:
            run(ranked, args=(1,), num_proc=num_proc, **kw)
            got.append(None)
        except Exception as e:  # noqa: BLE001 - what it raised is the case's result
            got.append("%s: %s" % (type(e).__name__, e))
    report("refused", {"errors": got})


def slots_case(hs, sc, num_proc):
    """More ranks than the application has task slots: run waits start_timeout for them and
    raises, with no Spark stage submitted (a barrier stage waiting for slots cannot be
    cancelled: it was left behind, with the thread that submitted it, for minutes)."""
    import threading
    want = sc.defaultParallelism + 2
    try:
        hs.run(ranked, args=(1,), num_proc=want, start_timeout=3, stdout=io.StringIO(),
               stderr=io.StringIO())
        raised = None
    except Exception as e:  # noqa: BLE001 - what it raised is the case's result
        raised = "%s: %s" % (type(e).__name__, e)
    report("slots", {"want": want, "raised": raised,
                     "active_jobs": list(sc.statusTracker().getActiveJobsIds()),
                     "spark_threads": [t.name for t in threading.enumerate()
                                       if t.name == "hvd-bridge spark"]})


def busy_case(hs, sc, num_proc):
    """Another job holds a task slot: the barrier stage cannot start, and run raises soon after
    start_timeout with what to do (it waited 30 s more for a stage that could not end, and
    asked about hvd-task's --driver)."""
    import threading
    started = threading.Event()

    def blocker():
        sc.setJobGroup("hvd-test-blocker", "holds a slot", interruptOnCancel=True)
        started.set()
        try:
            sc.range(0, 1, numSlices=1).map(lambda x: time.sleep(300)).collect()
        except Exception:  # noqa: BLE001 - cancelled below
            pass

    t = threading.Thread(target=blocker, daemon=True)
    t.start()
    started.wait(30)
    deadline = time.time() + 60
    while not sc.statusTracker().getActiveJobsIds() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(2)  # its task is running
    t0 = time.time()
    try:
        hs.run(ranked, args=(1,), num_proc=num_proc, start_timeout=5, stdout=io.StringIO(),
               stderr=io.StringIO())
        raised = None
    except Exception as e:  # noqa: BLE001 - what it raised is the case's result
        raised = "%s: %s" % (type(e).__name__, e)
    seconds = time.time() - t0
    sc.cancelJobGroup("hvd-test-blocker")
    t.join(60)
    report("busy", {"raised": raised, "seconds": seconds})


def cancel_case(hs, sc, num_proc):
    """The Spark job cancelled while the ranks run (sc.cancelAllJobs, the UI's kill): one line
    with Spark's reason, not py4j's text and the Java stack."""
    import tempfile
    d = tempfile.mkdtemp(prefix="hvd-cancel.")
    once_ranks_started(d, num_proc, sc.cancelAllJobs)
    try:
        hs.run(hangs, args=(d,), num_proc=num_proc, stdout=io.StringIO(), stderr=io.StringIO())
        raised = None
    except Exception as e:  # noqa: BLE001 - what it raised is the case's result
        raised = "%s: %s" % (type(e).__name__, e)
    remove_dir(d)
    report("cancel", {"raised": raised})


def once_ranks_started(d, num_proc, action):
    """Calls action from a thread once num_proc ranks of hangs(d) have started (at most 120 s)."""
    import threading

    def wait_then_act():
        deadline = time.time() + 120
        while time.time() < deadline and sum(f.startswith("started.")
                                             for f in os.listdir(d)) < num_proc:
            time.sleep(0.1)
        action()

    threading.Thread(target=wait_then_act, daemon=True).start()


def remove_dir(d):
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)


def report(name, value):
    print("CASE %s %s" % (name, json.dumps(value)), flush=True)


def train_case(hs):
    import cloudpickle
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_cases
    cloudpickle.register_pickle_by_value(torch_cases)
    runs = {n: hs.run(torch_cases.train_digits, num_proc=n) for n in (1, 2, 4)}
    import torch
    base = [torch.tensor(p) for p in runs[1][0][0]]
    diffs = [max((torch.tensor(p) - b).abs().max().item() for p, b in zip(params, base))
             for params, _ in runs[2] + runs[4]]
    report("train", {"accuracy": [acc for _, acc in runs[1] + runs[2] + runs[4]], "max_diff": diffs})


def main():
    train = "--train" in sys.argv
    sys.argv = [a for a in sys.argv if a != "--train"]
    master, num_proc = sys.argv[1], int(sys.argv[2])
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    conf = SparkConf().setMaster(master).setAppName("hvd_bridge spark test")
    for kv in sys.argv[3:]:
        k, v = kv.split("=", 1)
        conf.set(k, v)
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    sc = spark.sparkContext
    # No wait for the executors here: run waits for the task slots itself.
    import hvd_bridge
    import hvd_bridge.spark as hs

    out = io.StringIO()
    t0 = time.time()
    values = hs.run(ranked, args=(10,), kwargs={"offset": 1}, num_proc=num_proc, stdout=out,
                    stderr=io.StringIO())
    report("values", {"values": values, "seconds": time.time() - t0,
                      "stdout": out.getvalue().splitlines()})

    err = io.StringIO()
    try:
        hs.run(fails_on_two, num_proc=num_proc, stdout=io.StringIO(), stderr=err)
        report("exception", {"raised": False})
    except hvd_bridge.JobError as e:
        report("exception", {"raised": True, "type": type(e).__name__, "rank": e.rank,
                             "task": e.task, "host": e.host, "message": str(e),
                             "traceback": e.remote_traceback, "stderr": err.getvalue(),
                             "rank_errors": [o.error for o in e.results]})
    # The job after a failure runs as usual.
    report("again", {"values": hs.run(ranked, args=(1,), num_proc=num_proc)})
    refused_case(hs, num_proc)
    slots_case(hs, sc, num_proc)
    busy_case(hs, sc, num_proc)
    cancel_case(hs, sc, num_proc)
    interrupt_case(hs, num_proc)
    if train:
        train_case(hs)
    spark.stop()


if __name__ == "__main__":
    main()
