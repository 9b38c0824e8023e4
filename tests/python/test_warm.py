#!/usr/bin/env python3
"""Warm Python ranks (label python): task services with a warm interpreter (hvd-task
--warm-python, here through HVD_WARM_PYTHON in hvd-driver's environment), real mpirun, orted
and hvd-exec. The warm interpreter imports a marker module of the test; a rank forked from it
finds the module already imported by another process, and its parent is the interpreter.

Cases:
  forms        `PY script.py args`, `PY -m module args` and `PY -c code args` are forked warm:
               argv, sys.path[0], the working directory, the rank's environment, stdin
               (/dev/null), stdout and stderr as a cold rank has them, a file left open
               flushed at the end; `PY -E script` and a
               program that is not PY (/bin/sh) start cold and work
  status       a rank's exit status and last stderr line reach the driver (exit 3), and a rank
               killed by a signal is reported as killed (SIGKILL: 137)
  stop         a rank that never ends and ignores SIGTERM is stopped when another rank fails
               (SIGKILL after the grace period): the job ends, the rank is gone
  escapees     a rank's descendants that left its process group (setsid) or lost their
               parent (a double fork) live while it runs (a warm rank's stay its
               descendants), and are stopped when it ends (SIGTERM first, SIGKILL for one
               that ignores it), while its task service still runs (another rank of the job
               watches): nothing of an ended rank lives on in a long-lived task service, or
               holds the job; warm and cold (-E) ranks
  task_killed  SIGKILL of the task service: its warm interpreter and the rank forked from it
               are gone, the job fails
  function     hvd_bridge.run(fn, np=2): the pickled function (descriptors 3 and 4) runs in
               warm ranks and its results come back
  unreachable  an interpreter that does not exist: the task service says so, the ranks start
               cold and the job succeeds; one that starts but cannot serve (no hvd_bridge on
               its path): one warning per rank, cold ranks, the job succeeds
  garbage      the warm interpreter on its own, fed garbage, truncated and malformed requests,
               requests without descriptors and dropped connections: it answers "cold" or
               nothing, and still runs a good request afterwards (its status comes back)
and after every case: no process of the job is left, no hvd-warm-* directory in /dev/shm.

Exits 77 when mpirun or cloudpickle is missing, or under a sanitizer build.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import hvdtest  # noqa: E402
from hvdtest import check  # noqa: E402

ARGS = None
MARKER = "hvd_warm_marker"

RANK_SCRIPT = r"""
import json, os, sys
m = sys.modules.get("hvd_warm_marker")
with open("/proc/%d/cmdline" % os.getppid(), "rb") as f:
    parent = f.read().split(b"\0")[:3]
print("INFO " + json.dumps({
    "rank": int(os.environ["HOROVOD_RANK"]), "warm": bool(m and m.PID != os.getpid()),
    "parent": [p.decode() for p in parent], "argv": sys.argv, "path0": sys.path[0],
    "cwd": os.getcwd(), "work_dir": os.environ.get("HOROVOD_SPARK_WORK_DIR"),
    "stdin": sys.stdin.read(), "name": __name__}), flush=True)
