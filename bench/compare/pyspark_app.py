"""The PySpark application of compare.py's measure "pyspark" (started by spark_cluster.py
--app python through spark-submit, on a local-cluster master, with a Python that has both
hvd_bridge and horovod 0.28.1 on the driver and the executors).

  pyspark_app.py OUT.json time TASKS(2,4,8) RUNS WARMUPS
  pyspark_app.py OUT.json rss  N RUNS WARMUPS SAMPLER.py

The same Python function, `rank_fn` (returns its MPI rank), through
  horovod  horovod.spark.run(rank_fn, num_proc=N, use_mpi=True)  (Horovod's defaults otherwise)
  hvd      hvd_bridge.spark.run(rank_fn, num_proc=N)
in one SparkContext, after waiting until both executors are up and every Python worker
daemon has started (hvd_bridge.spark.run runs a barrier stage: every slot at once). Each
result must be [0, 1, ..., N-1].

time: WARMUPS untimed calls of each (1; --smoke: 0), then RUNS rounds; in each, for each N, both systems, the
      order swapping every round; records the time from just before the call to its return
      (ms, "pyspark/<system>/<N>/results").
rss:  WARMUPS untimed calls of each, then RUNS rounds at N, alternating the same way; around
      each call SAMPLER.py (proc_sampler.py, a separate process: no Python thread in this
      driver competes with Horovod's) samples every process below this driver and below the
      executors' pyspark.daemon processes; they are sorted into kinds (see classify) and
      each kind's peak is recorded in KiB ("pyspark-rss/<system>/<kind>"). A call in which a
      process the job must have had (N task workers, N ranks, an orted, mpirun) was not seen
      is a failed run, not a zero. Runs with spark.python.worker.reuse=false (spark_cluster.py
      sets it for this mode), so that each task has a Python worker of its own that starts
      with the task and ends with it: its peak is that task's, not an earlier job's.

Horovod 0.28.1's launcher refuses MPI mode unless a framework plugin compiled with MPI is
installed (`mpi_built()` asks the TensorFlow/PyTorch/MXNet extension); none is installed and
none is used (the function is plain Python), so that one check is replaced by `True`, as in
spark_app.py.
"""
import json
import os
import subprocess
import sys
import time
import traceback

from pyspark.sql import SparkSession

import horovod.runner.launch as hvd_launch
import horovod.spark
import hvd_bridge.spark

hvd_launch.mpi_built = lambda verbose=False: True


def rank_fn():
    import os as _os
    return int(_os.environ["OMPI_COMM_WORLD_RANK"])


def log(*a):
    print("pyspark_app:", *a, file=sys.stderr, flush=True)


def wait_for_executors(sc, slots, timeout=180):
    """Both executors registered and their slots offered, then a plain stage over every slot
    so that each executor has started its pyspark.daemon (the sampler's roots)."""
    end = time.time() + timeout
    while time.time() < end:
        if sc._jsc.sc().getExecutorMemoryStatus().size() - 1 >= 2 and sc.defaultParallelism >= slots:
            break
        time.sleep(0.5)
    else:
        raise RuntimeError("the executors did not come up in %d s" % timeout)
    sc.parallelize(range(slots), slots).map(lambda x: os.getpid()).collect()


