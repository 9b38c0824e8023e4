#!/usr/bin/env python3
"""report.py RESULTS.json [--doc docs/performance.md] [--plots docs/img]: turns torch_bench.py's
samples into the Markdown tables of docs/performance.md's "PyTorch" section (between
<!-- torch:begin --> and <!-- torch:end -->; the rest of the page is left alone) and two PNG
plots (gnuplot): allreduce bandwidth against size, and step time against np. Without --doc it
prints the tables."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

LABEL = {"hvd": "hvd_bridge.torch", "ddp": "DDP / gloo", "horovod": "horovod.torch 0.28.1"}
GBYTE = 1e9


def mmm(v, fmt="%.1f"):
    if not v:
        return "failed"
    return (fmt + " [" + fmt + "–" + fmt + "]") % (statistics.median(v), min(v), max(v))


def ratios(a, b):
    """a[i] / b[i] over the runs both completed (sides alternate, so sample i of each comes
    from the same round; a failed run is None)."""
    return [x / y for x, y in zip(a, b) if x is not None and y]


def mr(r):
    return "%.2f [%.2f–%.2f]" % (statistics.median(r), min(r), max(r)) if r else "–"


def size_name(b):
    return "%d MiB" % (b >> 20) if b >= 1 << 20 else "%d KiB" % (b >> 10)


def gbs(size, ms_list):
    return [None if ms is None else size / (ms / 1000) / GBYTE for ms in ms_list]


def ok(v):
    return [x for x in v if x is not None]


def tables(res):
    s, info, cfg, sides = res["samples"], res["info"], res["cfg"], res["sides"]
    nps = sorted({int(k.split("/")[2]) for k in s})
    g = lambda k: [x for x in s.get(k, []) if x is not None]
    gp = lambda k: s.get(k, [])  # with None for failed runs: keeps the sides' runs paired
    L = []
    L.append("Run of %s on %s; torch %s (CPU), Python %s, %s, hvd-bridge %s; `bench/torch/run.sh` with "
             "`--runs %d`, %d s in all. Load average (1, 5, 15 min) %s at the start, %s at the end, after each "
             "round: %s." % (info["date"], info["machine"], info["torch"], info["python"], info["mpirun"],
                             info["hvd_bridge"], res["args"]["runs"], info["seconds"], info["load_start"],
                             info["load_end"], ", ".join(str(x[0]) for x in info["loads"])))
    L.append("Each cell: median [min–max] over the runs of the run's own median (steps: the slowest rank's "
             "step; allreduce: the slowest rank's median call); ratios are taken run by run (the sides "
             "alternate, the order rotating every round).")
    if res["args"].get("hvd_env"):
        L.append("The hvd_bridge side ran with %s." % ", ".join("`%s=%s`" % kv for kv in sorted(res["args"]["hvd_env"].items())))
    if "horovod" not in sides:
        L.append("")
        L.append("No horovod.torch column: %s" % (info.get("horovod_note") or "no --horovod-python given."))
    L.append("")
    L.append("#### Training step, ms (%d timed steps after %d warm-up steps, SGD; %s)" % (
        cfg["steps"], cfg["warmup"], "; ".join("%s: MLP %s with ReLU, batch of %d rows per rank" % (
            m, "-".join(map(str, v["widths"])), v["batch"]) for m, v in res["models"].items())))
    L.append("")
    head = "| model | np | compute only (no communication) | " + " | ".join(LABEL[x] for x in sides if x != "hvd") + \
           " | hvd_bridge.torch | DDP / hvd_bridge (speed-up) |"
    if "horovod" in sides:
        head += " horovod / hvd_bridge |"
    L.append(head)
    L.append("|" + "---|" * (head.count("|") - 1))
    params = info.get("params", {})
    for m in cfg["models"]:
        for n in nps:
            hv = gp("step/hvd/%d/%s" % (n, m))
            row = ["%s (%s parameters)" % (m, "{:,}".format(params.get(m, 0))), str(n),
                   mmm(g("compute/hvd/%d/%s" % (n, m)) + g("compute/ddp/%d/%s" % (n, m)), "%.2f")]
            for x in sides:
                if x != "hvd":
                    row.append(mmm(g("step/%s/%d/%s" % (x, n, m)), "%.2f"))
            row.append(mmm(ok(hv), "%.2f"))
            row.append(mr(ratios(gp("step/ddp/%d/%s" % (n, m)), hv)))
            if "horovod" in sides:
                row.append(mr(ratios(gp("step/horovod/%d/%s" % (n, m)), hv)))
            L.append("| " + " | ".join(row) + " |")
    L.append("")
    L.append("Target: step time at least 2x faster than DDP/gloo at np = 2: " + "; ".join(
        "%s **%s** (speed-up %s)" % (m, "met" if r and statistics.median(r) >= 2 else "missed", mr(r))
        for m in cfg["models"] for r in [ratios(gp("step/ddp/2/%s" % m), gp("step/hvd/2/%s" % m))]) + ".")
    L.append("")
    L.append("#### Allreduce, float32 sum in place, GB/s (tensor bytes / time of one call)")
    L.append("")
    head = "| size | np | " + " | ".join(LABEL[x] for x in sides if x != "hvd") + \
           " | hvd_bridge.torch | hvd_bridge / gloo |"
    if "horovod" in sides:
        head += " hvd_bridge / horovod |"
    L.append(head)
    L.append("|" + "---|" * (head.count("|") - 1))
    below = {}
    for n in nps:
        for size in cfg["sizes"]:
            hv = gbs(size, gp("allreduce/hvd/%d/%d" % (n, size)))
            gl = gbs(size, gp("allreduce/ddp/%d/%d" % (n, size)))
            row = [size_name(size), str(n)]
            for x in sides:
                if x != "hvd":
                    row.append(mmm(gbs(size, g("allreduce/%s/%d/%d" % (x, n, size))), "%.3g"))
            row.append(mmm(ok(hv), "%.3g"))
            r = ratios(hv, gl)
            row.append(mr(r))
            if "horovod" in sides:
                row.append(mr(ratios(hv, gbs(size, gp("allreduce/horovod/%d/%d" % (n, size))))))
            if not r or statistics.median(r) < 1:
                below.setdefault(n, []).append(size_name(size))
            L.append("| " + " | ".join(row) + " |")
    L.append("")
    L.append("Target: allreduce bandwidth at least gloo's at every size: " + "; ".join(
        "np = %d **%s**" % (n, "met" if not below.get(n) else "missed at " + ", ".join(below[n])) for n in nps) +
        " (on the median).")
    L.append("")
    if any(k.startswith("cpu/") for k in s):
        L.append("#### CPU time, ms per step or per call: a rank's process, all of its threads (the runtimes' "
                 "background threads, MPI's polling, gloo's threads), median rank, beside the wall time")
        L.append("")
        head = "| what | np | " + " | ".join("%s CPU / wall" % LABEL[x] for x in sides) + " |"
        L.append(head)
        L.append("|" + "---|" * (head.count("|") - 1))
        rows = [("step/%s" % m, "step, %s" % m, lambda x, n, m=m: g("step/%s/%d/%s" % (x, n, m)))
                for m in cfg["models"]]
        rows += [("allreduce/%d" % z, "allreduce %s" % size_name(z),
                  lambda x, n, z=z: g("allreduce/%s/%d/%d" % (x, n, z))) for z in cfg["sizes"]]
        for n in nps:
            for key, label, wall in rows:
                cells = []
                for x in sides:
                    c, w = g("cpu/%s/%d/%s" % (x, n, key)), wall(x, n)
                    cells.append("%s / %s" % ("%.2f" % statistics.median(c) if c else "–",
                                              "%.2f" % statistics.median(w) if w else "–"))
                L.append("| %s | %d | %s |" % (label, n, " | ".join(cells)))
        L.append("")
    for key, what in (("retried", "Jobs that failed once and were run again"),
                      ("failures", "Jobs that failed twice (no sample for that run)")):
        if res.get(key):
            L.append("%s: %s." % (what, "; ".join("%s: %d (%s)" % (k, len(v), v[0][-240:].replace("\n", " "))
                                                  for k, v in sorted(res[key].items()))))
            L.append("")
    return "\n".join(L)


def gnuplot(script):
    r = subprocess.run(["gnuplot"], input=script.encode(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        print("report: gnuplot failed: %s" % r.stdout.decode()[-500:], file=sys.stderr)
    return r.returncode == 0


def plot(res, outdir):
    s, cfg, sides = res["samples"], res["cfg"], res["sides"]
    nps = sorted({int(k.split("/")[2]) for k in s})
    os.makedirs(outdir, exist_ok=True)
    made = []
    with tempfile.TemporaryDirectory() as d:
        curves = []
        for side in sides:
            for n in nps:
                f = os.path.join(d, "ar-%s-%d.dat" % (side, n))
                with open(f, "w") as out:
                    for size in cfg["sizes"]:
                        v = ok(gbs(size, s.get("allreduce/%s/%d/%d" % (side, n, size), [])))
                        if v:
                            out.write("%d %.6g %.6g %.6g\n" % (size, statistics.median(v), min(v), max(v)))
                curves.append('"%s" using 1:2:3:4 with yerrorlines lw 2 dt %d title "%s, np=%d"'
                              % (f, 1 if n == nps[0] else 2, LABEL[side], n))
        png = os.path.join(outdir, "torch-allreduce.png")
        if gnuplot("""set terminal pngcairo size 900,520 font "sans,11"
