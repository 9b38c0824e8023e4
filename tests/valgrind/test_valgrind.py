#!/usr/bin/env python3
"""Memcheck: a real job with every hvd- program of ours running under valgrind.

    test_valgrind.py --bin DIR --probe-lib LIB [--write-doc] [--doc FILE] [--keep] [JOB...]

Jobs (default: all): `ok` runs `hvd-driver run -np 4 --local 2 --entry
libprobe_entry.so:probe_entry` (2 fake hosts x 2 ranks) and expects success; `failing_rank`
runs the same job with rank 3 failing in its entry (--entry-arg fail=3) and expects the
driver to fail the job, which takes the error paths of every program; `bad_entry` names an
entry library that does not exist (the driver's early exit: only hvd-driver runs).

How each program comes to run under valgrind, without any hook in the product:
  hvd-driver  started by this script as `valgrind ... hvd-driver run ...`;
  hvd-task, hvd-rsh, hvd-exec  the driver takes their paths from HVD_BIN_DIR (launch.c,
              launcher_local.c), which points at a directory of wrapper scripts that exec
              `valgrind ... <real program> "$@"`. mpirun and orted run natively: hvd-rsh is
              mpirun's plm_rsh_agent and orted starts the wrapper of hvd-exec per rank.
Options: --tool=memcheck --leak-check=full --errors-for-leak-kinds=definite,indirect
--error-exitcode=99 --track-fds=no, one log per process (<program>.<pid>.log), plus the
suppression files tests/valgrind/*.supp (third-party false positives only).

Every log is parsed. A process is one of:
  main        the process of the program itself (its parent is not the same program):
              it must end with valgrind's exit report, and that report must show no error
              (invalid read/write/free, uninitialised use, ...) and no definitely or
              indirectly lost block;
  fork child  a child forked by the program (its parent is the same program). One that
              execs another program (mpirun, orted, /bin/sh) leaves no exit report and is
              not counted (hvd-keeper, the command keeper, runs natively). One that
              exits without exec (the keeper with HVD_KEEPER=none) is checked for errors,
              but its leak figures are not counted: a child forked from a multi-threaded
              process holds heap blocks that only the parent's other threads pointed to,
              which valgrind reports as lost.
The test fails, printing the offending records with their stacks, on any such error, when
a job does not end as expected, or when a process of a job is left behind.

--write-doc writes the per-program table into docs/reliability.md (section "valgrind").
Exit status: 0 passed, 1 failed, 77 skipped (no valgrind or mpirun, or a sanitizer build:
HVD_SANITIZE set in the environment, valgrind and ASan/TSan do not mix).
"""
import datetime
import glob
import json
import os
import re
import shutil
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
PROGRAMS = ["hvd-driver", "hvd-task", "hvd-rsh", "hvd-exec"]
WRAPPED = ["hvd-task", "hvd-rsh", "hvd-exec"]
ERROR_EXIT = 99
JOB_TIMEOUT = 100
# name: (probe entry argument, expected driver status: 0 or "non-zero", entry library or None
# for the probe's). bad_entry names an entry library that does not exist: only the driver runs.
JOBS = {"ok": ("", 0, None), "failing_rank": ("fail=3", "non-zero", None),
        "bad_entry": ("", "non-zero", "/nonexistent/libentry.so")}


def vg_options(log_dir, program):
    opts = ["--tool=memcheck", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect",
            "--show-leak-kinds=definite,indirect,possible", "--error-exitcode=%d" % ERROR_EXIT,
            "--track-fds=no", "--num-callers=30",
            "--log-file=%s/%s.%%p.log" % (log_dir, program)]
    for supp in sorted(glob.glob(os.path.join(HERE, "*.supp"))):
        opts.append("--suppressions=" + supp)
    return opts


def sh_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def make_wrappers(wrap_dir, log_dir):
    os.makedirs(wrap_dir)
    for p in WRAPPED:
        real = os.path.join(ARGS.bin, p)
        argv = [ARGS.valgrind] + vg_options(log_dir, p) + [real]
        path = os.path.join(wrap_dir, p)
        with open(path, "w") as f:
            f.write("#!/bin/sh\n# Runs %s under valgrind memcheck (tests/valgrind).\nexec %s \"$@\"\n"
                    % (p, " ".join(sh_quote(a) for a in argv)))
        os.chmod(path, 0o755)


# ---------------------------------------------------------------------------------------
# Log parsing