def ps_children(pid):
    out = []
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                    out += [int(x) for x in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def ps_cmd(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def daemons():
    """The pyspark.daemon of each executor: spark-submit's JVM (this process's parent) starts
    the executors of local-cluster, and each executor its daemon."""
    execs = [p for p in ps_children(os.getppid()) if "CoarseGrainedExecutorBackend" in ps_cmd(p)]
    found = [d for e in execs for d in ps_children(e) if "pyspark.daemon" in ps_cmd(d)]
    if len(execs) < 2 or len(found) < len(execs):
        raise RuntimeError("expected 2 executors with a pyspark.daemon each, found %d executors "
                           "and daemons %s" % (len(execs), found))
    return found


def classify(procs, driver, roots, n):
    """Peak memory per kind, in KiB, from the sampler's {pid: {ppid, cmd, hwm, rss, uss, seen,
    first}}; only processes the call started count (not there at the sampler's first sample:
    this leaves out Horovod's multiprocessing resource tracker, which its first call starts in
    the driver and which then lives as long as the driver), and the driver itself:

      driver       this process (the PySpark driver's Python): largest VmRSS and USS during
                   the call (the same process for both systems, both imported)
      driver_side  every process the call started below it (mpirun, the agents, Horovod's
                   spawn interpreter and `mpirun --version`, hvd-bridge's keeper), summed
      worker       a Python worker of an executor that ran one task of the job (the task
                   service inside), the largest of the N
      task_helpers the workers' other descendants (Horovod: the spawn interpreter that runs the
                   command; hvd-bridge: the keeper, sh), orted and below excluded, summed
      orted        the largest orted (the same program for both)
      rank         per rank, the process orted started and its descendants summed (Horovod:
                   python -m horovod.spark.task.mpirun_exec_fn; hvd-bridge: hvd-exec and its
                   python -m hvd_bridge._rank), the largest of the N
      total        every process the call started, summed

    Returns ({kind: (rss, uss)}, counts, commands, missing): rss is VmHWM (VmRSS for the
    driver), uss the largest USS sampled; missing lists what the job must have had and the
    sampler did not see."""
    kids = {}
    for pid, p in procs.items():
        kids.setdefault(p["ppid"], []).append(pid)

    def subtree(pid):
        out, todo = [], [pid]
        while todo:
            q = todo.pop()
            out.append(q)
            todo += kids.get(q, [])
        return out

    def new(pids):
        return [q for q in pids if procs[q]["first"] > 0]

    def total(pids):
        return (sum(procs[q]["hwm"] for q in pids), sum(procs[q]["uss"] for q in pids))

    def largest(groups):
        sums = [total(g) for g in groups]
        return (max(r for r, _ in sums), max(u for _, u in sums)) if sums else None

    def prog(q):
        return os.path.basename(procs[q]["cmd"].split(" ")[0])

    below_driver = new(q for q in subtree(driver) if q != driver)
    workers = new(q for d in roots if d != driver for q in kids.get(d, []))
    orteds = [q for w in workers for q in subtree(w) if prog(q) == "orted"]
    ranks = [r for o in orteds for r in kids.get(o, [])]
    under_orted = {q for o in orteds for q in subtree(o)}
    helpers = [q for w in workers for q in subtree(w) if q != w and q not in under_orted]
    mpirun = [q for q in below_driver if prog(q) == "mpirun"]
    started = below_driver + [q for w in workers for q in subtree(w)]
    missing = []
    if driver not in procs:
        missing.append("the driver process")
    if len(workers) != n:
        missing.append("task workers: saw %d of %d" % (len(workers), n))
    if not orteds:
        missing.append("orted")
    if len(ranks) != n:
        missing.append("ranks: saw %d of %d" % (len(ranks), n))
    if not mpirun:
        missing.append("mpirun")
    if any(procs[q]["hwm"] <= 0 for q in started):
        missing.append("the memory of %s" % [procs[q]["cmd"][:60] for q in started if procs[q]["hwm"] <= 0])
    kinds = {
        "driver": (procs[driver]["rss"], procs[driver]["uss"]) if driver in procs else None,
        "driver_side": total(below_driver),
        "worker": largest([[w] for w in workers]),
        "task_helpers": total(helpers),
        "orted": largest([[o] for o in orteds]),
        "rank": largest([subtree(r) for r in ranks]),
        "total": total(started),
    }
    counts = {"driver_side": len(below_driver), "worker": len(workers), "task_helpers": len(helpers),
              "orted": len(orteds), "rank": len(ranks), "total": len(started)}
    commands = {
        "driver_side": sorted({procs[q]["cmd"][:90] for q in below_driver}),
        "task_helpers": sorted({procs[q]["cmd"][:90] for q in helpers}),
        "rank": sorted({procs[q]["cmd"][:90] for r in ranks for q in subtree(r)}),
    }
    return kinds, counts, commands, missing


def main():
    out, mode = sys.argv[1:3]
    spark = SparkSession.builder.appName("hvd-bridge compare: pyspark").getOrCreate()
    sc = spark.sparkContext
    samples, failures, info = {}, {}, {"spark": sc.version, "master": sc.master,
                                       "worker_reuse": sc.getConf().get("spark.python.worker.reuse", "true")}
    tasks = [int(x) for x in sys.argv[3].split(",")]
    runs, warmups = int(sys.argv[4]), int(sys.argv[5])
    wait_for_executors(sc, max(tasks))
    info["executors"] = int(sc._jsc.sc().getExecutorMemoryStatus().size()) - 1

    def run_horovod(n):
        return horovod.spark.run(rank_fn, num_proc=n, use_mpi=True, use_gloo=False, start_timeout=120,
                                 verbose=0)

    def run_hvd(n):
        return hvd_bridge.spark.run(rank_fn, num_proc=n, start_timeout=120, verbose=0)

    systems = {"horovod": run_horovod, "hvd": run_hvd}

    def call(system, n):
        """(seconds, None) or (seconds, why it failed)."""
        t0 = time.time()
        try:
            vals = systems[system](n)
            dt = time.time() - t0
            if list(vals) != list(range(n)):
                return dt, "results %r, expected ranks 0..%d in order" % (vals, n - 1)
            return dt, None
        except Exception as e:  # noqa: BLE001 (a failed run is recorded and the next one tried)
            traceback.print_exc()
            return time.time() - t0, ("%s: %s" % (type(e).__name__, e)).strip()[-400:]

    def fail(key, why):
        failures.setdefault(key, []).append(why)
        log("FAIL %s: %s" % (key, why))

    order = ["horovod", "hvd"]
    for s in order * warmups:  # page cache, the workers' first imports
        dt, why = call(s, tasks[0])
        log("warm-up %s N=%d %.0f ms%s" % (s, tasks[0], dt * 1000, " FAILED " + why if why else ""))

    if mode == "time":
        for r in range(runs):
            for n in tasks:
                for s in (order if r % 2 == 0 else order[::-1]):
                    dt, why = call(s, n)
                    if why:
                        fail("pyspark/%s/%d" % (s, n), why)
                    else:
                        samples.setdefault("pyspark/%s/%d/results" % (s, n), []).append(dt * 1000)
                    log("%s N=%d %.0f ms" % (s, n, dt * 1000))
    else:
        sampler, n = sys.argv[6], tasks[0]
        info["rss_n"] = n
        info["rss_procs"] = {}
        roots = [os.getpid()] + daemons()
        for r in range(runs):
            for s in (order if r % 2 == 0 else order[::-1]):
                p = subprocess.Popen([sys.executable, sampler] + [str(x) for x in roots], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
                if p.stdout.readline() != b"ready\n":  # its first sample: what was there before
                    raise RuntimeError("proc_sampler.py did not start")
                dt, why = call(s, n)
                time.sleep(0.2)  # the last processes' final samples
                res = json.loads(p.communicate(b"")[0].decode())
                procs = {int(k): v for k, v in res["procs"].items()}
                for v in procs.values():
                    v["ppid"] = int(v["ppid"]) if v["ppid"] is not None else None
                kinds, counts, names, missing = classify(procs, os.getpid(), roots, n)
                if why:
                    fail("pyspark-rss/%s" % s, why)
                elif missing:
                    fail("pyspark-rss/%s" % s, "the sampler (%d samples) missed %s" % (res["samples"],
                                                                                    ", ".join(missing)))
                else:
                    for k, (rss, uss) in kinds.items():
                        samples.setdefault("pyspark-rss/%s/%s" % (s, k), []).append(rss)
                        samples.setdefault("pyspark-uss/%s/%s" % (s, k), []).append(uss)
                    info["rss_procs"][s] = {"counts": counts, "commands": names}
                log("rss %s N=%d %.0f ms, %d samples: %s" % (s, n, dt * 1000, res["samples"],
                                                            json.dumps(kinds)))
    with open(out, "w") as f:
        json.dump({"samples": samples, "failures": failures, "info": info}, f)
    spark.stop()


if __name__ == "__main__":
    main()
