#!/usr/bin/env python3
"""Fault injection: kill one process of a real job at a chosen phase and check how the job ends.

    test_faults.py --bin DIR --probe-lib LIB [--full] [--write-doc] [--doc FILE] [CELL...]

A cell is PHASE:VICTIM:SIGNAL, for example running:rank:KILL. Phases:

  registration  hvd-driver run -np 4 (no --local): the harness starts tasks 0, 2 and 3
                itself (host A = task 0, host B = tasks 2 and 3) and kills the victim while
                task 1 is missing; then it starts task 1 (not when the driver was the victim:
                a task that cannot reach its driver retries until its --start-timeout).
  launch        hvd-driver run -np 4 --local 2: the victim is killed as soon as the first
                hvd-rsh process appears (mpirun is launching the orteds).
  running       --local 2, every rank sleeps in its entry (probe "sleep=30").
  collection    --local 2, ranks 0-2 returned and reported their results, rank 3 is still
                in its entry (probe "sleep=30:3").

Victims (on the second fake host, so that rank 0 and its host are untouched, except for
mpirun and the driver): driver (hvd-driver), first_task (task 2, runs orted for host B),
sibling (task 3), rsh (the hvd-rsh of host B), orted (host B's), rank (rank 3's hvd-exec),
mpirun.

Each cell checks: the job ends within 15 s of the kill (hvd-driver exits; when the driver is
the victim, every process of the job is gone); the driver's exit status is non-zero (a rank
killed in its entry fails the whole MPI job: mpirun aborts every rank, so no cell expects 0);
no process of the job is left (processes carry HVD_E2E_MARK, /proc is scanned); no
hvd-driver.*, hvd-mpirun.* (mpirun's TMPDIR) or Open MPI session directory is left in the
cell's TMPDIR and no new /dev/shm/hvd-task-* directory is left. The driver's message is recorded, and whether it names the victim.

A network partition is the cell running:link:DOWN: hvd-driver (and mpirun) in one network
namespace, tasks 0-1 in a second (host A), tasks 2-3 in a third (host B), joined by veth
pairs on a bridge (as in tests/e2e test_netns_hosts); once every rank sleeps in its entry,
host B's veth is set down on the bridge side, so that its packets are black-holed (no RST,
no FIN). It checks: hvd-driver exits non-zero within PARTITION_LIMIT (20 s) of the link going
down. The default --net-timeout is 15 s: keepalive notices the silence 10-16 s after the cut
and the driver stops the job at once (a timed-out connection is never a normal end); mpirun
cannot reach host B's orted either, so it is killed 1 s after its SIGTERM: 11-17 s in all. One line of the driver says it lost contact with
host B's tasks (names e2e-faults-b or task 2/3) and that the connection timed out; the tasks
in host B's namespace notice too and end their command (no process of the job is left within
PARTITION_LIMIT + 10 s), and no temp file is left. The namespaces, veths and bridge are
removed at the end whatever happens. Skipped (with the reason) when not root or when
namespaces or bridges cannot be made.

Without cell names: the CI subset (running phase, SIGKILL, three SIGTERM cells, and the
partition); --full: the whole matrix and the partition.
--write-doc writes the results table into docs/reliability.md.
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, HERE)
import hvdtest  # noqa: E402
import reldoc  # noqa: E402
from hvdtest import Skip  # noqa: E402

ARGS = None
PHASES = ["registration", "launch", "running", "collection"]
VICTIMS = ["driver", "first_task", "sibling", "rsh", "orted", "rank", "mpirun"]
SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM}
END_LIMIT = 15.0
# What the driver's last line must say for each victim: the part (any of these words) and,
# for a part on host B, that host (its host hash ends in -1, or is e2e-faults-b).
NAMES = {
    "driver": None,
    "first_task": ["task 2"],
    "sibling": ["task 3"],
    "rsh": ["hvd-rsh", "agent"],
    "orted": ["orted"],
    "rank": ["rank 3"],
    "mpirun": ["mpirun"],
}
HOST_B = re.compile(r"(-1\b|e2e-faults-b)")
# Cells whose victim the driver cannot always name, and why (docs/reliability.md shows them as
# "no (known)"; any other unnamed cell fails).
KNOWN_UNNAMED = {
    "launch:rsh:KILL": "an agent killed before it reached the driver leaves no trace there, and "
                       "mpirun's own message names no host: when no agent came at all, the driver "
                       "says so (hvd-rsh named, no host); when another host's agent came first, "
                       "the host is named",
    "launch:rsh:TERM": "the same when the signal comes before the agent installed its handler (it "
                       "is killed as soon as it appears) or reached the driver",
    "launch:mpirun:TERM": "mpirun stopped by SIGTERM while it starts the daemons exits 1, as do "
                          "the orteds it leaves: nothing tells it from an orted failing",
}
ON_HOST_B = {"first_task", "sibling", "rsh", "orted", "rank", "link"}
# Victims that do not exist in a phase.
NOT_APPLICABLE = {
    ("registration", "rsh"), ("registration", "orted"), ("registration", "rank"),
    ("registration", "mpirun"), ("launch", "rank"),
}
PARTITION_CELL = "running:link:DOWN"
PARTITION_LIMIT = 20.0   # from the link going down to hvd-driver's exit (10-17 s expected)
NAMES["link"] = ["e2e-faults-b", "task 2", "task 3"]
CI_CELLS = ["running:%s:KILL" % v for v in VICTIMS] + \
    ["running:%s:TERM" % v for v in ("first_task", "rsh", "rank")] + [PARTITION_CELL]


def job_env(mark, tmpdir, work):
    return hvdtest.marked_env(mark, ARGS.bin, TMPDIR=tmpdir, HVD_E2E_DIR=work)


SEEN_SHM = set()  # Open MPI backing directories seen in the job's processes


def processes_with(mark):
    """{pid: hvdtest.Proc} of the job's live processes; notes their shared-memory dirs."""
    found = hvdtest.processes_with(mark)
    for p in found.values():
        shm = p.env.get("OMPI_MCA_btl_vader_backing_directory")
        if shm:
            SEEN_SHM.add(shm)
    return found