LEAK_RE = re.compile(r"^([\d,]+)(?: \(([\d,]+) direct, ([\d,]+) indirect\))? bytes in ([\d,]+) blocks? "
                     r"(?:are|is) (definitely|indirectly|possibly) lost in loss record")
SUMMARY_RE = {k: re.compile(r"^\s*%s: ([\d,]+) bytes in ([\d,]+) blocks" % k.replace("_", " "))
              for k in ("definitely_lost", "indirectly_lost", "possibly_lost", "still_reachable")}
NOT_ERRORS = ("Process terminating with default action", "HEAP SUMMARY", "LEAK SUMMARY",
              "For lists of detected", "For counts of detected", "ERROR SUMMARY", "Memcheck,",
              "Copyright", "Using Valgrind", "Command:", "Parent PID:", "Warning:", "Reachable blocks",
              "To see them", "All heap blocks", "in use at exit", "total heap usage")


def num(s):
    return int(s.replace(",", ""))


class Log:
    def __init__(self, path):
        self.path = path
        self.program = os.path.basename(path).split(".")[0]
        self.pid = int(os.path.basename(path).split(".")[1])
        self.command = ""
        self.ppid = None
        self.exit_report = False   # valgrind's ERROR SUMMARY line is there
        self.error_summary = 0
        self.errors = []           # non-leak error records (lists of lines)
        self.leaks = []            # (kind, record lines)
        self.bytes = dict.fromkeys(SUMMARY_RE, 0)
        self.fork_child = False
        self.parse()

    def parse(self):
        with open(self.path, errors="replace") as f:
            lines = []
            for raw in f:
                m = re.match(r"^==\d+== ?(.*)$", raw.rstrip("\n"))
                if m:
                    lines.append(m.group(1))
        block = []
        for line in lines + [""]:
            if line.strip():
                block.append(line)
                continue
            if block:
                self.record(block)
            block = []

    def record(self, block):
        for line in block:
            if line.startswith("Command: "):
                self.command = line[len("Command: "):]
            elif line.startswith("Parent PID: "):
                self.ppid = int(line.split()[-1])
            m = re.match(r"^ERROR SUMMARY: ([\d,]+) errors", line)
            if m:
                self.exit_report = True
                self.error_summary = num(m.group(1))
            for k, r in SUMMARY_RE.items():
                m = r.match(line)
                if m:
                    self.bytes[k] = num(m.group(1))
        body = [l for l in block if not re.match(r"^Thread \d+( .*)?:$", l)]
        if not body or not any(re.match(r"^\s+(at|by) 0x", l) for l in body):
            return
        title = body[0].strip()
        if title.startswith(NOT_ERRORS):
            return
        m = LEAK_RE.match(title)
        if m:
            self.leaks.append((m.group(5), body))
        else:
            self.errors.append(body)

    def counted_errors(self):
        """The records that fail the test."""
        out = [("error", b) for b in self.errors]
        if not self.fork_child:
            out += [(k, b) for k, b in self.leaks if k in ("definitely", "indirectly")]
        return out


def load_logs(log_dir):
    logs = [Log(p) for p in sorted(glob.glob(os.path.join(log_dir, "*.*.log")))]
    by_prog = {}
    for lg in logs:
        by_prog.setdefault(lg.program, set()).add(lg.pid)
    for lg in logs:
        lg.fork_child = lg.ppid in by_prog.get(lg.program, ())
    return logs


def check_logs(logs, job):
    problems = []
    for lg in logs:
        name = "%s (%s pid %d, %s)" % (job, lg.program, lg.pid, os.path.basename(lg.path))
        if not lg.fork_child and not lg.exit_report:
            problems.append("%s: no exit report from valgrind (killed, or crashed?)" % name)
        bad = lg.counted_errors()
        for kind, body in bad:
            problems.append("%s: %s\n      %s" % (name, kind, "\n      ".join(body)))
        if not lg.fork_child and lg.error_summary and not bad:
            problems.append("%s: valgrind counts %d errors that this script could not parse; see %s"
                            % (name, lg.error_summary, lg.path))
        # A fork child's ERROR SUMMARY also counts what its parent reported before the fork
        # (in the parent's log), so it cannot be compared with the child's own records.
    return problems


# ---------------------------------------------------------------------------------------


