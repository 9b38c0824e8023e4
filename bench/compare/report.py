#!/usr/bin/env python3
"""report.py RESULTS.json [--doc docs/performance.md] [--plots docs/img]: turns compare.py's
samples into the Markdown tables of docs/performance.md (between <!-- compare:begin --> and
<!-- compare:end -->, the rest of the page is left alone) and PNG plots (gnuplot) of launch
time against the number of hosts and of Spark job time against the number of tasks.
Without --doc it prints the tables."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile


def mmm(v, fmt="%.0f"):
    if not v:
        return "failed"
    return (fmt + " (" + fmt + "–" + fmt + ")") % (statistics.median(v), min(v), max(v))


def pair_ratio(a, b):
    """Median, min and max of a[i] / b[i] over the runs both completed (runs alternate, so
    sample i of each system comes from the same round)."""
    r = [x / y for x, y in zip(a, b) if y]
    if not r:
        return "–"
    return "%.2f (%.2f–%.2f)" % (statistics.median(r), min(r), max(r))


def slope(xs, ys):
    """Least-squares slope of ys over xs."""
    if len(xs) < 2:
        return None
    mx, my = statistics.mean(xs), statistics.mean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else None


def params(samples, prefix):
    out = set()
    for k in samples:
        if k.startswith(prefix):
            out.add(int(k[len(prefix):].split("/")[0]))
    return sorted(out)


def tables(res):
    s, info, args = res["samples"], res["info"], res["args"]
    g = lambda k: s.get(k, [])
    L = []
    L.append("Run of %s on %s (%s); `bench/compare/run.sh` with `--runs %d`, %d s in all; load average "
             "%s at the start, %s at the end." % (info["date"], info["machine"], info["os"], args["runs"],
                                                   info["seconds"], info["load_start"], info["load_end"]))
    L.append("Versions: horovod %s (pip, no framework plugin), pyspark %s, Python %s, %s, %s, %s, "
             "hvd-bridge %s." % (info["horovod"], info["pyspark"], info["python"], info["java"], info["mpirun"],
                                 info["ssh"], info["hvd_bridge"]))
    L.append("Cells: median (min–max) of the timed runs; ratios are taken run by run (the two systems "
             "alternate, the order swapping every round) and summarised the same way.")
    L.append("")

    hosts = params(s, "launch/hvd/")
    if hosts:
        L.append("### 1. Launch: `mpirun -np H /bin/true` over H hosts through each agent")
        L.append("")
        L.append("| hosts | Horovod (mpirun_rsh + SparkTaskService), ms | hvd-bridge (hvd-rsh + hvd-task), ms "
                 "| Horovod / hvd-bridge |")
        L.append("|---|---|---|---|")
        for h in hosts:
            a, b = g("launch/horovod/%d" % h), g("launch/hvd/%d" % h)
            L.append("| %d | %s | %s | %s |" % (h, mmm(a), mmm(b), pair_ratio(a, b)))
        sl = []
        for sysname in ("horovod", "hvd"):
            xs = [h for h in hosts if g("launch/%s/%d" % (sysname, h))]
            ys = [statistics.median(g("launch/%s/%d" % (sysname, h))) for h in xs]
            sl.append(slope(xs, ys))
        if None not in sl:
            L.append("")
            L.append("Per-host launch cost (least-squares slope of the medians): **Horovod %.0f ms per host, "
                     "hvd-bridge %.0f ms per host**." % (sl[0], sl[1]))
        L.append("")

    ns = params(s, "spark/hvd/")
    if ns:
        L.append("### 2. A whole job on a local Spark cluster (local-cluster[2,4,1024]), N tasks = N ranks")
        L.append("")
        L.append("From the call to the last rank entering its function, and to the results being back at the "
                 "driver (the call returned), ms:")
        L.append("")
        L.append("| N | Horovod: last rank in entry | hvd-bridge: last rank in entry | Horovod: results "
                 "| hvd-bridge: results | Horovod / hvd-bridge (results) |")
        L.append("|---|---|---|---|---|---|")
        for n in ns:
            ae, be = g("spark/horovod/%d/entry" % n), g("spark/hvd/%d/entry" % n)
            ar, br = g("spark/horovod/%d/results" % n), g("spark/hvd/%d/results" % n)
            L.append("| %d | %s | %s | %s | %s | %s |" % (n, mmm(ae), mmm(be), mmm(ar), mmm(br), pair_ratio(ar, br)))
        L.append("")

    if g("rss/hvd/agent") or res["failures"].get("rss/hvd/agent"):
        L.append("### 3. Peak RSS and Pss, MiB (2 hosts, one rank each)")
        L.append("")
        L.append("RSS: peak resident set (VmHWM, or ru_maxrss); Pss: the largest proportional set size "
                 "sampled (`/proc/PID/smaps_rollup`: each shared page counted as 1/n for the n processes "
                 "mapping it), the memory a process really adds. A run in which any process was not sampled "
                 "failed, and is left out.")
        L.append("")
        L.append("| process | Horovod RSS | Horovod Pss | hvd-bridge RSS | hvd-bridge Pss | Horovod / hvd-bridge "
                 "(RSS) | Horovod / hvd-bridge (Pss) |")
        L.append("|---|---|---|---|---|---|---|")
        names = {"agent": "agent (mpirun_rsh / hvd-rsh), per host",
                 "task": "task service process (SparkTaskService's Python / hvd-task)",
                 "helper": "per-command helpers: the task process's children (Horovod: spawn middleman and its companions / keeper)",
                 "rank": "rank bootstrap (mpirun_exec_fn / hvd-exec), with the entry"}
        for k in ("agent", "task", "helper", "rank"):
            a = [x / 1024 for x in g("rss/horovod/%s" % k)]
            b = [x / 1024 for x in g("rss/hvd/%s" % k)]
            ap = [x / 1024 for x in g("pss/horovod/%s" % k)]
            bp = [x / 1024 for x in g("pss/hvd/%s" % k)]
            L.append("| %s | %s | %s | %s | %s | %s | %s |" % (names[k], mmm(a, "%.1f"), mmm(ap, "%.1f"),
                                                           mmm(b, "%.1f"), mmm(bp, "%.1f"), pair_ratio(a, b),
                                                           pair_ratio(ap, bp)))
        L.append("")

    mibs = params(s, "stream/hvd/")
    if mibs:
        m = mibs[0]
        L.append("### 4. Streamed command output: `head -c %d MiB /dev/zero` in a task service, to the caller" % m)
        L.append("")
        L.append("| path | MiB/s (whole call, connection set-up included) | hvd-bridge / it |")
        L.append("|---|---|---|")
        b = g("stream/hvd/%d" % m)
        for k, label in (("hvd", "hvd-rsh (AES-256-GCM frames)"),
                         ("horovod", "Horovod's task-service stream, rsh's steps, drained (no encryption)"),
                         ("ssh", "OpenSSH to a loopback sshd")):
            v = g("stream/%s/%d" % (k, m))
            if v or k in ("hvd", "horovod"):
                L.append("| %s | %s | %s |" % (label, mmm(v), "1" if k == "hvd" else pair_ratio(b, v)))
        L.append("")

    ns = params(s, "pyspark/hvd/")
    if ns:
        L.append("### 5. A Python function on a local Spark cluster (local-cluster[2,4,1024]), N tasks = N ranks")
        L.append("")
        L.append("`rank_fn` (returns its rank) through `horovod.spark.run(rank_fn, num_proc=N, use_mpi=True)` and "
                 "`hvd_bridge.spark.run(rank_fn, num_proc=N)`, from the call to its return with the N results at "
                 "the driver, ms:")
        L.append("")
        L.append("| N | Horovod | hvd-bridge | Horovod / hvd-bridge |")
        L.append("|---|---|---|---|")
        for n in ns:
            a, b = g("pyspark/horovod/%d/results" % n), g("pyspark/hvd/%d/results" % n)
            L.append("| %d | %s | %s | %s |" % (n, mmm(a), mmm(b), pair_ratio(a, b)))
        L.append("")
        n = ns[-1]
        r = [x / y for x, y in zip(g("pyspark/horovod/%d/results" % n), g("pyspark/hvd/%d/results" % n)) if y]
        if r:
            med = statistics.median(r)
            L.append("Target at least 5x faster than Horovod at N = %d: **%s** (median ratio %.1f, runs %.1f–%.1f)."
                     % (n, "met" if med >= 5 and min(r) >= 5 else "met on the median, not in every run"
                        if med >= 5 else "missed", med, min(r), max(r)))
            L.append("")
        pinfo = info.get("pyspark_app", {}).get("rss", {})
        if g("pyspark-rss/hvd/total"):
            procs = pinfo.get("rss_procs", {})
            L.append("Peak memory per process kind at N = %s, MiB: RSS is the kernel's peak (VmHWM; the driver: "
                     "largest VmRSS during the call), USS the largest private memory sampled (pages no other "
                     "process maps). %d calls of each; process counts per call in brackets, Horovod / hvd-bridge."
                     % (pinfo.get("rss_n", "?"), len(g("pyspark-rss/hvd/total"))))
            L.append("")
            L.append("| process | Horovod RSS | hvd-bridge RSS | Horovod / hvd-bridge (RSS) | Horovod USS "
                     "| hvd-bridge USS |")
            L.append("|---|---|---|---|---|---|")
            names = {"driver": "driver: the PySpark driver's Python (both systems imported)",
                     "driver_side": "driver side: what the call starts below the driver (mpirun, agents, "
                                    "Horovod's spawn interpreter / hvd-bridge's keeper), summed",
                     "worker": "executor: the Python worker running the task service, largest of N",
                     "task_helpers": "executor: the worker's helpers (Horovod's spawn interpreters / keeper "
                                     "and sh), summed over the job",
                     "orted": "orted (the same program)",
                     "rank": "rank: what orted starts (mpirun_exec_fn / hvd-exec and python -m "
                             "hvd_bridge._rank), largest of N",
                     "total": "everything the call started, summed"}
            for k in ("driver", "driver_side", "worker", "task_helpers", "orted", "rank", "total"):
                a = [x / 1024 for x in g("pyspark-rss/horovod/%s" % k)]
                b = [x / 1024 for x in g("pyspark-rss/hvd/%s" % k)]
                au = [x / 1024 for x in g("pyspark-uss/horovod/%s" % k)]
                bu = [x / 1024 for x in g("pyspark-uss/hvd/%s" % k)]
                cnt = ""
                if k in procs.get("hvd", {}).get("counts", {}):
                    cnt = " [%s / %s]" % (procs.get("horovod", {}).get("counts", {}).get(k, "?"),
                                          procs["hvd"]["counts"][k])
                L.append("| %s%s | %s | %s | %s | %s | %s |" % (names[k], cnt, mmm(a, "%.1f"), mmm(b, "%.1f"),
                                                               pair_ratio(a, b), mmm(au, "%.1f"), mmm(bu, "%.1f")))
            L.append("")

    if res["failures"]:
        L.append("Failed runs: " + "; ".join("%s: %d" % (k, len(v)) for k, v in sorted(res["failures"].items())))
        L.append("")
    return "\n".join(L)


def plot(res, outdir):
    s = res["samples"]
    os.makedirs(outdir, exist_ok=True)
    made = []
    with tempfile.TemporaryDirectory() as d:
        for name, prefix, xs_label, suffix, title in (
                ("compare-launch.png", "launch", "hosts (H)", "", "mpirun -np H /bin/true through the agent"),
                ("compare-spark.png", "spark", "Spark tasks = ranks (N)", "/results",
                 "whole job on a local Spark cluster, call to results"),
                ("compare-pyspark.png", "pyspark", "Spark tasks = ranks (N)", "/results",
                 "a Python function on a local Spark cluster, call to results")):
            xs = params(s, "%s/hvd/" % prefix)
            if not xs:
                continue
            data = os.path.join(d, name + ".dat")
            with open(data, "w") as f:
                for x in xs:
                    row = [str(x)]
                    for sysname in ("horovod", "hvd"):
                        v = s.get("%s/%s/%d%s" % (prefix, sysname, x, suffix), [])
                        row += ["%.1f %.1f %.1f" % (statistics.median(v), min(v), max(v)) if v else "NaN NaN NaN"]
                    f.write(" ".join(row) + "\n")
            gp = """set terminal pngcairo size 800,480 font "sans,11"