def base(argv):
    return os.path.basename(argv[0]) if argv else ""


def find_victim(victim, procs, driver_pid):
    """The pid of the victim among the marked processes, or None."""
    for pid, p in sorted(procs.items()):
        argv, env = p.argv, p.env
        b = base(argv)
        if victim == "driver" and pid == driver_pid:
            return pid
        if victim in ("first_task", "sibling") and b == "hvd-task":
            want = "2" if victim == "first_task" else "3"
            if "--index" in argv and argv[argv.index("--index") + 1] == want:
                return pid
        if victim == "rsh" and b in ("hvd-rsh", "mpirun_rsh"):
            if any(re.search(r"-1$", a) or a == "e2e-faults-b" for a in argv):
                return pid
        if victim == "orted" and b == "orted" and env.get("HVD_TASK_INDEX") == "2":
            return pid
        if victim == "rank" and b in ("hvd-exec", "mpirun_exec_fn") and \
                env.get("OMPI_COMM_WORLD_RANK") == "3":
            return pid
        if victim == "mpirun" and b in ("mpirun", "orterun", "mpiexec"):
            return pid
    return None


def states(d):
    out = {}
    for p in glob.glob(os.path.join(d, "state.*")):
        try:
            with open(p) as f:
                out[int(p.rsplit(".", 1)[1])] = f.read().strip()
        except (OSError, ValueError):
            pass
    return out


def driver_message(stderr):
    """The driver's own lines that explain the failure (the table excepted), and the first
    line of another hvd- program (hvd-rsh, hvd-task, hvd-exec) that explains it."""
    lines = [l.strip() for l in stderr.splitlines() if l.strip()]
    own = [l for l in lines if l.startswith("hvd-driver:") and
           not re.match(r"hvd-driver:\s+(rank\s+task|\d+\s+(\d+|-)\s)", l)]
    other = [l for l in lines if re.match(r"(\[[^]]*\]<std\w+>:)?\s*hvd-(rsh|task|exec)", l)]
    return own[-2:], other[:1]


class Cell:
    def __init__(self, phase, victim, sig):
        self.phase, self.victim, self.sig = phase, victim, sig
        self.name = "%s:%s:%s" % (phase, victim, sig)
        self.end_s = None      # seconds from the kill to the end of the job
        self.status = None     # hvd-driver's exit status (or -signal)
        self.message = []
        self.names_victim = None   # the driver's own lines name the victim
        self.others_name = None    # some hvd- program's line names it
        self.leftovers = []
        self.failures = []
        self.note = ""
        self.skipped = None    # why the cell could not run here

    def fail(self, what):
        self.failures.append(what)


def cell_dirs():
    """A cell's directory (tmp), with the job's work dir and TMPDIR in it, and the
    /dev/shm/hvd-task-* directories there before the job."""
    tmp = tempfile.mkdtemp(prefix="hvd-faults-")
    work = os.path.join(tmp, "work")
    tdir = os.path.join(tmp, "tmp")
    os.mkdir(work)
    os.mkdir(tdir)
    return tmp, work, tdir, hvdtest.shm_dirs()


def host_of(i):
    """The host hash of task i: tasks 0-1 on host A, 2-3 on host B."""
    return "e2e-faults-a" if i < 2 else "e2e-faults-b"


