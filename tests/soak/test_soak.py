#!/usr/bin/env python3
"""Soak: one long-lived `hvd-driver serve --jobs N` runs N jobs back to back over the same two
task services (started by hand with --elastic, as on executors that stay up); each job is the
user's own `mpirun` (Open MPI 4.1, the env file's generic command) with the probe entry point.

After every job the driver's and the tasks' open file descriptors, threads and VmRSS are
sampled from /proc (descriptors and threads as the least of five reads 20 ms apart, so that a
job's last connection still closing is not counted). They must level off: past the warm-up (the first fifth of the jobs, at
least 5), descriptors and threads never go above what they were at its end, and VmRSS grows by
less than RSS_SLACK_KIB. Every job must succeed, each with its own results, and nothing may be
left when serve and the tasks have ended.

CI runs 30 jobs; `--full` runs 500 and is what docs/reliability.md shows (`--write-doc`, with a
plot when gnuplot is there). The JVM's own soak is the jni_soak test (JniTest soak: a
DriverService and two elastic TaskServices in one JVM, JobOptions.keepTasks); its samples,
written with -Dhvdbridge.soak.out=FILE, join the doc with --jvm-samples FILE; jni_soak_fresh
(JniTest soak_fresh: a DriverService and task services of its own per job, as each Spark call
starts them) joins with --jvm-fresh-samples FILE, and jni_soak_fresh_tasks (JniTest soak_fresh_tasks: one
DriverService, two new task services for each job) with --jvm-fresh-tasks-samples FILE.
--fresh-tasks runs serve over fresh task services instead (two new ones without --elastic for
each job); --full runs both kinds."""
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "faults"))
import hvdtest  # noqa: E402
import reldoc  # noqa: E402
from hvdtest import check  # noqa: E402

RSS_SLACK_KIB = 1024  # allocator noise after the warm-up; a leak of 2 KiB a job passes 500 jobs
HOSTS = ["soak-a", "soak-b"]
ARGS = None


def fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def status_field(pid, name):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    return 0


def settled(read, reads=5, gap=0.02):
    """The least of a few reads a little apart. The sample is taken when the driver is ready for
    the next job, and a task may still be closing the finished job's connection or reaping its
    orted for a few milliseconds (seen once in an ASan run: one descriptor more for one sample).
    A leak persists through every read; that moment does not."""
    least = read()
    for _ in range(reads - 1):
        time.sleep(gap)
        least = min(least, read())
    return least


def sample(job, procs, seconds):
    """{job, seconds, <who>: {fds, threads, rss_kib}} for each process of procs {who: pid}."""
    row = {"job": job, "seconds": round(seconds, 3)}
    for who, pid in procs.items():
        row[who] = {"fds": settled(lambda: fds(pid)), "threads": settled(lambda: status_field(pid, "Threads")),
                    "rss_kib": status_field(pid, "VmRSS")}
    return row


def said(path):
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


def run_soak(d, mark, jobs, fresh=False):
    """The soak's samples. fresh: each job gets two new task services, started without
    --elastic (each runs one command; serve lets them go after the job and waits for the next
    pair, as over executors that come and go); only the driver is sampled then, and each
    task service must have ended with status 0 once let go."""
    env_file, errpath, out = (os.path.join(d, f) for f in ("job.env", "serve.err", "results.json"))
    env = hvdtest.marked_env(mark, ARGS.bin, HVD_E2E_DIR=d)
    err = open(errpath, "w+b")
    srv = hvdtest.start_driver(ARGS.bin, ["serve", "-np", "2", "--env-file", env_file, "--jobs", str(jobs),
                                          "--results-json", out, "--entry", ARGS.probe_lib + ":probe_entry"],
                               env, d, stderr=err)
    tenv = dict(env, **hvdtest.task_hint(srv, "hvd-driver serve", errfile=err))

    def start_tasks():
        return [hvdtest.start_task(ARGS.bin, i, tenv, HOSTS[i], args=[] if fresh else ["--elastic"])
                for i in range(2)]
    tasks = start_tasks()
    every_task = list(tasks)
    samples = []
    try:
        hvdtest.wait_for(lambda: os.path.exists(env_file), 60, "the env file")
        time.sleep(0.2)
        vals = hvdtest.read_env_file(env_file)
        menv = dict(env, HVD_DRIVER_ADDRS=vals["HVD_DRIVER_ADDRS"], HVD_SECRET_FILE=vals["HVD_SECRET_FILE"])
        procs = {"driver": srv.pid} if fresh else {"driver": srv.pid, "task0": tasks[0].pid,
                                                   "task1": tasks[1].pid}
        samples.append(sample(0, procs, 0.0))
        for job in range(1, jobs + 1):
            t0 = time.perf_counter()
            rc, so, se, _ = hvdtest.run(hvdtest.serve_mpirun_cmd(vals), menv, timeout=120, cwd=d)
            check(rc == 0, "mpirun of job %d exited %d:\n%s%s" % (job, rc, so[-1500:], se[-1500:]))
            if job < jobs and fresh:
                let_go = "waiting for new ones to register for job %d" % (job + 1)
                hvdtest.wait_for(lambda: let_go in said(errpath), 60, "serve: " + let_go)
                for t in tasks:
                    t.wait(timeout=30)
                    check(t.returncode == 0, "a task service of job %d exited %d" % (job, t.returncode))
                tasks = start_tasks()
                every_task += tasks
            if job < jobs:
                ready = "ready for job %d" % (job + 1)
                hvdtest.wait_for(lambda: ready in said(errpath), 60, "serve: " + ready)
            else:
                srv.wait(timeout=60)
            with open(out) as f:
                ranks = json.load(f)["ranks"]
            check(all(r.get("status") == 0 and "rank=%d " % i in (r.get("result_text") or "")
                      for i, r in enumerate(ranks)), "job %d's results: %s" % (job, ranks))
            if job < jobs:
                samples.append(sample(job, procs, time.perf_counter() - t0))
            if job % 50 == 0:
                print("job %d: %s" % (job, json.dumps(samples[-1])), flush=True)
        check(srv.returncode == 0, "serve exited %d:\n%s" % (srv.returncode, said(errpath)[-3000:]))
        for t in tasks:
            t.wait(timeout=30)
            check(t.returncode == 0, "a task service exited %d" % t.returncode)
    finally:
        for p in [srv] + every_task:
            if p.poll() is None:
                p.kill()
                p.wait()
        err.close()
    hvdtest.assert_no_leftovers(mark)
    return samples