set output "%s"
set title "%s"
set xlabel "%s"
set ylabel "ms (median, bars: min-max)"
set key top left
set grid
set xtics (%s)
set yrange [0:*]
plot "%s" using 1:2:3:4 with yerrorlines lw 2 title "Horovod 0.28.1", \\
     "" using 1:5:6:7 with yerrorlines lw 2 title "hvd-bridge"
""" % (os.path.join(outdir, name), title, xs_label, ", ".join(map(str, xs)), data)
            r = subprocess.run(["gnuplot"], input=gp.encode(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if r.returncode != 0:
                print("report: gnuplot failed: %s" % r.stdout.decode()[-500:], file=sys.stderr)
                continue
            made.append(name)
    return made


def write_doc(doc, body, plots, plot_rel):
    with open(doc) as f:
        text = f.read()
    links = "\n".join("![%s](%s)" % (p[:-4], os.path.join(plot_rel, p)) for p in plots)
    block = "<!-- compare:begin -->\n" + body.rstrip() + ("\n\n" + links if links else "") + "\n<!-- compare:end -->"
    if "<!-- compare:begin -->" in text:
        text = re.sub(r"<!-- compare:begin -->.*?<!-- compare:end -->", lambda m: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    with open(doc, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("--doc", default="")
    ap.add_argument("--plots", default="")
    a = ap.parse_args()
    with open(a.json) as f:
        res = json.load(f)
    body = tables(res)
    plots = plot(res, a.plots) if a.plots else []
    if a.doc:
        write_doc(a.doc, body, plots, os.path.relpath(a.plots, os.path.dirname(os.path.abspath(a.doc))) if plots else "")
        print("report: wrote %s%s" % (a.doc, (" and " + ", ".join(plots)) if plots else ""))
    else:
        print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