def task_env(cell, drv, errf, env):
    """The environment of the tasks the driver waits for (from what it printed to errf), or
    None after failing the cell when it said nothing within 20 s."""
    try:
        return dict(env, **hvdtest.task_hint(drv, timeout=20, errfile=errf))
    except hvdtest.Failure as e:
        cell.fail(str(e))
        return None


def note_overrun(cell, drv, since):
    """The driver outlived its limit: how long it would have taken (--overrun S waits that
    much longer)."""
    try:
        drv.wait(timeout=ARGS.overrun)
        cell.note = "ended by itself after %.1f s" % (time.time() - since)
    except subprocess.TimeoutExpired:
        cell.note = "still running after %.0f s" % (time.time() - since)


def run_cell(cell):
    mark = uuid.uuid4().hex
    tmp, work, tdir, shm_before = cell_dirs()
    env = job_env(mark, tdir, work)
    entry = ARGS.probe_lib + ":probe_entry"
    arg = {"registration": "sleep=30", "launch": "sleep=30", "running": "sleep=30",
           "collection": "sleep=30:3"}[cell.phase]
    tasks = []
    args = ["run", "-np", "4"] + (["--local", "2"] if cell.phase != "registration" else []) + \
        ["--start-timeout", "60", "--entry", entry, "--entry-arg", arg]
    errf = open(os.path.join(tmp, "driver.err"), "w+b")
    drv = hvdtest.start_driver(ARGS.bin, args, env, work, stdout=subprocess.DEVNULL, stderr=errf)
    victim_pid = None
    t_kill = None
    try:
        if cell.phase == "registration":
            tenv = task_env(cell, drv, errf, env)
            if tenv is None:
                return

            def start_task(i):
                return hvdtest.start_task(ARGS.bin, i, tenv, host_of(i), cwd=work)
            for i in (0, 2, 3):
                tasks.append(start_task(i))
            time.sleep(1.5)  # tasks 0, 2, 3 register; task 1 is missing
            victim_pid = find_victim(cell.victim, processes_with(mark), drv.pid)
        else:
            deadline = time.time() + 40
            while time.time() < deadline and drv.poll() is None:
                st = states(work)  # before the processes: a rank says "sleeping" once it runs
                procs = processes_with(mark)
                if cell.phase == "launch":
                    ready = any(base(p.argv) in ("hvd-rsh", "mpirun_rsh") for p in procs.values())
                elif cell.phase == "running":
                    ready = len(st) == 4 and all(v == "sleeping" for v in st.values())
                else:
                    ready = all(st.get(r) == "done" for r in range(3)) and st.get(3) == "sleeping"
                    if ready:
                        time.sleep(0.5)  # the results of ranks 0-2 reach the driver
                        procs = processes_with(mark)
                if ready:
                    victim_pid = find_victim(cell.victim, procs, drv.pid)
                    if victim_pid or cell.phase != "launch" or time.time() > deadline - 35:
                        break
                time.sleep(0.02 if cell.phase == "launch" else 0.1)
            if cell.phase == "launch":
                cell.note = "ranks in entry at kill: %d" % len(states(work))
        if drv.poll() is not None:
            cell.fail("the job ended before the kill (status %d)" % drv.returncode)
            return
        if victim_pid is None:
            cell.fail("victim not found at phase %s" % cell.phase)
            return
        t_kill = time.time()
        try:
            os.kill(victim_pid, SIGNALS[cell.sig])
        except OSError as e:
            cell.fail("kill: %s" % e)
        if cell.phase == "registration":
            if cell.victim != "driver":
                tasks.append(start_task(1))  # the missing task arrives
            else:
                # A task started after the driver died retries registering until its own
                # --start-timeout (60 s here): the missing task never arrives in this cell.
                cell.note = "task 1 not started"
        # The end of the job.
        while time.time() - t_kill < END_LIMIT:
            if cell.victim == "driver":
                drv.poll()
                if not processes_with(mark):
                    break
            elif drv.poll() is not None:
                break
            time.sleep(0.05)
        drv.poll()
        if cell.victim == "driver":
            cell.status = drv.returncode
            left = processes_with(mark)
            if left:
                cell.fail("the job's processes were still running %.0f s after the driver died" % END_LIMIT)
            else:
                cell.end_s = time.time() - t_kill
        elif drv.returncode is None:
            cell.fail("hvd-driver still running %.0f s after the kill" % END_LIMIT)
            note_overrun(cell, drv, t_kill)
        else:
            cell.end_s = time.time() - t_kill
            cell.status = drv.returncode
            if drv.returncode == 0:
                cell.fail("hvd-driver exited 0")
    finally:
        hvdtest.stop(drv, 10, signal.SIGTERM)
        if cell.status is None and drv.returncode is not None and cell.victim != "driver":
            cell.status = drv.returncode
        for t in tasks:
            try:
                t.wait(timeout=max(0.1, 8 - (time.time() - (t_kill or time.time()))))
            except subprocess.TimeoutExpired:
                pass
        # Leftover processes: a short grace after the end, then anything marked is reported.
        note_leftovers(cell, hvdtest.wait_gone(lambda: processes_with(mark), 3))
        for t in tasks:
            hvdtest.stop(t, 0)
        errf.seek(0)
        stderr = errf.read().decode(errors="replace")
        errf.close()
        own, other = driver_message(stderr)
        cell.message = own + other
        judge_names(cell, own, stderr)
        check_files_left(cell, tdir, tmp, shm_before)