def level_problems(samples):
    """What did not level off after the warm-up, as sentences. In a sanitizer build
    ($HVD_SANITIZE) VmRSS is not judged: the sanitizer's runtime keeps freed memory and its
    shadow, which is what it is for; descriptors and threads still are."""
    warm = max(5, len(samples) // 5)
    if len(samples) <= warm:
        return ["only %d samples" % len(samples)]
    base, rest = samples[warm], samples[warm + 1:]
    bad = []
    for who in [w for w in ("driver", "task0", "task1") if w in base]:
        for key in ("fds", "threads"):
            top = max(s[who][key] for s in rest)
            if top > base[who][key]:
                job = next(s["job"] for s in rest if s[who][key] == top)
                bad.append("%s %s: %d after job %d, %d after job %d" % (who, key, base[who][key], base["job"],
                                                                    top, job))
        grew = rest[-1][who]["rss_kib"] - base[who]["rss_kib"]
        if grew >= RSS_SLACK_KIB and not os.environ.get("HVD_SANITIZE"):
            bad.append("%s VmRSS grew %d KiB from job %d to job %d" % (who, grew, base["job"], rest[-1]["job"]))
    return bad


def plot(samples, png):
    """VmRSS (MiB) and descriptors against jobs, by gnuplot; False when it cannot."""
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "soak.dat")
        with open(data, "w") as f:
            for s in samples:
                f.write("%d %s\n" % (s["job"], " ".join("%.2f %d %d" % (s[w]["rss_kib"] / 1024, s[w]["fds"],
                                                                         s[w]["threads"])
                                                        for w in ("driver", "task0", "task1"))))
        gp = """set terminal pngcairo size 800,480 font "sans,11"
set output "%s"
set title "hvd-driver serve: %d jobs back to back over the same 2 task services"
set xlabel "jobs done"
set ylabel "VmRSS (MiB)"
set y2label "open descriptors"
set ytics nomirror
set y2tics
set key bottom right
set grid
plot "%s" using 1:2 with lines lw 2 lc rgb "#1f77b4" title "driver VmRSS", \\
     "" using 1:5 with lines lw 2 lc rgb "#2ca02c" title "task 0 VmRSS", \\
     "" using 1:8 with lines lw 2 lc rgb "#ff7f0e" title "task 1 VmRSS", \\
     "" using 1:3 axes x1y2 with lines lw 1 dt 2 lc rgb "#1f77b4" title "driver descriptors", \\
     "" using 1:6 axes x1y2 with lines lw 1 dt 2 lc rgb "#2ca02c" title "task 0 descriptors"
""" % (png, samples[-1]["job"] + 1, data)
        try:
            r = subprocess.run(["gnuplot"], input=gp.encode(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError:
            return False
        return r.returncode == 0


def fresh_table(samples, bad):
    """The section lines of the soak over fresh task services (the driver's samples)."""
    jobs = samples[-1]["job"] + 1
    picks = sorted(set([0, 1, 5, 10] + [jobs * k // 10 for k in range(1, 10)] + [jobs - 1]))
    secs = sorted(s["seconds"] for s in samples[1:])
    L = ["", "### %d jobs through one `hvd-driver serve` over fresh task services (test_soak.py --full)" % jobs,
         "",
         "The same, but each job gets two new task services started without `--elastic`: each runs its "
         "one command, serve lets them go after the job (they end at once, status 0), says so, waits for "
         "the next pair to register at the same indices, probes the interfaces again and rewrites the env "
         "file before `ready for job K+1`, as over executors that come and go. Only the driver lives "
         "through it; CI runs 20 jobs (soak_serve_fresh_tasks, the same bounds).", "",
         "A job (mpirun start, through the new pair's registration, to the driver ready for the next) took "
         "%.2f s median, %.2f s at most." % (secs[len(secs) // 2], secs[-1]), "",
         "| after job | driver fds / threads / VmRSS KiB |", "|---|---|"]
    for s in samples:
        if s["job"] in picks:
            L.append("| %d | %d / %d / %d |" % (s["job"], s["driver"]["fds"], s["driver"]["threads"],
                                              s["driver"]["rss_kib"]))
    L += ["", "Verdict: " + ("levelled off." if not bad else "**did not level off**: " + "; ".join(bad))]
    return L


def doc_body(samples, bad, png_ok, jvm=None, jvm_fresh=None, jvm_fresh_tasks=None, fresh=None):
    jobs = samples[-1]["job"] + 1
    picks = sorted(set([0, 1, 5, 10] + [jobs * k // 10 for k in range(1, 10)] + [jobs - 1]))
    rows = [s for s in samples if s["job"] in picks]
    secs = sorted(s["seconds"] for s in samples[1:])
    L = ["## Soak: %d jobs through one `hvd-driver serve` (tests/soak/test_soak.py --full)" % jobs, "",
         "One `hvd-driver serve -np 2 --jobs %d` and two task services started by hand with `--elastic` "
         "(as on executors that stay up); each job is the user's own `mpirun` (Open MPI 4.1, the env "
         "file's generic command) running the probe entry point, and must succeed with its own results. "
         "After each job the driver's and the tasks' open descriptors, threads and VmRSS are read from "
         "/proc (descriptors and threads as the least of five reads 20 ms apart). Pass: past the warm-up (the first fifth of the jobs), descriptors and threads never "
         "exceed their value at its end and VmRSS grows by less than %d KiB; nothing left afterwards." % (
             jobs, RSS_SLACK_KIB), "",
         "A job (mpirun start to the driver ready for the next) took %.2f s median, %.2f s at most." % (
             secs[len(secs) // 2], secs[-1]), "",
         "| after job | driver fds / threads / VmRSS KiB | task 0 fds / threads / VmRSS KiB | "
         "task 1 fds / threads / VmRSS KiB |",
         "|---|---|---|---|"]
    for s in rows:
        L.append("| %d | %s |" % (s["job"], " | ".join("%d / %d / %d" % (s[w]["fds"], s[w]["threads"],
                                                                          s[w]["rss_kib"])
                                                       for w in ("driver", "task0", "task1"))))
    L.append("")
    L.append("Verdict: " + ("levelled off." if not bad else "**did not level off**: " + "; ".join(bad)))
    if png_ok:
        L += ["", "![VmRSS and descriptors against jobs](img/soak.png)"]
    if fresh:
        L += fresh_table(*fresh)
    if jvm:
        L += jvm_table(jvm, False)
    if jvm_fresh:
        L += jvm_table(jvm_fresh, True)
    if jvm_fresh_tasks:
        L += jvm_table(jvm_fresh_tasks, True, fresh_tasks=True)
    return "\n".join(L)


def jvm_table(samples, fresh, fresh_tasks=False):
    """A JVM soak's section lines (JniTest soak's, soak_fresh's or soak_fresh_tasks' JSON
    lines)."""
    jobs = samples[-1]["job"]
    warm = max(5, jobs // 5)
    base = next(s for s in samples if s["job"] == warm)["jvm"]
    rest = [s["jvm"] for s in samples if warm < s["job"] and (fresh or s["job"] < jobs)]
    picks = sorted(set([1, 5, 10] + [jobs * k // 10 for k in range(1, 11)]))
    secs = sorted(s["seconds"] for s in samples)
    if fresh_tasks:
        L = ["", "### The JVM: %d jobs through one `DriverService` over fresh task services "
             "(tests/jni JniTest soak_fresh_tasks)" % jobs, "",
             "One `DriverService`; each job starts two new `TaskService`s (not elastic: one command "
             "each) and runs with `JobOptions.keepTasks(true)`; the next `runJob` lets the spent pair go "
             "and waits for the new one, as over executors that come and go. Each pair must end by "
             "itself with status 0; the JVM's descriptors, threads and VmRSS after each job. CI runs 30 "
             "(jni_soak_fresh_tasks, the same bounds as jni_soak)."]
    elif fresh:
        L = ["", "### The JVM: %d jobs, each over a `DriverService` and task services of its own "
             "(tests/jni JniTest soak_fresh)" % jobs, "",
             "Each job starts a `DriverService` and two `TaskService`s in one JVM, runs 2 ranks and "
             "closes them all, as each call of `HorovodSpark.run` or `hvd_bridge.spark.run` starts its "
             "own; the JVM's descriptors, threads and VmRSS after each job. CI runs 30 (jni_soak_fresh, "
             "the same bounds as jni_soak)."]
    else:
        L = ["", "### The JVM: %d jobs through one `DriverService` (tests/jni JniTest soak)" % jobs, "",
             "A `DriverService` and two `TaskService`s started with `Config.elastic(true)`, all in one JVM "
             "(as in a Spark driver that hosts both, the case with the most native state in one process), "
             "running %d jobs of 2 ranks back to back with `JobOptions.keepTasks(true)` (the last job shuts "
             "the tasks down); the JVM's descriptors, threads and VmRSS after each job. CI runs 30 (jni_soak: "
             "after the warm-up, descriptors and threads within 4 of their value at its end, the JVM's own "
             "coming and going, and VmRSS within 16 MiB)." % jobs]
    L += ["", "A job took %.2f s median, %.2f s at most. After job %d: %d descriptors, %d threads, %d KiB; "
         "afterwards at most %d descriptors, %d threads, %d KiB." % (
             secs[len(secs) // 2], secs[-1], warm, base["fds"], base["threads"], base["rss_kib"],
             max(s["fds"] for s in rest), max(s["threads"] for s in rest), max(s["rss_kib"] for s in rest)),
          "", "| after job | JVM fds / threads / VmRSS KiB |", "|---|---|"]
    for s in samples:
        if s["job"] in picks:
            L.append("| %d | %d / %d / %d |" % (s["job"], s["jvm"]["fds"], s["jvm"]["threads"], s["jvm"]["rss_kib"]))
    return L


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def soak(fresh):
    """Runs one soak (same task services, or fresh ones); returns (samples, problems), or None
    after printing why it failed."""
    mark = uuid.uuid4().hex
    what = "soak over fresh task services" if fresh else "soak"
    t0 = time.time()
    try:
        with tempfile.TemporaryDirectory() as d:
            samples = run_soak(d, mark, ARGS.jobs, fresh)
    except (hvdtest.Failure, subprocess.TimeoutExpired, OSError) as e:
        print("FAIL %s: %s" % (what, e))
        return None
    bad = level_problems(samples)
    for s in samples[:: max(1, len(samples) // 10)] + [samples[-1]]:
        print(json.dumps(s))
    if bad:
        print("FAIL %s: did not level off: %s" % (what, "; ".join(bad)))
    else:
        print("ok   %s: %d jobs in %.0f s, descriptors, threads and VmRSS levelled off" % (
            what, ARGS.jobs, time.time() - t0))
    return samples, bad


def main():
    global ARGS
    ap = hvdtest.arg_parser("--bin", "--probe-lib")
    ap.add_argument("--jobs", type=int, default=30, help="jobs back to back (--full: 500)")
    ap.add_argument("--full", action="store_true", help="500 jobs, over the same task services and over fresh ones")
    ap.add_argument("--fresh-tasks", action="store_true",
                    help="only the soak over fresh task services (two new ones for each job)")
    ap.add_argument("--jvm-samples", help="the JVM soak's JSON lines, for the doc (see above)")
    ap.add_argument("--jvm-fresh-samples", help="JniTest soak_fresh's JSON lines, for the doc")
    ap.add_argument("--jvm-fresh-tasks-samples", help="JniTest soak_fresh_tasks' JSON lines, for the doc")
    reldoc.add_options(ap)
    ARGS = ap.parse_args()
    if ARGS.full:
        ARGS.jobs = max(ARGS.jobs, 500)
    kinds = [True] if ARGS.fresh_tasks else [False, True] if ARGS.full else [False]
    runs = [soak(fresh) for fresh in kinds]
    if None in runs:
        return 1
    if ARGS.write_doc and not ARGS.fresh_tasks:
        samples, bad = runs[0]
        png = os.path.join(os.path.dirname(ARGS.doc), "img", "soak.png")
        jvm = [read_jsonl(p) if p else None
               for p in (ARGS.jvm_samples, ARGS.jvm_fresh_samples, ARGS.jvm_fresh_tasks_samples)]
        fresh = runs[1] if len(runs) > 1 else None
        reldoc.write_section(ARGS.doc, "soak", doc_body(samples, bad, plot(samples, png), *jvm, fresh=fresh))
    return 1 if any(bad for _, bad in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