print("rank %s on stderr" % os.environ["HOROVOD_RANK"], file=sys.stderr, flush=True)
unclosed = open(os.path.join(os.environ["WARM_TEST_DIR"], "unclosed.%s" % os.environ["HOROVOD_RANK"]), "w")  # flushed at the end
unclosed.write("written, never closed")
"""


class Case:
    """A case's surroundings: a private directory with the marker module, a process mark, and
    on exit no process of the mark and no new hvd-warm-* directory left."""

    def __enter__(self):
        self.mark = uuid.uuid4().hex
        self.dir = tempfile.mkdtemp(prefix="hvd-warmtest-")
        with open(os.path.join(self.dir, MARKER + ".py"), "w") as f:
            f.write("import os\nPID = os.getpid()\n")
        self.warm_before = hvdtest.shm_dirs("hvd-warm-")
        return self

    def env(self, python=None, **extra):
        env = hvdtest.marked_env(self.mark, **extra)
        env["PYTHONPATH"] = os.pathsep.join([ARGS.pythonpath, self.dir])
        env["HVD_WARM_PYTHON"] = python or sys.executable
        env["HVD_WARM_IMPORTS"] = MARKER
        env["WARM_TEST_DIR"] = self.dir
        if "PYTHONUNBUFFERED" not in extra:
            env.pop("PYTHONUNBUFFERED", None)
        return env

    def file(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def __exit__(self, *exc):
        left = hvdtest.leftovers(self.mark, 15)
        warm_left = hvdtest.wait_gone(lambda: hvdtest.shm_dirs("hvd-warm-") - self.warm_before, 10)
        shutil.rmtree(self.dir, ignore_errors=True)
        if exc[0] is None:
            check(not left, "processes of the job left behind:\n  " + "\n  ".join(left))
            check(not warm_left, "left in /dev/shm: %s" % sorted(warm_left or ()))
        return False


def driver(*args):
    return [os.path.join(ARGS.pythonpath, "hvd_bridge", "bin", "hvd-driver"), "run"] + list(args)


def job(case, np_, program, env=None, timeout=120):
    return hvdtest.run(driver("-np", str(np_), "--local", str(np_), "--", *program),
                       env=env or case.env(), timeout=timeout, cwd=case.dir)


def infos(out, np_):
    found = {}
    for line in out.splitlines():
        m = re.match(r"\[1,(\d+)\]<stdout>:INFO (.*)$", line)
        if m:
            found[int(m.group(1))] = json.loads(m.group(2))
    check(sorted(found) == list(range(np_)), "an INFO line from each of %d ranks:\n%s" % (
        np_, out[-3000:]))
    return [found[r] for r in range(np_)]


def check_warm(info, warm=True):
    forked = info["parent"][1:3] == ["-m", "hvd_bridge._warm"]
    check(info["warm"] == warm and forked == warm,
          "rank %d %s the warm interpreter: %r" % (info["rank"], "forked from" if warm else
                                                   "not forked from", info))


def test_forms():
    with Case() as c:
        script = c.file("rank_script.py", RANK_SCRIPT)
        c.file("rank_module.py", RANK_SCRIPT)
        for program, argv, path0 in [
                ([sys.executable, script, "a", "b c"], [script, "a", "b c"], c.dir),
                ([sys.executable, "-u", "-m", "rank_module", "x"], [os.path.join(c.dir, "rank_module.py"), "x"], None),
                ([sys.executable, "-c", RANK_SCRIPT, "y"], ["-c", "y"], "")]:
            for r in range(2):
                if os.path.exists(os.path.join(c.dir, "unclosed.%d" % r)):
                    os.unlink(os.path.join(c.dir, "unclosed.%d" % r))
            rc, out, err, _ = job(c, 2, program)
            check(rc == 0, "%s: the job failed (%d):\n%s" % (program[1], rc, err[-3000:]))
            check(("python -u writes unbuffered" in err) == (program[1] == "-u"),
                  "%s: the driver warns of python -u, and only of it:\n%s" % (program[1], err[-2000:]))
            for r, info in enumerate(infos(out, 2)):
                check_warm(info)
                check(info["argv"] == argv, "argv %r, not %r" % (info["argv"], argv))
                if path0 is not None:
                    check(info["path0"] == path0, "sys.path[0] %r, not %r" % (info["path0"], path0))
                check(info["name"] == "__main__" and info["stdin"] == "", "main, stdin: %r" % info)
                check(info["cwd"] == info["work_dir"], "runs in the work dir: %r" % info)
                with open(os.path.join(c.dir, "unclosed.%d" % r)) as f:
                    check(f.read() == "written, never closed",
                          "a file the program never closed is flushed at its end")
                check("[1,%d]<stderr>:rank %d on stderr" % (r, r) in err, "stderr of rank %d:\n%s" % (
                    r, err[-2000:]))
        rc, out, err, _ = job(c, 1, [sys.executable, script], env=c.env(PYTHONUNBUFFERED="1"))
        check(rc == 0 and "PYTHONUNBUFFERED is set: python writes unbuffered" in err,
              "the driver warns of PYTHONUNBUFFERED (%d):\n%s" % (rc, err[-2000:]))
        # Cold: an option that changes how Python starts (-E: the environment's PYTHON*
        # variables are ignored, so no warning), and a program that is not Python.
        rc, out, err, _ = job(c, 2, [sys.executable, "-E", script], env=c.env(PYTHONUNBUFFERED="1"))
        check(rc == 0, "-E: the job failed (%d):\n%s" % (rc, err[-3000:]))
        check("unbuffered" not in err, "-E: no warning:\n%s" % err[-2000:])
        for info in infos(out, 2):
            check_warm(info, warm=False)
        rc, out, err, _ = job(c, 2, ["/bin/sh", "-c", 'echo "cold rank $HOROVOD_RANK"'])
        check(rc == 0 and "cold rank 1" in out and "warning" not in err,
              "/bin/sh as a rank (%d):\n%s\n%s" % (rc, out[-2000:], err[-2000:]))


def test_status():
    with Case() as c:
        script = c.file("fail.py", RANK_SCRIPT + r"""