def run_job(name, arg, expect, lib, tally):
    mark = uuid.uuid4().hex
    root = tempfile.mkdtemp(prefix="hvd-valgrind-")
    log_dir, wrap_dir = os.path.join(root, "logs"), os.path.join(root, "wrap")
    work, tdir = os.path.join(root, "work"), os.path.join(root, "tmp")
    for d in (log_dir, work, tdir):
        os.mkdir(d)
    make_wrappers(wrap_dir, log_dir)
    out = os.path.join(work, "results.json")
    cmd = ([ARGS.valgrind] + vg_options(log_dir, "hvd-driver") +
           [os.path.join(ARGS.bin, "hvd-driver"), "run", "-np", "4", "--local", "2",
            "--results-json", out, "--entry", (lib or ARGS.probe_lib) + ":probe_entry"] +
           (["--entry-arg", arg] if arg else []))
    problems = []
    t0 = time.time()
    env = hvdtest.marked_env(mark, ARGS.bin, TMPDIR=tdir, HVD_BIN_DIR=wrap_dir)
    try:
        rc, _, stderr, _ = hvdtest.run(cmd, env, JOB_TIMEOUT, work)
    except subprocess.TimeoutExpired as e:
        rc, stderr = None, (e.stderr or b"").decode(errors="replace")
        problems.append("%s: the job did not end within %d s" % (name, JOB_TIMEOUT))
    dt = time.time() - t0
    if rc is not None and lib:
        if rc in (0, ERROR_EXIT):
            problems.append("%s: hvd-driver exited %d, expected a usage failure:\n%s" % (name, rc, stderr[-3000:]))
    elif rc is not None:
        if expect == 0 and rc != 0:
            problems.append("%s: hvd-driver exited %d, expected 0:\n%s" % (name, rc, stderr[-3000:]))
        if expect != 0 and rc in (0, ERROR_EXIT):
            problems.append("%s: hvd-driver exited %d, expected a failed job:\n%s" % (name, rc, stderr[-3000:]))
        try:
            with open(out) as f:
                ranks = json.load(f)["ranks"]
            ok = [r["rank"] for r in ranks if r.get("reported") and r.get("status") == 0]
            want = [0, 1, 2, 3] if expect == 0 else [0, 1, 2]
            if expect == 0 and ok != want:
                problems.append("%s: ranks that succeeded: %s, expected %s" % (name, ok, want))
            if expect != 0 and not any(r["rank"] == 3 and r.get("status") not in (0, None) for r in ranks):
                problems.append("%s: rank 3 is not reported as failed: %s" % (name, ranks))
        except (OSError, ValueError, KeyError) as e:
            problems.append("%s: no usable results file: %r\n%s" % (name, e, stderr[-3000:]))
    left = hvdtest.leftovers(mark, 15)
    if left:
        problems.append("%s: processes of the job left behind:\n  %s" % (name, "\n  ".join(left)))
    logs = load_logs(log_dir)
    problems += check_logs(logs, name)
    for prog in PROGRAMS:
        mine = [lg for lg in logs if lg.program == prog]
        if not any(not lg.fork_child and lg.exit_report for lg in mine) and (not lib or prog == "hvd-driver"):
            problems.append("%s: no process of %s ran under valgrind" % (name, prog))
        t = tally.setdefault(prog, {"processes": 0, "forks": 0, "errors": 0, "definitely_lost": 0,
                                    "indirectly_lost": 0, "possibly_lost": 0, "still_reachable": 0})
        for lg in mine:
            if lg.fork_child:
                if lg.exit_report:
                    t["forks"] += 1
                    t["errors"] += len(lg.counted_errors())
                continue
            t["processes"] += 1
            t["errors"] += len(lg.counted_errors())
            for k in SUMMARY_RE:
                t[k] += lg.bytes[k]
    counts = ", ".join("%s %d" % (prog, sum(1 for lg in logs if lg.program == prog and not lg.fork_child))
                       for prog in PROGRAMS)
    print("%s %-13s %5.1f s  status=%s  processes: %s  logs: %s" % (
        "ok  " if not problems else "FAIL", name, dt, rc, counts, log_dir if ARGS.keep else "(removed)"),
        flush=True)
    for pr in problems:
        print("  " + pr, flush=True)
    if not ARGS.keep and not problems:
        shutil.rmtree(root, ignore_errors=True)
    elif problems:
        print("  logs kept in " + log_dir, flush=True)
    return problems


