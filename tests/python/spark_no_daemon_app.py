#!/usr/bin/env python3
"""The PySpark application of test_spark_no_daemon.py: hvd_bridge.spark.run in local mode
(local[NUM_PROC]) where the executors' PATH (spark.executorEnv.PATH, given by the test) holds no
orted; prints "CASE no_daemon <json>": what run raised, and how long it took.

  spark_no_daemon_app.py NUM_PROC [conf=value ...]
"""
import io
import json
import sys
import time


def never_runs():
    return "a rank ran"


def main():
    num_proc = int(sys.argv[1])
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    conf = SparkConf().setMaster("local[%d]" % num_proc).setAppName("hvd_bridge no-orted test")
    for kv in sys.argv[2:]:
        k, v = kv.split("=", 1)
        conf.set(k, v)
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    import hvd_bridge
    import hvd_bridge.spark as hs

    t0 = time.time()
    case = {"raised": False}
    try:
        # A start timeout far above the time the check takes: a check that does not fire
        # shows as a slow failure, not as a hang.
        case["values"] = hs.run(never_runs, num_proc=num_proc, start_timeout=90,
                                stdout=io.StringIO(), stderr=io.StringIO())
    except hvd_bridge.JobError as e:
        case = {"raised": True, "type": type(e).__name__, "message": str(e)}
    except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
        case = {"raised": True, "type": type(e).__name__, "message": str(e)[-3000:]}
    case["seconds"] = time.time() - t0
    print("CASE no_daemon %s" % json.dumps(case), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
