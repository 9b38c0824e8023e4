#!/usr/bin/env python3
"""hvd_bridge.spark.run on a local Spark cluster: the function runs on 4 ranks inside the
executors, and its return values come back in rank order.

    pip install . pyspark            # from the repository root (docs/python.md)
    python examples/python/spark_hello.py
"""
import os
import sys

from pyspark.sql import SparkSession

import hvd_bridge.spark


def hello(greeting, punctuation="!"):
    import os
    import socket
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    print("%s from rank %d of %d on %s%s" % (greeting, rank, size, socket.gethostname(),
                                             punctuation))
    return rank * rank


def main():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(os.environ.get("MASTER", "local-cluster[2,2,1024]"))
             .appName("hvd_bridge hello").getOrCreate())
    # With local-cluster, give the executors a moment: a barrier stage needs all 4 slots.
    import time
    for _ in range(120):
        if spark.sparkContext.defaultParallelism >= 4:
            break
        time.sleep(0.5)
    squares = hvd_bridge.spark.run(hello, args=("Hello",), kwargs={"punctuation": "."},
                                   num_proc=4)
    print("results in rank order:", squares)
    spark.stop()


if __name__ == "__main__":
    main()