if os.environ["HOROVOD_RANK"] == "1":
    print("rank 1 gives up", file=sys.stderr, flush=True)
    sys.exit(3)
""")
        rc, out, err, _ = job(c, 2, [sys.executable, script])
        check(rc == 3, "exit status 3 of rank 1 is the job's: %d\n%s" % (rc, err[-3000:]))
        check_warm(infos(out, 2)[1])
        check(re.search(r"rank 1 .*exited with status 3: rank 1 gives up", err),
              "the driver quotes rank 1's status and last line:\n%s" % err[-3000:])
        script = c.file("killed.py", RANK_SCRIPT + r"""
if os.environ["HOROVOD_RANK"] == "0":
    os.kill(os.getpid(), 9)
""")
        rc, out, err, _ = job(c, 2, [sys.executable, script])
        check(rc != 0 and re.search(r"rank 0 .*killed by signal 9", err),
              "rank 0 killed by SIGKILL (%d):\n%s" % (rc, err[-3000:]))
        check_warm(infos(out, 2)[0])


def wait_pid_file(path, timeout=60):
    hvdtest.wait_for(lambda: os.path.exists(path) and open(path).read().strip(), timeout,
                     "the rank's pid in %s" % path)
    return int(open(path).read())


def test_stop():
    with Case() as c:
        pid_file = os.path.join(c.dir, "rank0.pid")
        script = c.file("stop.py", r"""
