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
hvd-driver.* directory is left in the cell's TMPDIR and no new /dev/shm/hvd-task-* directory
is left. The driver's message is recorded, and whether it names the victim.

A network partition is the cell running:link:DOWN: hvd-driver (and mpirun) in one network
namespace, tasks 0-1 in a second (host A), tasks 2-3 in a third (host B), joined by veth
pairs on a bridge (as in tests/e2e test_netns_hosts); once every rank sleeps in its entry,
host B's veth is set down on the bridge side, so that its packets are black-holed (no RST,
no FIN). It checks: hvd-driver exits non-zero within PARTITION_LIMIT (30 s) of the link going
down. The default --net-timeout is 15 s: keepalive notices the silence 10-17.5 s after the
cut and the driver stops the job at once (a timed-out connection is never a normal end), but
mpirun cannot reach host B's orted either and is killed 10 s after its SIGTERM: 20-29 s in
all. One line of the driver says it lost contact with
host B's tasks (names e2e-faults-b or task 2/3) and that the connection timed out; the tasks
in host B's namespace notice too and end their command (no process of the job is left within
PARTITION_LIMIT + 10 s), and no temp file is left. The namespaces, veths and bridge are
removed at the end whatever happens. Skipped (with the reason) when not root or when
namespaces or bridges cannot be made.

