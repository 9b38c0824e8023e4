#!/usr/bin/env python3
"""Runs bench_runtime several times and reports the spread (docs/performance.md, "Collective
runtime").

    python3 bench/runtime/runs.py --build build [--baseline OLD_BUILD] [--runs 3] [--np 4]
                                  [--json FILE] [--plot PNG] [-- BENCH_OPTIONS]
    python3 bench/runtime/runs.py --from-json FILE [--plot PNG]     (report only)

Each run is one `bench/runtime/run_bench.sh BUILD ... --json F` (NP ranks on this machine);
with --baseline, every round runs both builds, the order alternating from round to round, so
that a change is measured against the code before it under the same load. Prints markdown
tables, each cell the median [min-max] over the runs (ratios are taken run by run, each raw
MPI figure being the mean of that run's two raw rounds). --plot writes the fusion sweep
(time per step against tensors per step, per-tensor MPI_Allreduce vs fused by the runtime)
with gnuplot. BENCH_OPTIONS go to bench_runtime (default: --large-iters 5 --small-steps 20
--neg-steps 50).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run_once(build, np_, bench_args):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        env = dict(os.environ, NP=str(np_))
        r = subprocess.run(["sh", os.path.join(HERE, "run_bench.sh"), build] + bench_args +
                           ["--json", f.name], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("runs.py: bench_runtime failed in %s (exit %d): %s" %
                     (build, r.returncode, (r.stderr or r.stdout)[-800:]))
        try:
            with open(f.name) as j:
                return json.load(j)
        except ValueError as e:
            sys.exit("runs.py: bench_runtime in %s wrote no valid results (%s): %s" %
                     (build, e, (r.stderr or r.stdout)[-800:]))


def spread(v, fmt="%.2f"):
    return (fmt + " [" + fmt + "–" + fmt + "]") % (statistics.median(v), min(v), max(v))


def raw(x):
    return sum(x["raw"]) / len(x["raw"])


def report(name, runs):
    print("\n### %s: %d run(s), %d ranks\n" % (name, len(runs), runs[0]["ranks"]))
    print("| tensors of 4 KiB per step | one MPI_Allreduce per tensor, ms | fused by the runtime, ms "
          "| speed-up |")
    print("|---|---|---|---|")
    for i, f in enumerate(runs[0]["fusion"]):
        pts = [r["fusion"][i] for r in runs]
        print("| %d | %s | %s | %s |" % (f["tensors"], spread([raw(p) * 1e3 for p in pts]),
                                          spread([p["hvd"] * 1e3 for p in pts]),
                                          spread([raw(p) / p["hvd"] for p in pts])))
    print("\n| allreduce, float32 | MPI_Allreduce, µs | hvd_allreduce, µs | hvd / MPI time |")
    print("|---|---|---|---|")
    for i, m in enumerate(runs[0]["mid"]):
        pts = [r["mid"][i] for r in runs]
        print("| %d KiB | %s | %s | %s |" % (m["bytes"] >> 10, spread([raw(p) * 1e6 for p in pts], "%.0f"),
                                             spread([p["hvd"] * 1e6 for p in pts], "%.0f"),
                                             spread([p["hvd"] / raw(p) for p in pts])))
    pts = [r["large"] for r in runs]
    print("| 64 MiB (best of %d) | %s | %s | %s |" % (
        runs[0]["large_iters"], spread([raw(p) * 1e6 for p in pts], "%.0f"),
        spread([p["hvd"] * 1e6 for p in pts], "%.0f"), spread([p["hvd"] / raw(p) for p in pts])))
    print("\n| step of one-element tensors, end to end | cache on, ms | cache off, ms |")
    print("|---|---|---|")
    for key, n in (("step_100", 100), ("step_1000", 1000)):
        print("| %d tensors | %s | %s |" % (n, spread([r[key][0] * 1e3 for r in runs], "%.3f"),
                                            spread([r[key][1] * 1e3 for r in runs], "%.3f")))


def plot(results, png):
    lines, curves = [], []
    for bi, (name, runs) in enumerate(results):
        for what, col in (("per-tensor MPI_Allreduce", "raw"), ("fused by the runtime", "hvd")):
            if col == "raw" and bi > 0:
                continue  # the same MPI loop in every build
            data = []
            for i, f in enumerate(runs[0]["fusion"]):
                v = [(raw(r["fusion"][i]) if col == "raw" else r["fusion"][i]["hvd"]) * 1e3 for r in runs]
                data.append("%d %g %g %g" % (f["tensors"], statistics.median(v), min(v), max(v)))
            lines.append("\n".join(data) + "\ne")
            title = what if col == "raw" else "%s (%s)" % (what, name)
            curves.append('"-" using 1:2:3:4 with yerrorlines lw 2 title "%s"' % title)
            if col == "raw":  # the target: fused at least 5x faster than per tensor
                lines.append("\n".join(data) + "\ne")
                curves.append('"-" using 1:($2/5) with lines dt 2 lw 1 lc rgb "gray40" '
                              'title "target: per-tensor time / 5"')
    script = """set terminal pngcairo size 800,480 font "sans,11" noenhanced
set output "%s"
set logscale xy
set xlabel "4 KiB float32 tensors allreduced per step"
set ylabel "ms per step (median, min-max)"
set key top left
set grid
plot %s
%s
""" % (png, ", ".join(curves), "\n".join(lines))
    r = subprocess.run(["gnuplot"], input=script, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("runs.py: gnuplot failed: " + r.stderr[-500:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", help="the build directory to measure")
    ap.add_argument("--from-json", help="report and plot a --json file of an earlier run")
    ap.add_argument("--baseline", help="a second build (the code before a change), alternated with --build")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--json", help="write every run's results here")
    ap.add_argument("--plot", help="write the fusion sweep plot here (gnuplot)")
    ap.add_argument("bench_args", nargs="*")
    a = ap.parse_args()
    if a.from_json:
        with open(a.from_json) as f:
            d = json.load(f)
        names = list(d["builds"])
        print("bench_runtime %s, %d ranks" % (" ".join(d["bench_args"]), d["np"]))
        for name in names:
            report("%s (%s)" % (name, d["builds"][name]), d["runs"][name])
        if a.plot:
            plot([(name, d["runs"][name]) for name in names], a.plot)
        return
    if not a.build:
        ap.error("--build (or --from-json) is required")
    if a.runs < 1 or a.np < 1:
        ap.error("--runs and --np must be at least 1")
    bench_args = a.bench_args or ["--large-iters", "5", "--small-steps", "20", "--neg-steps", "50"]
    builds = [("this build", a.build)] + ([("baseline", a.baseline)] if a.baseline else [])
    got = {name: [] for name, _ in builds}
    t0 = time.time()
    for rnd in range(a.runs):
        order = builds[rnd % len(builds):] + builds[:rnd % len(builds)]
        for name, path in order:
            got[name].append(run_once(path, a.np, bench_args))
        print("round %d of %d done (%.0f s, load %.2f)" % (rnd + 1, a.runs, time.time() - t0,
                                                           os.getloadavg()[0]), file=sys.stderr)
    print("bench_runtime %s, %d ranks, %d runs per build, load average after: %s" % (
        " ".join(bench_args), a.np, a.runs, ", ".join("%.2f" % x for x in os.getloadavg())))
    for name, path in builds:
        report("%s (%s)" % (name, path), got[name])
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"np": a.np, "bench_args": bench_args, "builds": dict(builds), "runs": got}, f, indent=1)
    if a.plot:
        plot([(name, got[name]) for name, _ in builds], a.plot)


if __name__ == "__main__":
    main()