import os, signal, sys, time
if os.environ["HOROVOD_RANK"] == "0":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the SIGKILL after the grace ends it
    with open(%r + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(%r + ".tmp", %r)
    time.sleep(600)
while not os.path.exists(%r):
    time.sleep(0.05)
sys.exit(1)
""" % (pid_file, pid_file, pid_file, pid_file))
        t0 = time.time()
        p = subprocess.Popen(driver("-np", "2", "--local", "2", "--", sys.executable, script),
                             env=c.env(), cwd=c.dir, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        pid = wait_pid_file(pid_file)
        with open("/proc/%d/cmdline" % hvdtest.parent_of(pid), "rb") as f:
            check(b"hvd_bridge._warm" in f.read(), "rank 0's parent is the warm interpreter")
        try:
            _, err = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise
        rc, err = p.returncode, err.decode(errors="replace")
        check(rc == 1, "the job fails with rank 1's status (%d):\n%s" % (rc, err[-3000:]))
        check(not hvdtest.wait_gone(lambda: os.path.exists("/proc/%d" % pid), 10),
              "rank 0 (pid %d) still runs" % pid)
        check(time.time() - t0 < 60, "the job took %.0f s to end" % (time.time() - t0))


ESCAPEES_SCRIPT = r"""
import os, subprocess, sys, time
d = os.environ["WARM_TEST_DIR"]


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def parent(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def write(name, text):
    with open(os.path.join(d, name + ".tmp"), "w") as f:
        f.write(text)
    os.rename(os.path.join(d, name + ".tmp"), os.path.join(d, name))


if os.environ["HOROVOD_RANK"] == "0":
    # A new session (out of the rank's process group) that ends on SIGTERM, and an orphan
    # (the shell that started it exits at once) that ignores SIGTERM: it needs the SIGKILL.
    graceful = os.path.join(d, "graceful." + sys.argv[1])
    leader = subprocess.Popen(["sh", "-c", "trap 'touch %s; exit 0' TERM; while :; do sleep 0.05;"
                               " done" % graceful], start_new_session=True)
    sh = subprocess.run(["sh", "-c", "setsid sh -c 'trap \"\" TERM; exec sleep 600' >/dev/null"
                         " 2>&1 & echo $!"], capture_output=True, text=True, check=True)
    orphan = int(sh.stdout)
    time.sleep(0.3)
    for what, pid in (("session leader", leader.pid), ("orphan", orphan)):
        if not alive(pid):
            sys.exit("the %s (%d) died while the rank runs" % (what, pid))
    if sys.argv[1] == "warm" and parent(orphan) != os.getpid():  # the rank is a subreaper
        sys.exit("the orphan's parent is %d, not the rank (%d)" % (parent(orphan), os.getpid()))
    write("escapees", "%d %d %d" % (os.getpid(), leader.pid, orphan))
    sys.exit(0)
path = os.path.join(d, "escapees")
deadline = time.time() + 60
while not os.path.exists(path) and time.time() < deadline:
    time.sleep(0.05)
rank0, leader, orphan = (int(x) for x in open(path).read().split())
deadline = time.time() + 30
while alive(rank0) and time.time() < deadline:
    time.sleep(0.05)
deadline = time.time() + 20  # SIGTERM, SIGKILL 5 s later
left = [p for p in (leader, orphan) if alive(p)]
while left and time.time() < deadline:
    time.sleep(0.05)
    left = [p for p in left if alive(p)]
if left:
    sys.exit("rank 0 ended, but what it started still runs: %r" % left)
if not os.path.exists(os.path.join(d, "graceful." + sys.argv[1])):
    sys.exit("what rank 0 left was not stopped with SIGTERM first")
print("ESCAPEES GONE", flush=True)
"""


def test_escapees():
    with Case() as c:
        script = c.file("escapees.py", ESCAPEES_SCRIPT)
        # Warm, and cold (-E: the process runner's keeper stops what the program left; it
        # used to wait for it, holding the job until the daemon ended).
        for how, python in (("warm", [sys.executable]), ("cold", [sys.executable, "-E"])):
            rc, out, err, _ = job(c, 2, python + [script, how])
            check(rc == 0 and "ESCAPEES GONE" in out,
                  "%s ranks: the job failed (%d):\n%s\n%s" % (how, rc, out[-2000:], err[-3000:]))
            os.unlink(os.path.join(c.dir, "escapees"))


def test_task_killed():
    with Case() as c:
        pid_file = os.path.join(c.dir, "rank.pid")
        script = c.file("sleep.py", r"""
import os, time
with open(%r + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(%r + ".tmp", %r)
time.sleep(600)
""" % (pid_file, pid_file, pid_file))
        p = subprocess.Popen(driver("-np", "1", "--local", "1", "--", sys.executable, script),
                             env=c.env(), cwd=c.dir, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            pid = wait_pid_file(pid_file)
            parent = hvdtest.parent_of(pid)
            with open("/proc/%d/cmdline" % parent, "rb") as f:
                check(b"hvd_bridge._warm" in f.read(), "the rank's parent is the warm interpreter")
            tasks = [q for q, info in hvdtest.processes_with(c.mark).items()
                     if os.path.basename(info.argv[0]) == "hvd-task"]
            check(len(tasks) == 1, "one hvd-task: %r" % tasks)
            os.kill(tasks[0], signal.SIGKILL)
            rc = p.wait(timeout=60)
            check(rc != 0, "the job fails when its task service is killed")
            check(not hvdtest.wait_gone(lambda: [q for q in (pid, parent)
                                                 if os.path.exists("/proc/%d" % q)], 15),
                  "the rank (%d) or its warm interpreter (%d) outlived the task service" % (
                      pid, parent))
        finally:
            if p.poll() is None:
                hvdtest.stop(p, 10, signal.SIGTERM)
            p.stderr.close()


def warm_rank_info(x):
    import os as _os
    import sys as _sys
    m = _sys.modules.get("hvd_warm_marker")
    with open("/proc/%d/cmdline" % _os.getppid(), "rb") as f:
        parent = f.read().split(b"\0")[1:3]
    return {"x": x, "rank": int(_os.environ["RANK"]), "warm": bool(m and m.PID != _os.getpid()),
            "parent": [p.decode() for p in parent]}


def test_function():
    import hvd_bridge
    with Case() as c:
        env = c.env()
        names = (hvdtest.MARK_VAR, "PYTHONPATH", "HVD_WARM_PYTHON", "HVD_WARM_IMPORTS")
        saved = {k: os.environ.get(k) for k in names}
        os.environ.update({k: env[k] for k in names})
        try:
            out = hvd_bridge.run(warm_rank_info, args=(7,), np=2)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    check([o["rank"] for o in out] == [0, 1] and all(o["x"] == 7 for o in out),
          "results in rank order: %r" % out)
    for o in out:
        check(o["warm"] and o["parent"] == ["-m", "hvd_bridge._warm"], "forked warm: %r" % o)


def test_unreachable():
    with Case() as c:
        script = c.file("rank_script.py", RANK_SCRIPT)
        missing = os.path.join(c.dir, "no-such-python")
        rc, out, err, _ = job(c, 2, [sys.executable, script], env=c.env(python=missing))
        check(rc == 0, "the job failed (%d):\n%s" % (rc, err[-3000:]))
        for info in infos(out, 2):
            check_warm(info, warm=False)
        check(re.search(r"hvd-task\[\d\]: warning: no warm interpreter \(ranks start cold\)", err),
              "the task service says it has no warm interpreter:\n%s" % err[-3000:])
        # An interpreter that starts, but without hvd_bridge: it exits, ranks are refused.
        env = c.env()
        env["PYTHONPATH"] = c.dir
        rc, out, err, _ = job(c, 2, [sys.executable, script], env=env)
        check(rc == 0, "the job failed (%d):\n%s" % (rc, err[-3000:]))
        for info in infos(out, 2):
            check_warm(info, warm=False)
        warnings = re.findall(r"hvd-exec: warning: .*warm interpreter.*; starting the rank "
                              r"without it", err)
        check(len(warnings) == 2, "one warning per rank:\n%s" % err[-3000:])


def warm_request(path, data, fds):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    s.settimeout(30)
    if fds:
        socket.send_fds(s, [data], fds)
    else:
        s.send(data)
    return s


def request_bytes(argv, env, cwd="/"):
    fields = ["hvd-warm 1", cwd, str(len(argv))] + argv + [str(len(env))] + env
    return b"".join(f.encode() + b"\0" for f in fields)


def test_garbage():
    with Case() as c:
        sock = os.path.join(c.dir, "socket")
        z = subprocess.Popen([sys.executable, "-m", "hvd_bridge._warm", "--socket", sock,
                              "--imports", MARKER], env=c.env(), stdin=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
        try:
            hvdtest.wait_for(lambda: os.path.exists(sock), 30, "the warm interpreter's socket")
            r, w = os.pipe()
            env = ["PATH=" + os.environ["PATH"]]
            bad = [b"", b"\0" * 100, os.urandom(4096), b"hvd-warm 1\0/\0", b"hvd-warm 1\0/\0x\0",
                   b"hvd-warm 1\0/\0" + b"9" * 30 + b"\0", request_bytes([sys.executable], env)[:-9],
                   b"hvd-warm 2\0/\01\0python\00\0"]
            for data in bad:  # each with descriptors, then without
                for fds in ([w, w], []):
                    conn = warm_request(sock, data, fds)
                    answer = conn.recv(512)
                    conn.close()
                    check(answer.startswith(b"cold ") or answer == b"",
                          "%r answered %r" % (data[:40], answer))
            for _ in range(20):  # dropped at once
                warm_request(sock, b"", []).close()
            good = request_bytes([sys.executable, "-c", "import sys, hvd_warm_marker; "
                                  "print('warm ok'); sys.exit(5)"], env, c.dir)
            conn = warm_request(sock, good[:len(good) // 2], [w])  # one descriptor: no stderr
            check(conn.recv(512).startswith(b"cold "), "a request without stderr is refused")
            conn.close()
            conn = warm_request(sock, good, [w, w])
            os.close(w)
            check(re.match(rb"started \d+$", conn.recv(512)), "the good request is forked")
            check(conn.recv(512) == b"exit 5", "its exit status comes back")
            conn.close()
            with os.fdopen(r, "rb") as f:
                check(f.read() == b"warm ok\n", "its output went to the given stdout")
            check(z.poll() is None, "the warm interpreter still runs")
        finally:
            z.kill()
            z.wait()
            z.stderr.close()


def main():
    global ARGS
    ARGS = hvdtest.package_test_args()
    if sys.version_info < (3, 9):
        hvdtest.skip("a warm interpreter needs Python 3.9 (socket.recv_fds, os.pidfd_open)")
    return hvdtest.run_cases_in_tmpdir(globals(), ARGS.cases, "hvd-warm.")


if __name__ == "__main__":
    sys.exit(main())
