#!/usr/bin/env python3
"""Adversarial peers against a LIVE driver service and a LIVE task service.

    test_adversarial.py --bin DIR --peer ADV_PEER --probe-lib LIB [--secs S] [--write-doc]

Part 1: `hvd-driver run -np 2 --entry probe` (no --local) waits for its tasks; the harness
starts task 0 only, and adv_peer attacks the driver service and task 0's service (wrong
secret, replayed frame on another and on the same connection, reordered frames, a reflected
frame, truncated frames, a 2 GiB length, a key holder claiming 64 MiB, random bytes, 1000 idle
TCP and 1000 idle authenticated connections), each while a legitimate client pings the
attacked service. Then task 1 starts and the real job must succeed through the attacked
services.

Part 2: `hvd-driver serve -np 1` with one task; adv_peer subscribes to the task's output and
never reads, starts a chatty command, and measures a legitimate subscriber's throughput and
the service's ping latency.

Checks per case: the service process is alive, the legitimate pings never failed, p99 latency
under 500 ms, VmRSS under 512 MiB and back within 64 MiB of where it started, and every attempt
was refused as the protocol says (as_expected == attempts). Processes carry HVD_E2E_MARK and
none may be left. --write-doc writes the table into docs/reliability.md.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "faults"))
import hvdtest  # noqa: E402
import reldoc  # noqa: E402

ARGS = None
P99_LIMIT_MS = 500.0
RSS_LIMIT_KB = 512 * 1024
RSS_GROWTH_KB = 64 * 1024


def job_env(mark):
    env = hvdtest.marked_env(mark, ARGS.bin)
    # In ASan builds freed memory sits in a quarantine (256 MiB by default), which would read
    # as growth here: keep it small so that VmRSS measures what the service really holds.
    # (The option is ignored by builds without ASan.)
    return hvdtest.add_asan_option(env, "quarantine_size_mb=8")


def start_task(i, env, host, cwd):
    return hvdtest.start_task(ARGS.bin, i, env, host, start_timeout=120, cwd=cwd, stderr=subprocess.PIPE)


def run_peer(mode, env, extra):
    cmd = [ARGS.peer, mode, "--secs", str(ARGS.secs), "--stall-secs", str(ARGS.stall_secs)] + extra
    rc, out, err, _ = hvdtest.run(cmd, env, timeout=400)
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    if rc != 0:
        raise RuntimeError("adv_peer %s exited %d: %s" % (mode, rc, err[-2000:]))
    return rows, err


def judge(row):
    bad = []
    if not row["alive"]:
        bad.append("service died")
    if row["ping_fail"]:
        bad.append("%d legit pings failed" % row["ping_fail"])
    if row["ping_n"] == 0:
        bad.append("no legit ping answered")
    elif row["p99_ms"] > P99_LIMIT_MS:
        bad.append("p99 %.0f ms" % row["p99_ms"])
    if row["rss_max_kb"] > RSS_LIMIT_KB:
        bad.append("RSS %d MiB" % (row["rss_max_kb"] // 1024))
    if row["rss_after_kb"] - row["rss_before_kb"] > RSS_GROWTH_KB:
        bad.append("RSS grew %d MiB" % ((row["rss_after_kb"] - row["rss_before_kb"]) // 1024))
    if row["as_expected"] != row["attempts"]:
        bad.append("%d of %d attempts not refused as expected" % (row["attempts"] - row["as_expected"], row["attempts"]))
    return bad


def part1(rows, problems):
    mark = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "results.json")
        env = job_env(mark)
        drv = hvdtest.start_driver(ARGS.bin, ["run", "-np", "2", "--start-timeout", "300", "--results-json", out,
                                              "--entry", ARGS.probe_lib + ":probe_entry"],
                                   env, d, stdout=subprocess.DEVNULL)
        tasks = []
        try:
            tenv = dict(env, **hvdtest.task_hint(drv, "hvd-driver run"))
            tasks.append(start_task(0, tenv, "e2e-adv-a", d))
            got, err = run_peer("attacks", tenv, ["--driver-pid", str(drv.pid), "--task-pid", str(tasks[0].pid)]
                                + ARGS.cases)
            rows.extend(got)
            # The real job, through the attacked services.
            t0 = time.time()
            tasks.append(start_task(1, tenv, "e2e-adv-b", d))
            try:
                _, se = drv.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                drv.kill()
                _, se = drv.communicate()
                problems.append("the job after the attacks did not end within 120 s")
            job = "exit %d in %.1f s" % (drv.returncode, time.time() - t0)
            if drv.returncode != 0:
                problems.append("the job after the attacks failed: %s" % se.decode(errors="replace")[-1500:])
            else:
                with open(out) as f:
                    res = json.load(f)
                if not all(r["status"] == 0 and r["reported"] for r in res["ranks"]):
                    problems.append("the job after the attacks: %s" % res)
            rows.append({"service": "driver+task", "case": "legit job afterwards", "note": job})
        finally:
            hvdtest.stop(drv, 0)
            for t in tasks:
                hvdtest.stop(t, 20)
    left = hvdtest.leftovers(mark)
    if left:
        problems.append("part 1 left processes: %s" % left)


def part2(rows, problems):
    mark = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as d:
        env = job_env(mark)
        env_file = os.path.join(d, "job.env")
        srv = hvdtest.start_driver(ARGS.bin, ["serve", "-np", "1", "--env-file", env_file,
                                              "--entry", ARGS.probe_lib + ":probe_entry"],
                                   env, d, stdout=subprocess.DEVNULL)
        tasks = []
        try:
            tenv = dict(env, **hvdtest.task_hint(srv, "hvd-driver serve"))
            tasks.append(start_task(0, tenv, "e2e-adv-stall", d))
            hvdtest.wait_for(lambda: os.path.exists(env_file), 30)  # the stall case runs either way
            got, err = run_peer("stall", tenv, ["--task-pid", str(tasks[0].pid)])
            if not got:
                problems.append("stall case produced nothing: %s" % err[-1000:])
            rows.extend(got)
        finally:
            if not hvdtest.stop(srv, 30, signal.SIGINT, drain=True):
                problems.append("hvd-driver serve did not stop on SIGINT within 30 s")
            for t in tasks:
                if not hvdtest.stop(t, 30):
                    problems.append("task did not end within 30 s of the driver stopping")
    left = hvdtest.leftovers(mark)
    if left:
        problems.append("part 2 left processes: %s" % left)


def table(rows):
    out = ["| service | case | attempts refused as expected | legit pings (failed) | ping p50 / p99 / max (ms) | "
           "VmRSS before / max / after (MiB) | alive | note | verdict |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "attempts" not in r:
            out.append("| %s | %s | | | | | | %s | %s |" % (r["service"], r["case"], reldoc.md_cell(r["note"]),
                                                        r.get("verdict", "ok")))
            continue
        out.append("| %s | %s | %d / %d | %d (%d) | %.1f / %.1f / %.1f | %.1f / %.1f / %.1f | %s | %s | %s |" % (
            r["service"], r["case"], r["as_expected"], r["attempts"], r["ping_n"], r["ping_fail"],
            r["p50_ms"], r["p99_ms"], r["max_ms"], r["rss_before_kb"] / 1024, r["rss_max_kb"] / 1024,
            r["rss_after_kb"] / 1024, "yes" if r["alive"] else "**no**", reldoc.md_cell(r["note"]),
            "ok" if not r["bad"] else "**FAIL**: " + reldoc.md_cell("; ".join(r["bad"]))))
    return "\n".join(out)


def main():
    global ARGS
    ap = hvdtest.arg_parser("--bin", "--peer", "--probe-lib")
    ap.add_argument("--secs", type=float, default=1.5, help="seconds per attack case")
    ap.add_argument("--stall-secs", type=float, default=6.0,
                    help="how long the stalled-subscriber case watches: its output must resume in that "
                    "window, once the staller is dropped (2 s) (--full: 40)")
    ap.add_argument("--full", action="store_true", help="longer cases (3 s each, stall case 40 s)")
    reldoc.add_options(ap)
    ap.add_argument("cases", nargs="*", help="adv_peer case names (default: all)")
    ARGS = ap.parse_args()
    if ARGS.full:
        ARGS.secs, ARGS.stall_secs = max(ARGS.secs, 3.0), max(ARGS.stall_secs, 40.0)
    rows, problems = [], []
    for part in (part1, part2):
        try:
            part(rows, problems)
        except (hvdtest.Failure, RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            problems.append("%s: %s" % (part.__name__, e))
    failed = 0
    for r in rows:
        if "attempts" in r:
            r["bad"] = judge(r)
            failed += bool(r["bad"])
            print("%s %-6s %-28s refused %d/%d pings %d fail %d p50 %.1f p99 %.1f max %.1f ms RSS %d->%d->%d KiB %s" % (
                "ok  " if not r["bad"] else "FAIL", r["service"], r["case"], r["as_expected"], r["attempts"],
                r["ping_n"], r["ping_fail"], r["p50_ms"], r["p99_ms"], r["max_ms"], r["rss_before_kb"],
                r["rss_max_kb"], r["rss_after_kb"], r["note"] + ("" if not r["bad"] else "  <- " + "; ".join(r["bad"]))),
                flush=True)
        else:
            print("     %s %s: %s" % (r["service"], r["case"], r["note"]))
    for p in problems:
        print("FAIL " + p)
    if ARGS.write_doc:
        body = ("## Adversarial peers (tests/adversarial/test_adversarial.py)\n\n"
                "Live services: the driver service of `hvd-driver run -np 2` waiting for its second task, and "
                "task 0's `hvd-task` service; the stalled-subscriber case uses `hvd-driver serve -np 1` and its "
                "task. Each case lasts about %.1f s while a legitimate client pings the attacked service every "
                "5 ms. Limits: p99 < %.0f ms, VmRSS < %d MiB and back within %d MiB, no failed ping, every "
                "attempt refused as the protocol says.\n\n" % (ARGS.secs, P99_LIMIT_MS, RSS_LIMIT_KB // 1024,
                                                               RSS_GROWTH_KB // 1024)
                + table(rows) + "\n" + "".join("\nProblem: %s\n" % reldoc.md_cell(p) for p in problems))
        reldoc.write_section(ARGS.doc, "adversarial", body)
    print("%d cases, %d failed, %d problems" % (len(rows), failed, len(problems)))
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