Without cell names: the CI subset (running phase, SIGKILL, and the partition); --full: the
whole matrix and the partition.
--write-doc writes the results table into docs/reliability.md.
"""
import argparse
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reldoc  # noqa: E402

ARGS = None
PHASES = ["registration", "launch", "running", "collection"]
VICTIMS = ["driver", "first_task", "sibling", "rsh", "orted", "rank", "mpirun"]
SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM}
END_LIMIT = 15.0
# What the driver's message should mention for each victim (any of these words).
NAMES = {
    "driver": None,
    "first_task": ["task 2"],
    "sibling": ["task 3"],
    "rsh": ["hvd-rsh", "agent"],
    "orted": ["orted", "daemon"],
    "rank": ["rank 3"],
    "mpirun": ["mpirun"],
}
# Victims that do not exist in a phase.
NOT_APPLICABLE = {
    ("registration", "rsh"), ("registration", "orted"), ("registration", "rank"),
    ("registration", "mpirun"), ("launch", "rank"),
}
PARTITION_CELL = "running:link:DOWN"
PARTITION_LIMIT = 30.0   # from the link going down to hvd-driver's exit (20-29 s expected)
NAMES["link"] = ["e2e-faults-b", "task 2", "task 3"]
CI_CELLS = ["running:%s:KILL" % v for v in VICTIMS] + [PARTITION_CELL]


class Skip(Exception):
    pass


def marked_env(mark, tmpdir, **extra):
    env = dict(os.environ)
    env["HVD_E2E_MARK"] = mark
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env["PATH"] = ARGS.bin + os.pathsep + env.get("PATH", "")
    env["TMPDIR"] = tmpdir
    for k in ("HVD_SECRET", "HVD_SECRET_FILE", "HVD_DRIVER_ADDRS", "HVD_HOST_HASH"):
        env.pop(k, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def proc_info(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = {}
            for kv in f.read().split(b"\0"):
                if b"=" in kv:
                    k, v = kv.split(b"=", 1)
                    env[k.decode(errors="replace")] = v.decode(errors="replace")
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return argv, env, state
    except OSError:
        return None


SEEN_SHM = set()  # Open MPI backing directories seen in the job's processes


def processes_with(mark):
    """{pid: (argv, env)} of live (non-zombie) processes whose environment holds the mark."""
    needle = ("HVD_E2E_MARK=" + mark).encode()
    found = {}
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
        except OSError:
            continue
        info = proc_info(int(d))
        if info and info[2] != "Z":
            found[int(d)] = (info[0], info[1])
            shm = info[1].get("OMPI_MCA_btl_vader_backing_directory")
            if shm:
                SEEN_SHM.add(shm)
    return found


def base(argv):
    return os.path.basename(argv[0]) if argv else ""


def find_victim(victim, procs, driver_pid):
    """The pid of the victim among the marked processes, or None."""
    for pid, (argv, env) in sorted(procs.items()):
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


def shm_dirs():
    return set(glob.glob("/dev/shm/hvd-task-*"))


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
           not re.match(r"hvd-driver:\s+(rank\s+task|\d+\s+\d+\s)", l)]
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


def run_cell(cell):
    mark = uuid.uuid4().hex
    tmp = tempfile.mkdtemp(prefix="hvd-faults-")
    work = os.path.join(tmp, "work")
    tdir = os.path.join(tmp, "tmp")
    os.mkdir(work)
    os.mkdir(tdir)
    shm_before = shm_dirs()
    env = marked_env(mark, tdir, HVD_E2E_DIR=work)
    entry = ARGS.probe_lib + ":probe_entry"
    arg = {"registration": "sleep=30", "launch": "sleep=30", "running": "sleep=30",
           "collection": "sleep=30:3"}[cell.phase]
    tasks = []
    t_start = time.time()
    if cell.phase == "registration":
        cmd = [os.path.join(ARGS.bin, "hvd-driver"), "run", "-np", "4", "--start-timeout", "60",
               "--entry", entry, "--entry-arg", arg]
    else:
        cmd = [os.path.join(ARGS.bin, "hvd-driver"), "run", "-np", "4", "--local", "2",
               "--start-timeout", "60", "--entry", entry, "--entry-arg", arg]
    errf = open(os.path.join(tmp, "driver.err"), "w+b")
    drv = subprocess.Popen(cmd, env=env, cwd=work, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=errf)
    victim_pid = None
    t_kill = None
    try:
        if cell.phase == "registration":
            deadline = time.time() + 20
            m = None
            while time.time() < deadline and drv.poll() is None:
                errf.seek(0)
                m = re.search(rb"HVD_SECRET_FILE=(\S+) hvd-task --driver '([^']+)'", errf.read())
                if m:
                    break
                time.sleep(0.05)
            if not m:
                cell.fail("hvd-driver did not say how to start tasks")
                return
            tenv = dict(env, HVD_SECRET_FILE=m.group(1).decode(), HVD_DRIVER_ADDRS=m.group(2).decode())

            def start_task(i):
                e = dict(tenv, HVD_HOST_HASH="e2e-faults-a" if i < 2 else "e2e-faults-b")
                return subprocess.Popen([os.path.join(ARGS.bin, "hvd-task"), "--index", str(i),
                                         "--start-timeout", "60"], env=e, cwd=work,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
            for i in (0, 2, 3):
                tasks.append(start_task(i))
            time.sleep(1.5)  # tasks 0, 2, 3 register; task 1 is missing
            victim_pid = find_victim(cell.victim, processes_with(mark), drv.pid)
        else:
            deadline = time.time() + 40
            while time.time() < deadline and drv.poll() is None:
                procs = processes_with(mark)
                st = states(work)
                if cell.phase == "launch":
                    ready = any(base(a) in ("hvd-rsh", "mpirun_rsh") for a, _ in procs.values())
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
            # How long it would have taken (--overrun S waits that much longer).
            try:
                drv.wait(timeout=ARGS.overrun)
                cell.note = "ended by itself after %.1f s" % (time.time() - t_kill)
            except subprocess.TimeoutExpired:
                cell.note = "still running after %.0f s" % (time.time() - t_kill)
        else:
            cell.end_s = time.time() - t_kill
            cell.status = drv.returncode
            if drv.returncode == 0:
                cell.fail("hvd-driver exited 0")
    finally:
        if drv.poll() is None:
            drv.send_signal(signal.SIGTERM)
            try:
                drv.wait(timeout=10)
            except subprocess.TimeoutExpired:
                drv.kill()
                drv.wait()
        if cell.status is None and drv.returncode is not None and cell.victim != "driver":
            cell.status = drv.returncode
        for t in tasks:
            try:
                t.wait(timeout=max(0.1, 8 - (time.time() - (t_kill or time.time()))))
            except subprocess.TimeoutExpired:
                pass
        # Leftover processes: a short grace after the end, then anything marked is reported.
        deadline = time.time() + 3
        left = processes_with(mark)
        while left and time.time() < deadline:
            time.sleep(0.1)
            left = processes_with(mark)
        for pid, (argv, penv) in sorted(left.items()):
            what = base(argv)
            if "--index" in argv[:-1]:
                what += " --index " + argv[argv.index("--index") + 1]
            cell.leftovers.append("%s (pid %d)" % (what, pid))
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for t in tasks:
            if t.poll() is None:
                t.kill()
                t.wait()
        errf.seek(0)
        stderr = errf.read().decode(errors="replace")
        errf.close()
        own, other = driver_message(stderr)
        cell.message = own + other
        words = NAMES[cell.victim]
        if words is not None:
            cell.names_victim = any(w in l for w in words for l in own)
            cell.others_name = any(w in l for w in words for l in stderr.splitlines()
                                   if re.match(r"(\[[^]]*\]<std\w+>:)?\s*hvd-", l))
        check_files_left(cell, tdir, tmp, shm_before)


def check_files_left(cell, tdir, tmp, shm_before):
    """Fails the cell for the job's files left behind (its private dirs in TMPDIR, the
    /dev/shm backing dirs its processes named), then removes them and the cell's dir."""
    for d in glob.glob(os.path.join(tdir, "hvd-driver.*")):
        cell.leftovers.append("TMPDIR/" + os.path.basename(d))
    time.sleep(0.2)
    # Only the job's own directories: those its processes named (others' jobs run too).
    new_shm = (shm_dirs() - shm_before) & SEEN_SHM
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


