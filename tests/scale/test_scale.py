#!/usr/bin/env python3
"""Scale tests: many fake hosts and tasks on this machine, Open MPI's tree spawn included.

    test_scale.py --bin DIR --probe-lib LIB CASE...

With more than 64 hosts (routed_radix), mpirun starts 64 orteds itself and those orteds start
the others by running hvd-rsh inside their task services, with the environment a task service
gives its command. These cases run real jobs past that point, sized to take well under 90 s on
2 shared cores; the big sizes (256 hosts, 1024 ranks) are in bench/launch/scale_bench.py.

  local_128_on_66   hvd-driver run -np 128 --local 66: the probe plan (66 probes, not 16256),
                    tree spawn (agent calls made by orteds), every rank inside the lowest task
                    of its host, results of all 128 ranks
  serve_100_hosts   hvd-driver serve -np 100, 100 task services started here (as on executors)
                    and the user's own mpirun with the env file: 36 orteds started by orteds
  fd_limit          a driver whose open-file limit is below what its tasks may need says so

Every process of a case carries a mark in its environment; nothing may be left afterwards.
"""
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
import json

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import hvdtest  # noqa: E402
from hvdtest import check, run  # noqa: E402

ARGS = None


def driver(*args):
    return [os.path.join(ARGS.bin, "hvd-driver")] + list(args)


def agent_calls(text):
    """(calls by mpirun, calls by orteds) from hvd-rsh --verbose lines: an orted's agent call
    carries its parent's URI, whose vpid is not 0."""
    parents = re.findall(r'orte_parent_uri "\d+\.(\d+);', text)
    return sum(1 for p in parents if p == "0"), sum(1 for p in parents if p != "0")


def check_ranks(res, np_, hosts):
    ranks = res["ranks"]
    check([r["rank"] for r in ranks] == list(range(np_)), "results in rank order")
    tasks, lowest = set(), {}
    for r in ranks:
        check(r["reported"] and r["status"] == 0, "rank %d succeeded: %s" % (r["rank"], r))
        info = hvdtest.parse_kv(r["result_text"])
        check(info["host"] == r["host_hash"], "rank %d: HOROVOD_HOSTNAME is its host hash" % r["rank"])
        tasks.add(int(info["task"]))
        lowest.setdefault(info["host"], set()).add(int(info["ancestor_task"]))
    check(tasks == set(range(np_)), "every task has one rank: %d distinct" % len(tasks))
    check(len(lowest) == hosts, "%d hosts, got %d" % (hosts, len(lowest)))
    by_host = {}
    for r in ranks:
        by_host.setdefault(r["host_hash"], []).append(r["task"])
    for h, anc in lowest.items():
        check(anc == {min(by_host[h])}, "host %s: every rank runs inside its lowest task %d, found %s"
              % (h, min(by_host[h]), sorted(anc)))


def test_local_128_on_66():
    mark = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "results.json")
        env = hvdtest.marked_env(mark, ARGS.bin, HVD_RSH_VERBOSE="1")
        t0 = time.time()
        rc, so, se, dt = run(driver("run", "-np", "128", "--local", "66", "--verbose", "--results-json", out,
                                    "--entry", ARGS.probe_lib + ":probe_entry"), env, timeout=240, cwd=d)
        check(rc == 0, "hvd-driver exited %d:\n%s" % (rc, se[-3000:]))
        m = re.search(r"probing (\d+) pair\(s\) of tasks for 128 task\(s\) on 66 host\(s\), 1 network", se)
        check(m and m.group(1) == "66", "a ring of 66 hosts is probed, not every pair of tasks")
        check("interfaces that connect every pair of hosts: lo" in se, "lo is among the interfaces")
        by_mpirun, by_orted = agent_calls(so + se)
        check(by_mpirun + by_orted == 66, "one agent call per host: %d + %d" % (by_mpirun, by_orted))
        check(by_orted >= 1, "orteds launched hosts themselves (tree spawn): %d" % by_orted)
        with open(out) as f:
            check_ranks(json.load(f), 128, 66)
        print("  128 ranks on 66 hosts: %.1f s, %d orteds started by orteds" % (time.time() - t0, by_orted))
    hvdtest.assert_no_leftovers(mark)


