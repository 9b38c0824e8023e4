"""The Spark application of bench/compare (started by spark_cluster.py through spark-submit,
with the virtual environment's python on the driver and the executors).

  spark_app.py OUT.json BIN_DIR TRIVIAL_SO TASKS(2,4,8) RUNS

In one SparkContext, for each N in TASKS and each run, alternating which goes first:
  horovod  horovod.spark.run(trivial, num_proc=N)           (MPI mode, Horovod's defaults)
  hvd      org.hvdbridge.spark.HorovodSpark.run(jsc, EntryPoint.sharedObject(TRIVIAL_SO,
           "trivial_entry"), N, Options().binDir(BIN_DIR))  (through py4j, same JVM)
and records, in ms from just before the call: when the last rank entered its entry point
(each returns its wall clock) and when the results were back at the driver (the call
returned). One untimed warm-up of each first. Results must be N values in rank order.

Horovod 0.28.1's launcher refuses MPI mode unless a framework plugin compiled with MPI is
installed (`mpi_built()` asks the TensorFlow/PyTorch/MXNet extension). None is installed
here (and none is used: the function is plain Python), so that one check is replaced by
`True`; everything else runs as shipped.
"""
import json
import sys
import time
import traceback

from pyspark.sql import SparkSession

import horovod.runner.launch as hvd_launch
import horovod.spark

hvd_launch.mpi_built = lambda verbose=False: True


def trivial():
    return time.time()


def main():
    out, bin_dir, so_path, tasks, runs = sys.argv[1:6]
    tasks = [int(x) for x in tasks.split(",")]
    runs = int(runs)
    spark = SparkSession.builder.appName("hvd-bridge compare").getOrCreate()
    sc = spark.sparkContext
    jvm = sc._jvm
    samples, failures = {}, {}

    def run_horovod(n):
        return [float(x) for x in horovod.spark.run(trivial, num_proc=n, use_mpi=True, use_gloo=False,
                                                     start_timeout=120, verbose=0)]

    def run_hvd(n):
        ep = jvm.org.hvdbridge.EntryPoint.sharedObject(so_path, "trivial_entry", bytearray())
        opts = getattr(jvm.org.hvdbridge.spark, "HorovodSpark$Options")().binDir(bin_dir)
        res = jvm.org.hvdbridge.spark.HorovodSpark.run(sc._jsc, ep, n, opts)
        return [float(r.text()) for r in res]

    systems = {"horovod": run_horovod, "hvd": run_hvd}

    def once(system, n, record=True):
        t0 = time.time()
        try:
            vals = systems[system](n)
            t1 = time.time()
            if len(vals) != n:
                raise RuntimeError("%d results for %d ranks" % (len(vals), n))
            if record:
                samples.setdefault("spark/%s/%d/results" % (system, n), []).append((t1 - t0) * 1000)
                samples.setdefault("spark/%s/%d/entry" % (system, n), []).append((max(vals) - t0) * 1000)
        except Exception as e:  # noqa: BLE001 (a failed run is recorded and the next one tried)
            traceback.print_exc()
            failures.setdefault("spark/%s/%d" % (system, n), []).append(str(e).strip()[-400:])
        print("spark_app: %s N=%d %.0f ms" % (system, n, (time.time() - t0) * 1000), file=sys.stderr, flush=True)

    order = ["horovod", "hvd"]
    for s in order:
        once(s, tasks[0], record=False)
    for r in range(runs):
        for n in tasks:
            for s in (order if r % 2 == 0 else order[::-1]):
                once(s, n)
    info = {"spark": sc.version, "master": sc.master,
            "executors": int(sc._jsc.sc().getExecutorMemoryStatus().size()) - 1}
    with open(out, "w") as f:
        json.dump({"samples": samples, "failures": failures, "info": info}, f)
    spark.stop()


if __name__ == "__main__":
    main()
