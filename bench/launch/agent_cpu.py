#!/usr/bin/env python3
"""Where one hvd-rsh call spends its CPU (docs/performance.md, "Launch through hvd-rsh").

    python3 bench/launch/agent_cpu.py [--bin build/bin] [--calls 40] [--record DIR]

Starts `hvd-driver serve` and --calls task services on as many fake hosts, then calls
`hvd-rsh HOST true` once per host (a task runs one command per job), under `perf stat -e
task-clock`: the CPU time of hvd-rsh itself (the command runs in the task service). Calls
alternate between the environment as it is and OPENSSL_CONF=/dev/null (OpenSSL reads no
configuration file), and the same for `/bin/true` and `hvd-rsh --help` (loading the
program and its libraries, nothing else) as floors. Prints the median and min-max of each.
With --record DIR, the first four hvd-rsh calls also run under `perf record` (DIR/agent.N.data)
and the share of each library in their samples is printed.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
import hvdtest  # noqa: E402


RECORDED = 4  # the first calls, under perf record with --record


def task_clock(cmd, env):
    """(wall ms, task-clock ms) of cmd under perf stat."""
    t0 = time.perf_counter()
    r = subprocess.run(["perf", "stat", "-x,", "-e", "task-clock"] + cmd, env=env,
                       capture_output=True, text=True)
    wall = (time.perf_counter() - t0) * 1000
    hvdtest.check(r.returncode == 0, "%s failed: %s" % (" ".join(cmd), r.stderr[-500:]))
    line = [l for l in r.stderr.splitlines() if "task-clock" in l][0]
    hvdtest.check(line.split(",")[0].replace(".", "", 1).isdigit(),
                  "perf cannot count task-clock here: " + line)
    return wall, float(line.split(",")[0])


def shares(path):
    """{library: percent of samples} of a perf.data file."""
    out = subprocess.run(["perf", "report", "-i", path, "--no-children", "--sort", "dso",
                          "--stdio"], capture_output=True, text=True).stdout
    got = {}
    for line in out.splitlines():
        cols = line.split()
        if len(cols) == 2 and cols[0].endswith("%"):
            got[cols[1]] = float(cols[0][:-1])
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"), type=os.path.abspath)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--record", metavar="DIR")
    args = ap.parse_args()
    mark = uuid.uuid4().hex
    rsh = os.path.join(args.bin, "hvd-rsh")
    with tempfile.TemporaryDirectory() as d:
        envf = os.path.join(d, "job.env")
        env = hvdtest.marked_env(mark, args.bin)
        srv = hvdtest.start_driver(args.bin, ["serve", "-np", str(args.calls), "--env-file", envf,
                                              "--", "true"], env, d)
        tasks = []
        try:
            tenv = dict(env, **hvdtest.task_hint(srv, "hvd-driver serve"))
            tasks = [hvdtest.start_task(args.bin, i, tenv, "agentcpu-%d" % i) for i in range(args.calls)]
            hvdtest.wait_for(lambda: os.path.exists(envf), 60, "the env file")
            time.sleep(0.5)
            vals = hvdtest.read_env_file(envf)
            base = dict(env, HVD_DRIVER_ADDRS=vals["HVD_DRIVER_ADDRS"],
                        HVD_SECRET_FILE=vals["HVD_SECRET_FILE"])
            rows = {}
            for i in range(args.calls):
                conf = "OPENSSL_CONF=/dev/null" if i % 2 else "as it is"
                e = dict(base, OPENSSL_CONF="/dev/null") if i % 2 else base
                host = "agentcpu-%d" % i
                if args.record and i < RECORDED:
                    os.makedirs(args.record, exist_ok=True)
                    subprocess.run(["perf", "record", "-q", "-F", "25000", "-o",
                                    os.path.join(args.record, "agent.%d.data" % i), rsh, host,
                                    "true"], env=e, check=True, capture_output=True)
                    continue
                for what, cmd in (("hvd-rsh HOST true", [rsh, host, "true"]),
                                  ("hvd-rsh --help", [rsh, "--help"]),
                                  ("/bin/true", ["/bin/true"])):
                    rows.setdefault((what, conf), []).append(task_clock(cmd, e))
        finally:
            hvdtest.stop(srv, 20, signal.SIGTERM)
            for t in tasks:
                hvdtest.stop(t, 20)
        hvdtest.assert_no_leftovers(mark)
    print("| program | OpenSSL configuration | CPU (task-clock) ms | wall ms (under perf) |")
    print("|---|---|---|---|")
    for (what, conf), v in rows.items():
        c = sorted(x[1] for x in v)
        w = sorted(x[0] for x in v)
        print("| %s | %s | %.2f (%.2f-%.2f) | %.1f (%.1f-%.1f) |" % (
            what, conf, statistics.median(c), c[0], c[-1], statistics.median(w), w[0], w[-1]))
    if args.record:
        libs, n = {}, min(RECORDED, args.calls)
        for i in range(n):
            for k, v in shares(os.path.join(args.record, "agent.%d.data" % i)).items():
                libs[k] = libs.get(k, 0) + v / n
        print("hvd-rsh HOST true, share of CPU samples by library (%d calls): " % n +
              ", ".join("%s %.0f%%" % (k, v) for k, v in sorted(libs.items(), key=lambda kv: -kv[1])
                        if v >= 0.5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
