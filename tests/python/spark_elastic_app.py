#!/usr/bin/env python3
"""The PySpark application of test_spark_elastic.py: hvd_bridge.spark.run_elastic trains
examples/python/train_elastic.py's MLP on the Spark master given on the command line while the
test kills an executor; prints "CASE elastic <json>" with the final model's distance to an
undisturbed run's (hvd_bridge.run, 4 ranks, the same samples). The task services keep warm
interpreters (warm=True): the ranks are forked from them.

  spark_elastic_app.py MASTER LOG [conf=value ...]

Rank 0 of the elastic job appends its "start ..." and "commit ..." lines to LOG, which the
test watches to know when to kill.
"""
import io
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "python"))


def report(name, value):
    print("CASE %s %s" % (name, json.dumps(value)), flush=True)


def main():
    master, log = sys.argv[1], sys.argv[2]
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    conf = SparkConf().setMaster(master).setAppName("hvd_bridge elastic spark test")
    for kv in sys.argv[3:]:
        k, v = kv.split("=", 1)
        conf.set(k, v)
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    import cloudpickle
    import torch
    import train_elastic
    cloudpickle.register_pickle_by_value(train_elastic)  # the ranks need not import it
    import hvd_bridge
    import hvd_bridge.spark as hs

    ref = hvd_bridge.run(train_elastic.train_model, kwargs=dict(epochs=1), np=4)[0]
    err = io.StringIO()
    t0 = time.time()
    got = hs.run_elastic(train_elastic.train_model, kwargs=dict(epochs=1, sleep=0.05,
                                                                  log_path=log),
                         num_proc=4, min_np=2, max_np=4, stdout=io.StringIO(), stderr=err,
                         warm=True)
    diff = max(float((got[0][k] - ref[k]).abs().max()) for k in ref)
    report("elastic", {"ranks": len(got), "diff": diff, "seconds": time.time() - t0,
                       "resets": [l for l in err.getvalue().splitlines()
                                  if l.startswith("hvd_bridge: reset")]})
    spark.stop()


if __name__ == "__main__":
    main()