def test_serve_100_hosts():
    mark = uuid.uuid4().hex
    n = 100
    with tempfile.TemporaryDirectory() as d:
        env_file = os.path.join(d, "job.env")
        env = hvdtest.marked_env(mark, ARGS.bin)
        errf = open(os.path.join(d, "serve.err"), "w+b")
        srv = hvdtest.start_driver(ARGS.bin, ["serve", "-np", str(n), "--env-file", env_file, "--entry",
                                              ARGS.probe_lib + ":probe_entry"], env, d, stderr=errf)
        tasks = []
        try:
            # Fake hosts of one machine: as hvd-driver --local does (launcher_local.c), no
            # topology segment at a hole of each orted's address space (1 orted in ~1000 crashed).
            tenv = dict(env, HVD_RSH_VERBOSE="1", OMPI_MCA_rtc_hwloc_vmhole="none",
                        **hvdtest.task_hint(srv, "hvd-driver serve", errfile=errf))
            for i in range(n):
                tmp = os.path.join(d, "tmp%d" % i)
                os.mkdir(tmp)
                tasks.append(hvdtest.start_task(ARGS.bin, i, dict(tenv, TMPDIR=tmp), "scale-host-%03d" % i,
                                                start_timeout=120, cwd=d))
            hvdtest.wait_for(lambda: os.path.exists(env_file) or srv.poll() is not None, 120, "the env file")
            check(os.path.exists(env_file), "serve wrote the env file")
            vals = hvdtest.read_env_file(env_file)
            # As a user would: only what the env file says, and the agent's verbose switch.
            menv = dict(env, HVD_DRIVER_ADDRS=vals["HVD_DRIVER_ADDRS"], HVD_SECRET_FILE=vals["HVD_SECRET_FILE"],
                        HVD_RSH_VERBOSE="1")
            cmd = ["mpirun", "--allow-run-as-root", "-np", vals["HVD_NP"], "-H", vals["HVD_HOSTS"],
                   "-mca", "plm_rsh_agent", vals["HVD_RSH"]] + vals["HVD_MPIRUN_ARGS"].split() + \
                  ["-mca", "btl_tcp_if_include", vals["HVD_IFACES"], "-mca", "oob_tcp_if_include",
                   vals["HVD_IFACES"], vals["HVD_EXEC"]]
            rc, so, se, dt = run(cmd, menv, timeout=240, cwd=d)
            check(rc == 0, "mpirun exited %d:\n%s" % (rc, (so + se)[-3000:]))
            by_mpirun, by_orted = agent_calls(so + se)
            check((by_mpirun, by_orted) == (64, 36), "64 orteds started by mpirun and 36 by orteds, got %d and %d"
                  % (by_mpirun, by_orted))
            srv.wait(timeout=60)
            errf.seek(0)
            text = errf.read().decode(errors="replace")
            check(srv.returncode == 0, "serve exits 0 once every rank reported:\n%s" % text[-2000:])
            check(len(re.findall(r"^hvd-driver: \d+ +\d+ +scale-host-\d+ +0 ", text, re.M)) == n,
                  "serve's table lists %d ranks with status 0" % n)
            print("  mpirun over 100 hosts: %.1f s" % dt)
        finally:
            for t in tasks:
                hvdtest.stop(t, 30)
            hvdtest.stop(srv, 10)
            errf.close()
    hvdtest.assert_no_leftovers(mark)


def test_fd_limit():
    import shutil
    if not shutil.which("prlimit"):
        raise hvdtest.Skip("prlimit is not installed")
    mark = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as d:
        rc, so, se, dt = run(["prlimit", "--nofile=100:100"] + driver("run", "-np", "8", "--local", "4", "--",
                                                                       "true"),
                             hvdtest.marked_env(mark, ARGS.bin), timeout=120, cwd=d)
        check(rc == 0, "the job still runs with 100 files: %d\n%s" % (rc, se[-2000:]))
        check("warning: this process may open 100 files (ulimit -n) and a driver of 8 tasks may need up to "
              "288 at once" in se, "the driver says the limit is low:\n" + se[-2000:])
        # With room below the hard limit, hvd-driver raises the soft limit instead of warning.
        rc, so, se, dt = run(["prlimit", "--nofile=100:%d" % (8 * 4 + 256)] +
                             driver("run", "-np", "8", "--local", "4", "--", "sh", "-c", "ulimit -n >&2"),
                             hvdtest.marked_env(mark, ARGS.bin), timeout=120, cwd=d)
        check(rc == 0 and "warning: this process may open" not in se, "no warning after raising:\n" + se[-2000:])
    hvdtest.assert_no_leftovers(mark)


CASES = hvdtest.cases_in(globals())


def main():
    global ARGS
    ap = hvdtest.arg_parser("--bin", "--probe-lib")
    ap.add_argument("cases", nargs="*")
    ARGS = ap.parse_args()
    return hvdtest.run_cases(CASES, ARGS.cases)


if __name__ == "__main__":
    sys.exit(main())