def names(cell, line):
    """Whether a line names the cell's victim: the part and, for one on host B, the host."""
    return any(w in line for w in NAMES[cell.victim]) and (
        cell.victim not in ON_HOST_B or HOST_B.search(line) is not None)


def judge_names(cell, own, stderr):
    """The verdict requires the driver's last line to name the victim (DESIGN.md: a failed job
    names the part that failed); whether another hvd- program's line names it is recorded."""
    if NAMES[cell.victim] is None:
        return
    cell.names_victim = bool(own) and names(cell, own[-1])
    cell.others_name = any(names(cell, l) for l in stderr.splitlines()
                           if re.match(r"(\[[^]]*\]<std\w+>:)?\s*hvd-", l))
    if cell.status not in (None, 0) and not cell.names_victim:
        if cell.name in KNOWN_UNNAMED:
            cell.note = (cell.note + "; " if cell.note else "") + \
                "not named (known: %s)" % KNOWN_UNNAMED[cell.name]
        else:
            cell.fail("the driver's last line does not name the %s on its host: %r" %
                      (cell.victim, own[-1] if own else ""))


def note_leftovers(cell, left):
    """Records the job's processes still there ({pid: Proc}) as the cell's leftovers, and
    SIGKILLs them."""
    for pid, p in sorted(left.items()):
        what = base(p.argv)
        if "--index" in p.argv[:-1]:
            what += " --index " + p.argv[p.argv.index("--index") + 1]
        cell.leftovers.append("%s (pid %d)" % (what, pid))
    hvdtest.kill(left)


