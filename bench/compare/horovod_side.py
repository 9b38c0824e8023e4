"""Horovod-on-Spark's launch services outside Spark, for bench/compare/compare.py.

Run with the virtual environment's python, where horovod==0.28.1 is installed:

  python horovod_side.py driver --np H --out FILE
      a SparkDriverService for H tasks (its function returns time.time()); writes FILE (JSON:
      the base64 blobs mpirun_rsh and mpirun_exec_fn take on their command lines, and the
      secret as Horovod puts it into _HOROVOD_SECRET_KEY), then serves until stdin closes.
  python horovod_side.py task --index I --host-hash NAME --driver-file FILE
      a SparkTaskService registered under host hash NAME, as horovod.spark's _task_fn does in
      a Spark Python worker: it waits for its one command (orted, from mpirun_rsh), waits for
      the command's end, prints "done <fn result>" and serves until stdin closes.
  python horovod_side.py stream --driver-file FILE --host-hash NAME --bytes N
      streams the output of `head -c N /dev/zero` run in that host's task service to this
      process (the steps of horovod.spark.driver.rsh with background=False, waiting for the
      stream to drain) and prints the bytes received.

These are Horovod's own classes and messages, unchanged; only the Spark task around them is
left out (the comparison of whole Spark jobs is spark_app.py).
"""
import argparse
import json
import os
import sys
import time

from horovod.runner.common.util import codec, secret, timeout
from horovod.runner.common.util import settings as hvd_settings
from horovod.spark.driver import driver_service
from horovod.spark.task import task_service


def trivial():
    return time.time()


def wait_stdin_eof():
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except OSError:
        pass


def driver(a):
    key = secret.make_secret_key()
    svc = driver_service.SparkDriverService(a.np, a.np, trivial, (), {}, key, None)
    settings = hvd_settings.BaseSettings(num_proc=a.np, verbose=0, key=None)
    blob = {
        "addrs": codec.dumps_base64(svc.addresses()),
        "settings": codec.dumps_base64(settings),
        "key": codec.dumps_base64(key),
    }
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(blob, f)
    os.rename(tmp, a.out)
    wait_stdin_eof()
    svc.shutdown()


def load(path):
    with open(path) as f:
        d = json.load(f)
    return codec.loads_base64(d["addrs"]), codec.loads_base64(d["key"]), d


def task(a):
    addrs, key, _ = load(a.driver_file)
    os.environ["HOROVOD_HOSTNAME"] = a.host_hash  # as _task_fn does: the ranks read it
    svc = task_service.SparkTaskService(a.index, key, None, None, 0)
    client = driver_service.SparkDriverClient(addrs, key, 0)
    client.register_task(a.index, svc.addresses(), a.host_hash)
    print("registered", flush=True)
    svc.wait_for_command_start(timeout.Timeout(a.timeout, "no command within {timeout} s"))
    svc.wait_for_command_termination()
    print("done %r exit %s" % (svc.fn_result(), svc.command_exit_code()), flush=True)
    wait_stdin_eof()
    svc.shutdown()


class Counter:
    """A text stream that counts the NUL characters written to it (the command's bytes; the
    task service adds a "[index]<stdout>:" prefix of its own)."""

    def __init__(self):
        self.n = 0

    def write(self, s):
        self.n += s.count("\0")

    def flush(self):
        pass


def stream(a):
    """Horovod's rsh(..., background=False) step by step (horovod/spark/driver/rsh.py), plus
    a join of the stdout stream thread at the end: rsh itself returns once the exit code is
    known, without waiting for that thread, so a caller that counts (or exits) right after it
    loses the output still in flight (seen: 65-155 MB of 256 MiB)."""
    addrs, key, _ = load(a.driver_file)
    driver_client = driver_service.SparkDriverClient(addrs, key, verbose=0)
    index = driver_client.task_host_hash_indices(a.host_hash)[0]
    task_client = task_service.SparkTaskClient(index, driver_client.all_task_addresses(index), key, verbose=0)
    out = Counter()
    out_thread, _ = task_client.stream_command_output(out, None)
    task_client.run_command("head -c %d /dev/zero" % a.bytes, {}, capture_stdout=True, capture_stderr=False)
    rc = task_client.wait_for_command_exit_code()
    out_thread.join(a.timeout)
    print("bytes %d rc %s" % (out.n, rc), flush=True)
    return 0 if rc == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("driver")
    d.add_argument("--np", type=int, required=True)
    d.add_argument("--out", required=True)
    t = sub.add_parser("task")
    t.add_argument("--index", type=int, required=True)
    t.add_argument("--host-hash", required=True)
    t.add_argument("--driver-file", required=True)
    t.add_argument("--timeout", type=int, default=120)
    s = sub.add_parser("stream")
    s.add_argument("--host-hash", required=True)
    s.add_argument("--driver-file", required=True)
    s.add_argument("--bytes", type=int, required=True)
    s.add_argument("--timeout", type=int, default=300, help="for the stream to drain after the exit")
    a = ap.parse_args()
    return {"driver": driver, "task": task, "stream": stream}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
