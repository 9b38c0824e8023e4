#!/usr/bin/env python3
"""proc_sampler.py ROOT_PID [ROOT_PID ...] [--interval S]: samples the memory of the processes
below the roots (pyspark_app.py starts it around one call and classifies what it prints).
It takes one sample, prints "ready" on stdout, and then, until its stdin closes, walks the
roots' process trees every --interval seconds (through /proc/PID/task/*/children, so only
those trees are read, not all of /proc). Per process image it keeps: the parent, the command
line, the largest VmHWM read (the kernel's own peak, so a peak between two samples still
counts), the largest VmRSS read, the largest USS read (Private_Clean + Private_Dirty of
/proc/PID/smaps_rollup: the pages no other process maps; read when VmRSS is at its highest so
far, as that walk costs more than the rest of a sample), the number of samples that saw it
and the first one that did (0: it existed before the call). Then it prints one JSON object
{"samples": n, "procs": {pid: {...}}} on stdout.

Why USS beside RSS: a process forked without exec (PySpark's workers, hvd-bridge's keeper)
maps its parent's pages, and RSS counts every one of them in both; USS counts what the
process adds. A process that lived less than one interval may be missed; the caller checks
that every process it expects was seen and fails the run otherwise (a missed process is never
a zero). The roots themselves are sampled too.
"""
import argparse
import json
import os
import sys
import threading


def read_status(pid):
    """(VmHWM, VmRSS) in KiB, or None when the process is gone or a zombie (no memory)."""
    hwm = rss = None
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
    except (OSError, ValueError):
        return None
    return (hwm, rss) if hwm is not None and rss is not None else None


def uss(pid):
    """Private_Clean + Private_Dirty of pid in KiB, or None."""
    total = 0
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total += int(line.split()[1])
    except (OSError, ValueError):
        return None
    return total


def children(pid):
    """Direct children of pid, whichever of its threads forked them."""
    out = []
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                out += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            pass
    return out


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return " ".join(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
    except OSError:
        return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roots", type=int, nargs="+")
    ap.add_argument("--interval", type=float, default=0.005)
    a = ap.parse_args()
    skip = {os.getpid()}
    procs = {}
    stop = threading.Event()
    n = [0]

    def sample():
        todo = [(r, None) for r in a.roots]
        while todo:
            pid, parent = todo.pop()
            if pid in skip:
                continue
            st = read_status(pid)
            kids = children(pid)
            if st is not None:
                cmd = cmdline(pid)
                p = procs.get(pid)
                # A new image (exec after fork: another command line, or a peak lower than
                # the one kept, as exec starts a new address space) starts afresh; what the
                # forked copy showed before its exec is the parent's memory, not this program's.
                if p is None or p["cmd"] != cmd or st[0] < p["hwm"]:
                    p = procs[pid] = {"ppid": parent, "cmd": cmd, "hwm": 0, "rss": 0, "uss": 0, "seen": 0,
                                      "first": n[0]}
                p["hwm"] = max(p["hwm"], st[0])
                if st[1] >= p["rss"]:  # smaps_rollup costs a page-table walk: read at RSS highs only
                    p["uss"] = max(p["uss"], uss(pid) or 0)
                p["rss"] = max(p["rss"], st[1])
                p["seen"] += 1
            todo += [(k, pid) for k in kids]
        n[0] += 1

    def watch_stdin():
        sys.stdin.read()
        stop.set()

    sample()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    threading.Thread(target=watch_stdin, daemon=True).start()
    while not stop.is_set():
        sample()
        stop.wait(a.interval)
    sample()
    json.dump({"samples": n[0], "procs": {str(k): v for k, v in procs.items()}}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