def check_files_left(cell, tdir, tmp, shm_before):
    """Fails the cell for the job's files left behind (its private dirs in TMPDIR: hvd-driver's
    and mpirun's, with Open MPI's session directory in it; an Open MPI session directory made
    beside them; the /dev/shm backing dirs its processes named), then removes them and the
    cell's dir."""
    for prefix in ("hvd-driver.", "hvd-mpirun.", "ompi.", "prte."):
        for d in hvdtest.entries_left([tdir], prefix):
            cell.leftovers.append("TMPDIR/" + os.path.basename(d))
    time.sleep(0.2)
    # Only the job's own directories: those its processes named (others' jobs run too).
    new_shm = (hvdtest.shm_dirs() - shm_before) & SEEN_SHM
    for d in sorted(new_shm):
        cell.leftovers.append(d)
    if cell.leftovers:
        cell.fail("left behind: " + ", ".join(cell.leftovers))
    if ARGS.keep:
        print("    kept %s" % tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
        for d in new_shm:
            shutil.rmtree(d, ignore_errors=True)


def run_partition_cell(cell):
    """running:link:DOWN (see the docstring): host B's link goes down while ranks run."""
    hvdtest.NetnsHosts.check_possible()
    net = hvdtest.NetnsHosts("abd", net="10.79", prefix="hvdf")   # host A, host B, the driver's
    mark = uuid.uuid4().hex
    tmp, work, tdir, shm_before = cell_dirs()
    drv = None
    tasks = []
    errf = open(os.path.join(tmp, "driver.err"), "w+b")
    try:
        net.create()
        env = job_env(mark, tdir, work)
        drv = hvdtest.start_driver(ARGS.bin, ["run", "-np", "4", "--start-timeout", "60", "--entry",
                                              ARGS.probe_lib + ":probe_entry", "--entry-arg", "sleep=60"],
                                   env, work, prefix=net.exec_in("d"), stdout=subprocess.DEVNULL, stderr=errf)
        tenv = task_env(cell, drv, errf, env)
        if tenv is None:
            return
        for i in range(4):
            tasks.append(hvdtest.start_task(ARGS.bin, i, tenv, host_of(i), cwd=work,
                                            prefix=net.exec_in("a" if i < 2 else "b")))
        deadline = time.time() + 60
        while time.time() < deadline and drv.poll() is None:
            st = states(work)
            if len(st) == 4 and all(v == "sleeping" for v in st.values()):
                break
            time.sleep(0.1)
        if drv.poll() is not None:
            cell.fail("the job ended before the link went down (status %d)" % drv.returncode)
            return
        if len(states(work)) != 4:
            cell.fail("the ranks did not all reach their entry within 60 s")
            return
        processes_with(mark)  # note the job's shared-memory directories
        t_cut = time.time()
        hvdtest.sh("ip", "link", "set", net.veth["b"], "down")
        try:
            drv.wait(timeout=PARTITION_LIMIT)
            cell.end_s = time.time() - t_cut
            cell.status = drv.returncode
            if drv.returncode == 0:
                cell.fail("hvd-driver exited 0")
        except subprocess.TimeoutExpired:
            cell.fail("hvd-driver still running %.0f s after the link went down" % PARTITION_LIMIT)
            note_overrun(cell, drv, t_cut)
        # Host B's side ends by itself too (its tasks lose the driver): nothing may be left.
        note_leftovers(cell, hvdtest.wait_gone(lambda: processes_with(mark),
                                               t_cut + PARTITION_LIMIT + 10 - time.time()))
    finally:
        for p in [drv] + tasks:
            if p is not None:
                hvdtest.stop(p, 0)
        hvdtest.kill(processes_with(mark))
        net.remove()
        errf.seek(0)
        stderr = errf.read().decode(errors="replace")
        errf.close()
        own, other = driver_message(stderr)
        cell.message = own + other
        if cell.skipped is None and drv is not None and drv.returncode is not None:
            last = own[-1] if own else ""
            cell.names_victim = "lost contact" in last and "timed out" in last and names(cell, last)
            cell.others_name = cell.names_victim
            if not cell.names_victim:
                cell.fail("the driver's last line does not say it lost contact with host B's "
                          "tasks (timed out): %r" % last)
        check_files_left(cell, tdir, tmp, shm_before)


# ---- Randomised chaos ------------------------------------------------------------------------

CHAOS_KINDS = ["driver", "task", "keeper", "rsh", "orted", "rank", "mpirun"]
CHAOS_WINDOW = 4.0   # the kill comes 0 to this many seconds after the driver started
CHAOS_SLEEP = 3      # each rank sleeps this long in its entry: the kill may come after the end
CHAOS_CI_RUNS = 8
CHAOS_FULL_RUNS = 100


def task_part(argv):
    return "task " + (argv[argv.index("--index") + 1] if "--index" in argv[:-1] else "?")


def chaos_parts(procs, driver_pid):
    """{kind: [(pid, part)]} of the job's processes now; part is what the driver's line should
    name: "task 2", "rank 3", "hvd-rsh", "orted", "mpirun", None for the driver. A keeper (the
    process that runs one command for hvd-driver or hvd-task: a local task, mpirun, orted;
    hvd-keeper, or a forked copy of its owner with HVD_KEEPER=none) is named by its owner's part
    or its command's: "task 2|orted"; one that keeps no process at that moment is left out."""
    out = {k: [] for k in CHAOS_KINDS}
    parents = {pid: hvdtest.parent_of(pid) for pid in procs}
    for pid, p in sorted(procs.items()):
        b, argv = base(p.argv), p.argv
        parent = procs.get(parents[pid])
        owner = base(parent.argv) if parent is not None else None
        if pid == driver_pid:
            out["driver"].append((pid, None))
        elif owner in ("hvd-driver", "hvd-task") and b in (owner, "hvd-keeper"):
            kept = [procs[c] for c in procs if parents[c] == pid and not helper(procs[c].argv)]
            if not kept:  # between commands, or a short helper's (mpirun --version)
                continue
            names = [] if owner == "hvd-driver" else [task_part(parent.argv)]
            for k in kept:
                kb = base(k.argv)
                names.append(task_part(k.argv) if kb == "hvd-task" else "mpirun" if kb in ("mpirun", "orterun")
                             else kb)
            out["keeper"].append((pid, "|".join(names) or "?"))
        elif b == "hvd-task":
            out["task"].append((pid, task_part(argv)))
        elif b in ("hvd-rsh", "mpirun_rsh"):
            out["rsh"].append((pid, "hvd-rsh"))
        elif b == "orted":
            out["orted"].append((pid, "orted"))
        elif b in ("hvd-exec", "mpirun_exec_fn") and "OMPI_COMM_WORLD_RANK" in p.env:
            out["rank"].append((pid, "rank " + p.env["OMPI_COMM_WORLD_RANK"]))
        elif b in ("mpirun", "orterun") and not helper(argv):
            out["mpirun"].append((pid, "mpirun"))
    return out


def helper(argv):
    """Whether argv is the driver's short `mpirun --version` (which MPI is it?): it has done
    its work once it printed, so killing it (or its keeper) then is no fault of the job."""
    return "--version" in argv


CHAOS_WORDS = {"task": None, "keeper": None, "rsh": ["hvd-rsh", "agent"], "orted": ["orted"],
               "rank": None, "mpirun": ["mpirun"]}


def chaos_named(kind, part, line):
    """Whether the driver's last line names the killed part (a task or keeper: its task; a
    rank: that rank)."""
    words = CHAOS_WORDS[kind] or part.split("|")
    return any(re.search(re.escape(w) + r"\b", line) for w in words)


def run_chaos(cell, rng):
    """One randomised chaos run: hvd-driver run -np 4 --local 2 whose ranks sleep CHAOS_SLEEP s;
    at a random moment of the first CHAOS_WINDOW s, SIGKILL of one process of a random kind
    (another kind when none of it is there then). The job must end within END_LIMIT of the
    kill; if the ranks had not all finished, with a non-zero status and the driver's last line
    naming the killed part (once they all had, a failure may instead say that every rank
    succeeded but mpirun did not); nothing may be left."""
    mark = uuid.uuid4().hex
    tmp, work, tdir, shm_before = cell_dirs()
    env = job_env(mark, tdir, work)
    args = ["run", "-np", "4", "--local", "2", "--start-timeout", "60", "--entry",
            ARGS.probe_lib + ":probe_entry", "--entry-arg", "sleep=%d" % CHAOS_SLEEP]
    errf = open(os.path.join(tmp, "driver.err"), "w+b")
    delay = rng.uniform(0, CHAOS_WINDOW)
    want = rng.choice(ARGS.kinds)
    drv = hvdtest.start_driver(ARGS.bin, args, env, work, stdout=subprocess.DEVNULL, stderr=errf)
    t0 = time.time()
    kind = part = None
    finished = False
    try:
        time.sleep(delay)
        parts = chaos_parts(processes_with(mark), drv.pid)
        finished = all(v == "done" for v in states(work).values()) and len(states(work)) == 4
        kinds = [want] + [k for k in CHAOS_KINDS if k != want]
        kind = next((k for k in kinds if parts[k]), None)
        if kind is None or drv.poll() is not None:
            cell.note = "the job had ended at %.1f s: nothing to kill" % delay
            cell.status = drv.wait()
            if cell.status != 0:
                cell.fail("the job failed by itself (status %d)" % cell.status)
            return
        pid, part = rng.choice(parts[kind])
        cell.victim = kind if kind == want else "%s (no %s then)" % (kind, want)
        t_kill = time.time()
        os.kill(pid, signal.SIGKILL)
        cell.note = "%s (%s) killed %.1f s after the start%s" % (
            kind, part or "driver", t_kill - t0, ", ranks done" if finished else "")
        while time.time() - t_kill < END_LIMIT:
            if (kind == "driver" and not processes_with(mark)) or (kind != "driver" and drv.poll() is not None):
                break
            time.sleep(0.05)
        drv.poll()
        if kind == "driver":
            if processes_with(mark):
                cell.fail("the job's processes were still running %.0f s after the driver died" % END_LIMIT)
            else:
                cell.end_s = time.time() - t_kill
        elif drv.returncode is None:
            cell.fail("hvd-driver still running %.0f s after the kill" % END_LIMIT)
        else:
            cell.end_s = time.time() - t_kill
        cell.status = drv.returncode
    finally:
        hvdtest.stop(drv, 10, signal.SIGTERM)
        note_leftovers(cell, hvdtest.wait_gone(lambda: processes_with(mark), 3))
        errf.seek(0)
        stderr = errf.read().decode(errors="replace")
        errf.close()
        own, other = driver_message(stderr)
        cell.message = own + other
        if kind not in (None, "driver") and cell.status not in (None, 0):
            cell.names_victim = bool(own) and chaos_named(kind, part, own[-1])
            # Killed after every rank reported: the results are all in, and the driver cannot
            # tell which process mpirun lost (mpirun's own messages say); it must say the ranks
            # succeeded and why the job still failed.
            after_results = finished and bool(own) and "every rank succeeded but mpirun" in own[-1]
            if kind == "rank":  # mpirun's 128 + 9, read as such
                after_results = after_results and "killed by signal 9" in own[-1]
            if not cell.names_victim and not after_results:
                cell.fail("the driver's last line does not name %s: %r" % (part, own[-1] if own else ""))
        elif kind not in (None, "driver") and cell.status == 0 and not finished:
            cell.fail("hvd-driver exited 0 although %s died before the ranks finished" % part)
        check_files_left(cell, tdir, tmp, shm_before)


def chaos(runs, seed):
    """runs randomised chaos runs (random.Random(seed)); prints one line each; returns the
    cells."""
    import random
    rng = random.Random(seed)
    cells = []
    for i in range(runs):
        c = Cell("chaos", "?", "KILL")
        c.name = "chaos %d" % (i + 1)
        t0 = time.time()
        try:
            run_chaos(c, rng)
        except Exception as e:  # a harness error fails the run, the others go on
            c.fail("harness: %r" % e)
        cells.append(c)
        print("%s %-9s %5.1f s  %s; end=%s status=%s msg=%r%s" % (
            "ok  " if not c.failures else "FAIL", c.name, time.time() - t0, c.note,
            "%.1f" % c.end_s if c.end_s is not None else "-", c.status, " / ".join(c.message)[:200],
            "" if not c.failures else "\n     " + "; ".join(c.failures)), flush=True)
    return cells


def chaos_doc(cells, seed):
    from collections import Counter
    kinds = Counter(c.victim.split(" ")[0] for c in cells if c.victim != "?")
    ends = sorted(c.end_s for c in cells if c.end_s is not None)
    failed = [c for c in cells if c.failures]
    L = ["## Randomised chaos (tests/faults/test_faults.py --chaos %d --seed %d)" % (len(cells), seed), "",
         "Job: `hvd-driver run -np 4 --local 2`, ranks sleeping %d s in the probe entry. Each run SIGKILLs one "
         "process of a random kind (driver, task, keeper, hvd-rsh, orted, rank, mpirun; another kind when "
         "none of it exists at that moment) at a random moment of the first %.0f s. Pass: the job ends "
         "within %.0f s of the kill (the driver: every process of the job gone); when the ranks had not all "
         "finished, with a non-zero status and the driver's last line naming the killed part (once they had, "
         "a failure may instead say that every rank succeeded but mpirun did not); no process, "
         "`hvd-driver.*` or `/dev/shm/hvd-task-*` left. CI runs %d; this table is %d." % (
             CHAOS_SLEEP, CHAOS_WINDOW, END_LIMIT, CHAOS_CI_RUNS, len(cells)), "",
         "%d of %d runs passed. Victims: %s. Time from the kill to the end: median %s s, max %s s." % (
             len(cells) - len(failed), len(cells), ", ".join("%s %d" % kv for kv in sorted(kinds.items())),
             "%.1f" % ends[len(ends) // 2] if ends else "-", "%.1f" % ends[-1] if ends else "-"), ""]
    L.append("| run | what was killed, when | end (s) | status | driver's last line (excerpt) | verdict |")
    L.append("|---|---|---|---|---|---|")
    for c in cells:
        msg = " / ".join(c.message)
        L.append("| %s | %s | %s | %s | %s | %s |" % (
            c.name.split()[1], reldoc.md_cell(c.note), "%.1f" % c.end_s if c.end_s is not None else "-",
            c.status if c.status is not None else "-", reldoc.md_cell(msg[:160] + ("..." if len(msg) > 160 else "")),
            "ok" if not c.failures else "**FAIL**: " + reldoc.md_cell("; ".join(c.failures))[:200]))
    return "\n".join(L)


def all_cells():
    return ["%s:%s:%s" % (p, v, s) for p in PHASES for v in VICTIMS for s in SIGNALS
            if (p, v) not in NOT_APPLICABLE] + [PARTITION_CELL]


def table(cells):
    out = ["| phase | victim | signal | end (s) | driver status | names victim (driver / any hvd- line) | message (excerpt) | leftovers | verdict |",
           "|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        msg = " / ".join(c.message)
        if len(msg) > 220:
            msg = msg[:217] + "..."
        if c.note:
            msg = "(%s) %s" % (c.note, msg)
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            c.phase, c.victim, c.sig,
            "%.1f" % c.end_s if c.end_s is not None else
            "> %.0f" % (PARTITION_LIMIT if c.victim == "link" else END_LIMIT),
            c.status if c.status is not None else "-",
            "%s / %s" % ({None: "n/a", True: "yes", False: "no"}[c.names_victim] +
                         (" (known)" if c.names_victim is False and c.name in KNOWN_UNNAMED else ""),
                         {None: "n/a", True: "yes", False: "no"}[c.others_name]),
            reldoc.md_cell(msg), reldoc.md_cell(", ".join(c.leftovers) or "none"),
            ("skipped: " + reldoc.md_cell(c.skipped)) if c.skipped is not None and not c.failures
            else "ok" if not c.failures else
            "**FAIL**: " + reldoc.md_cell("; ".join(c.failures))[:200]))
    return "\n".join(out)


def main():
    global ARGS
    ap = hvdtest.arg_parser("--bin", "--probe-lib")
    ap.add_argument("--full", action="store_true", help="the whole matrix")
    reldoc.add_options(ap)
    ap.add_argument("--overrun", type=float, default=0,
                    help="when a job outlives the limit, wait this much longer to learn when it ends")
    ap.add_argument("--keep", action="store_true", help="keep each cell's directory")
    ap.add_argument("--chaos", type=int, metavar="N",
                    help="run N randomised chaos runs instead of cells (%d in CI; --full: %d)" % (
                        CHAOS_CI_RUNS, CHAOS_FULL_RUNS))
    ap.add_argument("--seed", type=int, default=None, help="the chaos runs' random seed (default: random)")
    ap.add_argument("--kinds", default=",".join(CHAOS_KINDS),
                    help="the kinds of process chaos runs kill, comma-separated (default: all: %(default)s)")
    ap.add_argument("cells", nargs="*")
    ARGS = ap.parse_args()
    ARGS.kinds = [k for k in ARGS.kinds.split(",") if k]
    if set(ARGS.kinds) - set(CHAOS_KINDS):
        ap.error("--kinds: unknown kind(s) %s" % ", ".join(sorted(set(ARGS.kinds) - set(CHAOS_KINDS))))
    if ARGS.chaos is not None:
        import random
        seed = ARGS.seed if ARGS.seed is not None else random.randrange(1 << 30)
        runs = max(ARGS.chaos, CHAOS_FULL_RUNS) if ARGS.full else ARGS.chaos
        print("chaos: %d runs, --seed %d" % (runs, seed), flush=True)
        cells = chaos(runs, seed)
        failed = sum(1 for c in cells if c.failures)
        print("%d passed, %d failed" % (len(cells) - failed, failed))
        if ARGS.write_doc:
            reldoc.write_section(ARGS.doc, "chaos", chaos_doc(cells, seed))
        return 1 if failed else 0
    names = ARGS.cells or (all_cells() if ARGS.full else CI_CELLS)
    cells = []
    for name in names:
        phase, victim, sig = name.split(":")
        c = Cell(phase, victim, sig)
        t0 = time.time()
        try:
            if victim == "link":
                run_partition_cell(c)
            else:
                run_cell(c)
        except Skip as e:
            c.skipped = str(e)
        except Exception as e:  # a harness error fails the cell, the run goes on
            c.fail("harness: %r" % e)
        cells.append(c)
        if c.skipped is not None:
            print("skip %-28s %s" % (name, c.skipped), flush=True)
            continue
        print("%s %-28s %5.1f s  end=%s status=%s names=%s msg=%r%s" % (
            "ok  " if not c.failures else "FAIL", name, time.time() - t0,
            "%.1f" % c.end_s if c.end_s is not None else "-", c.status, c.names_victim,
            " / ".join(c.message)[:200], "" if not c.failures else "\n     " + "; ".join(c.failures)),
            flush=True)
    failed = sum(1 for c in cells if c.failures)
    skipped = sum(1 for c in cells if c.skipped is not None and not c.failures)
    print("%d passed, %d failed, %d skipped" % (len(cells) - failed - skipped, failed, skipped))
    if ARGS.write_doc:
        body = ("## Fault injection (tests/faults/test_faults.py%s)\n\n" % (" --full" if ARGS.full else "") +
                "Job: `hvd-driver run -np 4 --local 2 --entry libprobe_entry.so:probe_entry` (registration "
                "phase: tasks started by hand, see the script's docstring). Victims live on the second "
                "host: first_task = task 2, sibling = task 3, rank = rank 3. *end* is the time from the "
                "kill to the driver's exit (driver victim: until no process of the job is left); limit "
                "%.0f s. Leftovers: processes with the job's mark, `hvd-driver.*`, `hvd-mpirun.*` (mpirun's "
                "private TMPDIR), `ompi.*` or `prte.*` in the job's TMPDIR, new "
                "`/dev/shm/hvd-task-*`. running:link:DOWN is the network partition: tasks 0-1 (host A), "
                "tasks 2-3 (host B) and the driver in three network namespaces, host B's veth set down "
                "while every rank sleeps in its entry (packets black-holed); *end* runs from the link "
                "going down, limit %.0f s (default `--net-timeout` 15 s: noticed 10-16 s after the cut, then "
                "mpirun, which cannot reach host B's orted, gets 1 s before SIGKILL), and the processes left in host "
                "B's namespace must end by themselves within %.0f s. *names victim*: whether the driver's "
                "last line names the killed part and, for a part on host B, that host (then whether any "
                "other hvd- program's line does); a cell whose driver survives fails unless it does, but "
                "for the cells marked \"known\" (see KNOWN_UNNAMED in the script).\n\n"
                % (END_LIMIT, PARTITION_LIMIT, PARTITION_LIMIT + 10) + table(cells) + "\n")
        reldoc.write_section(ARGS.doc, "faults", body)
    if failed:
        return 1
    return 77 if skipped and skipped == len(cells) else 0


if __name__ == "__main__":
    sys.exit(main())
