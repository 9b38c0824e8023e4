#!/usr/bin/env python3
"""Launch cost of mpirun through hvd-rsh's ssh mode vs OpenSSH's ssh (docs/performance.md,
"ssh transport").

    ssh_agent_bench.py --bin BUILD/bin [--runs 15] [--sshd-script scripts/sshd-test-env.sh]

Two fake ssh hosts on this machine (127.0.0.2 and 127.0.0.3, one real sshd each, the same
port; tests/ssh/fake_ssh_hosts.py). Each run is

    mpirun -np 2 -H 127.0.0.2:1,127.0.0.3:1 -mca plm_rsh_agent AGENT \\
           -mca oob_tcp_if_include lo -mca btl_tcp_if_include lo --stdin none /bin/true

with AGENT either
    hvd-rsh -p PORT -i KEY -o UserKnownHostsFile=FILE   (libssh2, host keys checked), or
    ssh -F CONFIG   (OpenSSH; StrictHostKeyChecking no, UserKnownHostsFile /dev/null,
                     BatchMode yes, the same key),
against the same sshds, in the same process, alternating run by run (after one warm-up run
each). A third agent, "ssh-c25519", is the same ssh with `KexAlgorithms curve25519-sha256`,
the key exchange libssh2 1.10 uses (OpenSSH 9's default, sntrup761x25519, costs more CPU).
It also times one bare agent call (`AGENT 127.0.0.2 true`) the same way. Prints the median,
min and max wall time of each and the ratios of the medians (hvd-rsh / ssh, and hvd-rsh /
ssh-c25519).
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
sys.path.insert(0, os.path.join(ROOT, "tests", "ssh"))
import hvdtest  # noqa: E402
from fake_ssh_hosts import FakeSshHosts, SshdUnavailable  # noqa: E402


def timed(cmd, env):
    """Milliseconds cmd took; ends the script when it fails."""
    rc, out, _, dt = hvdtest.run(cmd, env, timeout=120, merge=True)
    if rc != 0:
        raise SystemExit("failed (%d): %s\n%s" % (rc, " ".join(cmd), out))
    return dt * 1000.0


def alternate(cases, runs, env):
    """cases: [(name, argv)]; one warm-up each, then `runs` rounds, alternating the order."""
    times = {name: [] for name, _ in cases}
    for name, cmd in cases:
        timed(cmd, env)
    for i in range(runs):
        order = cases if i % 2 == 0 else list(reversed(cases))
        for name, cmd in order:
            times[name].append(timed(cmd, env))
    return times


def summary(title, times, a, others):
    lines = ["%s (%d runs each)" % (title, len(times[a])),
             "| agent | median ms | min ms | max ms |", "|---|---|---|---|"]
    for name in [a] + others:
        t = times[name]
        lines.append("| %s | %.0f | %.0f | %.0f |" % (name, statistics.median(t), min(t), max(t)))
    for b in others:
        lines.append("ratio of medians %s / %s: %.2f" % (a, b, statistics.median(times[a]) /
                                                         statistics.median(times[b])))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the build's bin directory (hvd-rsh)")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--sshd-script", default=os.path.join(ROOT, "scripts", "sshd-test-env.sh"))
    a = ap.parse_args()
    if a.runs < 5:
        raise SystemExit("--runs must be at least 5")
    for tool in ("mpirun", "ssh"):
        if not shutil.which(tool):
            raise SystemExit("%s not found" % tool)
    rsh = os.path.join(os.path.abspath(a.bin), "hvd-rsh")
    env = hvdtest.marked_env(None)
    work = tempfile.mkdtemp(prefix="hvd-ssh-bench.")
    hosts = FakeSshHosts(a.sshd_script, work)
    try:
        try:
            hosts.start()
        except SshdUnavailable as e:
            hvdtest.skip(str(e))
        cfg = os.path.join(work, "ssh_config")
        hosts.ssh_config(cfg)
        cfg_c = os.path.join(work, "ssh_config_c25519")
        hosts.ssh_config(cfg_c)
        with open(cfg_c, "a") as f:
            f.write("  KexAlgorithms curve25519-sha256\n")
        agents = [("hvd-rsh", "%s -p %d -i %s -o UserKnownHostsFile=%s" % (rsh, hosts.port, hosts.key,
                                                                          hosts.known_hosts)),
                  ("ssh", "ssh -F %s" % cfg), ("ssh-c25519", "ssh -F %s" % cfg_c)]
        mpirun = ["mpirun", "-np", "2", "-H", "127.0.0.2:1,127.0.0.3:1", "-mca", "oob_tcp_if_include", "lo",
                  "-mca", "btl_tcp_if_include", "lo", "--stdin", "none"]
        jobs = [(name, mpirun + ["-mca", "plm_rsh_agent", agent, "/bin/true"]) for name, agent in agents]
        bare = [(name, agent.split() + ["127.0.0.2", "true"]) for name, agent in agents]
        print("load average before: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
        t_jobs = alternate(jobs, a.runs, env)
        t_bare = alternate(bare, a.runs, env)
        print("load average after: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
        print(summary("mpirun -np 2 /bin/true on 2 fake ssh hosts", t_jobs, "hvd-rsh", ["ssh", "ssh-c25519"]))
        print()
        print(summary("one agent call, `AGENT 127.0.0.2 true`", t_bare, "hvd-rsh", ["ssh", "ssh-c25519"]))
        return 0
    finally:
        hosts.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