set output "%s"
set title "allreduce (float32 sum, in place): bandwidth against size"
set xlabel "tensor size (bytes)"
set ylabel "GB/s (median, bars: min-max over runs)"
set termoption noenhanced
set logscale x 2
set xrange [3000:90000000]
set logscale y 10
set format y "%%g"
set xtics (%s)
set key top left
set grid
plot %s
""" % (png, ", ".join('"%s" %d' % (size_name(z), z) for z in cfg["sizes"]), ", \\\n     ".join(curves))):
            made.append("torch-allreduce.png")
        big = cfg["models"][0]
        f = os.path.join(d, "step.dat")
        with open(f, "w") as out:
            for n in nps:
                row = [str(n)]
                for side in sides + ["compute"]:
                    key = ("compute/hvd/%d/%s" % (n, big)) if side == "compute" else "step/%s/%d/%s" % (side, n, big)
                    v = ok(s.get(key, []))
                    row.append("%.3f %.3f %.3f" % (statistics.median(v), min(v), max(v)) if v else "NaN NaN NaN")
                out.write(" ".join(row) + "\n")
        cols = []
        for i, side in enumerate(sides + ["compute"]):
            c = 2 + 3 * i
            cols.append('"%s" using 1:%d:%d:%d with yerrorlines lw 2 title "%s"'
                        % (f, c, c + 1, c + 2, "compute only (hvd job)" if side == "compute" else LABEL[side]))
        png = os.path.join(outdir, "torch-step.png")
        if gnuplot("""set terminal pngcairo size 800,480 font "sans,11"
set output "%s"
set title "training step of %s, time against np"
set xlabel "ranks (np), 2 cores"
set ylabel "ms (median, bars: min-max over runs)"
set termoption noenhanced
set key top left
set grid
set xtics (%s)
set yrange [0:*]
plot %s
""" % (png, big, ", ".join(map(str, nps)), ", \\\n     ".join(cols))):
            made.append("torch-step.png")
    return made


def write_doc(doc, body, plots, plot_rel):
    with open(doc) as f:
        text = f.read()
    links = "\n".join("![%s](%s)" % (p[:-4], os.path.join(plot_rel, p)) for p in plots)
    block = "<!-- torch:begin -->\n" + body.rstrip() + ("\n\n" + links if links else "") + "\n<!-- torch:end -->"
    if "<!-- torch:begin -->" in text:
        text = re.sub(r"<!-- torch:begin -->.*?<!-- torch:end -->", lambda m: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n## PyTorch\n\n" + block + "\n"
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