def sh(*cmd):
    subprocess.run(list(cmd), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def run_partition_cell(cell):
    """running:link:DOWN (see the docstring): host B's link goes down while ranks run."""
    if os.geteuid() != 0:
        raise Skip("needs root to create network namespaces")
    if not shutil.which("ip"):
        raise Skip("no ip command (iproute2)")
    tag = uuid.uuid4().hex[:6]
    ns = {k: "hvdf%s%s" % (tag, k) for k in "abd"}   # host A, host B, the driver's
    bridge = "hfbr%s" % tag
    veth = {k: "hf%s%s" % (tag, k) for k in ns}
    net = "10.79.%d" % (int(tag[:2], 16) % 250)
    made = []
    mark = uuid.uuid4().hex
    tmp = tempfile.mkdtemp(prefix="hvd-faults-")
    work = os.path.join(tmp, "work")
    tdir = os.path.join(tmp, "tmp")
    os.mkdir(work)
    os.mkdir(tdir)
    shm_before = shm_dirs()
    drv = None
    tasks = []
    errf = open(os.path.join(tmp, "driver.err"), "w+b")
    try:
        try:
            sh("ip", "link", "add", bridge, "type", "bridge")
        except (subprocess.CalledProcessError, OSError) as e:
            raise Skip("cannot create a bridge: %s" %
                       (e.stderr.decode().strip() if getattr(e, "stderr", None) else e))
        made.append(("link", bridge))
        sh("ip", "link", "set", bridge, "up")
        for i, k in enumerate("abd"):
            try:
                sh("ip", "netns", "add", ns[k])
            except subprocess.CalledProcessError as e:
                raise Skip("cannot create a network namespace: %s" % e.stderr.decode().strip())
            made.append(("netns", ns[k]))
            sh("ip", "link", "add", veth[k], "type", "veth", "peer", "name", "eth0", "netns", ns[k])
            made.append(("link", veth[k]))
            sh("ip", "link", "set", veth[k], "master", bridge, "up")
            sh("ip", "-n", ns[k], "addr", "add", "%s.%d/24" % (net, 10 + i), "dev", "eth0")
            sh("ip", "-n", ns[k], "link", "set", "eth0", "up")
            sh("ip", "-n", ns[k], "link", "set", "lo", "up")
        env = marked_env(mark, tdir, HVD_E2E_DIR=work)
        cmd = ["ip", "netns", "exec", ns["d"], os.path.join(ARGS.bin, "hvd-driver"), "run",
               "-np", "4", "--start-timeout", "60", "--entry", ARGS.probe_lib + ":probe_entry",
               "--entry-arg", "sleep=60"]
        drv = subprocess.Popen(cmd, env=env, cwd=work, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=errf)
        deadline = time.time() + 20
        m = None
        while time.time() < deadline and drv.poll() is None and not m:
            time.sleep(0.05)
            errf.seek(0)
            m = re.search(rb"HVD_SECRET_FILE=(\S+) hvd-task --driver '([^']+)'", errf.read())
        if not m:
            cell.fail("hvd-driver did not say how to start tasks")
            return
        tenv = dict(env, HVD_SECRET_FILE=m.group(1).decode(), HVD_DRIVER_ADDRS=m.group(2).decode())
        for i in range(4):
            k = "a" if i < 2 else "b"
            tasks.append(subprocess.Popen(
                ["ip", "netns", "exec", ns[k], os.path.join(ARGS.bin, "hvd-task"), "--index",
                 str(i), "--start-timeout", "60"],
                env=dict(tenv, HVD_HOST_HASH="e2e-faults-" + k), cwd=work,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
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
        sh("ip", "link", "set", veth["b"], "down")
        try:
            drv.wait(timeout=PARTITION_LIMIT)
            cell.end_s = time.time() - t_cut
            cell.status = drv.returncode
            if drv.returncode == 0:
                cell.fail("hvd-driver exited 0")
        except subprocess.TimeoutExpired:
            cell.fail("hvd-driver still running %.0f s after the link went down" % PARTITION_LIMIT)
            try:
                drv.wait(timeout=ARGS.overrun)
                cell.note = "ended by itself after %.1f s" % (time.time() - t_cut)
            except subprocess.TimeoutExpired:
                cell.note = "still running after %.0f s" % (time.time() - t_cut)
        # Host B's side ends by itself too (its tasks lose the driver): nothing may be left.
        deadline = t_cut + PARTITION_LIMIT + 10
        left = processes_with(mark)
        while left and time.time() < deadline:
            time.sleep(0.2)
            left = processes_with(mark)
        for pid, (argv, penv) in sorted(left.items()):
            what = base(argv)
            if "--index" in argv[:-1]:
                what += " --index " + argv[argv.index("--index") + 1]
            cell.leftovers.append("%s (pid %d)" % (what, pid))
    finally:
        for p in [drv] + tasks:
            if p is not None and p.poll() is None:
                p.kill()
        for pid in processes_with(mark):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for p in [drv] + tasks:
            if p is not None:
                p.wait()
        for kind, name in reversed(made):
            if kind == "netns":
                subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)
            else:
                subprocess.run(["ip", "link", "del", name], stderr=subprocess.DEVNULL)
        errf.seek(0)
        stderr = errf.read().decode(errors="replace")
        errf.close()
        own, other = driver_message(stderr)
        cell.message = own + other
        if cell.skipped is None and drv is not None and drv.returncode is not None:
            lines = [l for l in stderr.splitlines() if l.startswith("hvd-driver:")]
            hit = [l for l in lines if "lost contact" in l and "timed out" in l]
            cell.names_victim = any(w in l for w in NAMES["link"] for l in hit)
            cell.others_name = cell.names_victim
            if not hit:
                cell.fail("no hvd-driver line says it lost contact (timed out)")
            elif not cell.names_victim:
                cell.fail("the lost-contact line names neither host B nor its tasks")
            else:
                cell.message = hit[:1] + other
        check_files_left(cell, tdir, tmp, shm_before)


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
            "%s / %s" % ({None: "n/a", True: "yes", False: "no"}[c.names_victim],
                         {None: "n/a", True: "yes", False: "no"}[c.others_name]),
            reldoc.md_cell(msg), reldoc.md_cell(", ".join(c.leftovers) or "none"),
            ("skipped: " + reldoc.md_cell(c.skipped)) if c.skipped is not None and not c.failures
            else "ok" if not c.failures else
            "**FAIL**: " + reldoc.md_cell("; ".join(c.failures))[:200]))
    return "\n".join(out)


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--probe-lib", required=True)
    ap.add_argument("--full", action="store_true", help="the whole matrix")
    ap.add_argument("--write-doc", action="store_true")
    ap.add_argument("--doc", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "..", "docs", "reliability.md"))
    ap.add_argument("--overrun", type=float, default=0,
                    help="when a job outlives the limit, wait this much longer to learn when it ends")
    ap.add_argument("--keep", action="store_true", help="keep each cell's directory")
    ap.add_argument("cells", nargs="*")
    ARGS = ap.parse_args()
    ARGS.bin = os.path.abspath(ARGS.bin)
    ARGS.probe_lib = os.path.abspath(ARGS.probe_lib)
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
                "%.0f s. Leftovers: processes with the job's mark, `hvd-driver.*` in the job's TMPDIR, new "
                "`/dev/shm/hvd-task-*`. running:link:DOWN is the network partition: tasks 0-1 (host A), "
                "tasks 2-3 (host B) and the driver in three network namespaces, host B's veth set down "
                "while every rank sleeps in its entry (packets black-holed); *end* runs from the link "
                "going down, limit %.0f s (default `--net-timeout` 15 s: noticed 10-17.5 s after the cut, then "
                "mpirun, which cannot reach host B's orted, gets 10 s before SIGKILL), and the processes left in host "
                "B's namespace must end by themselves within %.0f s.\n\n"
                % (END_LIMIT, PARTITION_LIMIT, PARTITION_LIMIT + 10) + table(cells) + "\n")
        reldoc.write_section(os.path.abspath(ARGS.doc), "faults", body)
    if failed:
        return 1
    return 77 if skipped and skipped == len(cells) else 0


if __name__ == "__main__":
    sys.exit(main())