def doc_body(tally, jobs, version, failed, elapsed):
    rows = ["| program | processes checked | fork children checked | errors | definitely lost (bytes) "
            "| indirectly lost (bytes) | possibly lost (bytes) | still reachable (bytes) |",
            "|---|---|---|---|---|---|---|---|"]
    for prog in PROGRAMS:
        t = tally.get(prog)
        if not t:
            continue
        rows.append("| %s | %d | %d | %d | %d | %d | %d | %d |" % (
            prog, t["processes"], t["forks"], t["errors"], t["definitely_lost"], t["indirectly_lost"],
            t["possibly_lost"], t["still_reachable"]))
    supps = [os.path.basename(p) for p in sorted(glob.glob(os.path.join(HERE, "*.supp")))]
    return ("## Memcheck (tests/valgrind/test_valgrind.py)\n\n"
            "%s, %s; jobs: %s (`hvd-driver run -np 4 --local 2 --entry libprobe_entry.so:probe_entry`, "
            "`failing_rank`: rank 3 fails in its entry, `bad_entry`: the entry library does not exist); "
            "%.0f s in all. Verdict: **%s**. Regenerate with `python3 tests/valgrind/test_valgrind.py "
            "--bin build/bin --probe-lib build/tests/e2e/libprobe_entry.so --write-doc`.\n\n"
            "hvd-driver, every hvd-task, hvd-rsh and hvd-exec run under `valgrind --tool=memcheck "
            "--leak-check=full --errors-for-leak-kinds=definite,indirect`; mpirun and orted run "
            "natively. *Errors*: invalid reads/writes/frees, uninitialised values and definitely or "
            "indirectly lost blocks, all of which fail the test. Byte columns are summed over the "
            "programs' own processes. *Fork children checked*: children that exit without exec "
            "(the command keeper with HVD_KEEPER=none; by default it is hvd-keeper, exec'd, which runs "
            "natively), checked for errors but not for leaks (blocks that only the "
            "parent's other threads pointed to look lost in a forked child). *Possibly lost* and "
            "*still reachable* are informational (possibly lost: the thread stacks glibc caches after a join; "
            "still reachable of hvd-exec varies between runs of failing_rank, where mpirun ends the job "
            "early). "
            "Suppressions: %s.\n\n" % (
                version, datetime.date.today().isoformat(), ", ".join(jobs), elapsed,
                "clean" if not failed else "FAILED", ", ".join(supps) or "none") +
            "\n".join(rows) + "\n")


def main():
    global ARGS
    ap = hvdtest.arg_parser("--bin", "--probe-lib")
    ap.add_argument("--valgrind", default="valgrind")
    reldoc.add_options(ap)
    ap.add_argument("--keep", action="store_true", help="keep the logs of every job")
    ap.add_argument("jobs", nargs="*")
    ARGS = ap.parse_args()
    if os.environ.get("HVD_SANITIZE"):
        hvdtest.skip("sanitizer build (HVD_SANITIZE=%s): valgrind does not run sanitized programs"
                     % os.environ["HVD_SANITIZE"])
    vg = shutil.which(ARGS.valgrind)
    if not vg:
        hvdtest.skip("valgrind is not installed (scripts/install-deps.sh installs it)")
    ARGS.valgrind = vg
    if not shutil.which("mpirun"):
        hvdtest.skip("mpirun is not installed")
    version = subprocess.run([vg, "--version"], stdout=subprocess.PIPE).stdout.decode().strip()
    names = ARGS.jobs or list(JOBS)
    tally, failed = {}, 0
    t0 = time.time()
    for name in names:
        arg, expect, lib = JOBS[name]
        try:
            problems = run_job(name, arg, expect, lib, tally)
        except Exception as e:  # a harness error fails the job
            problems = ["harness: %r" % e]
            print("FAIL %s: %r" % (name, e), flush=True)
        failed += bool(problems)
    elapsed = time.time() - t0
    for prog in PROGRAMS:
        t = tally.get(prog)
        if t:
            print("%-10s processes %d, fork children %d, errors %d, definitely lost %d B, indirectly lost "
                  "%d B, possibly lost %d B, still reachable %d B" % (
                      prog, t["processes"], t["forks"], t["errors"], t["definitely_lost"],
                      t["indirectly_lost"], t["possibly_lost"], t["still_reachable"]))
    print("%d passed, %d failed (%.1f s)" % (len(names) - failed, failed, elapsed))
    if ARGS.write_doc:
        reldoc.write_section(ARGS.doc, "valgrind",
                             doc_body(tally, names, version, failed, elapsed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
