"""The warm interpreter of a task service (docs/elastic.md, "Warm Python ranks").

A task service started with ``--warm-python PY`` runs ``PY -m hvd_bridge._warm`` once: it
imports the modules named in ``--imports`` (hvd-task passes torch and torch._dynamo by
default) and then waits on a Unix socket.
``hvd-exec``, asked to run a program that is this interpreter (``PY script.py ...``,
``PY -m module ...``, ``PY -c code ...``), hands the request here instead of starting a new
interpreter: this process forks, and the child becomes the rank with the request's arguments,
environment, working directory and descriptors, without importing torch again. Everything
else (another interpreter, options that change how Python starts) is answered "cold" and
``hvd-exec`` starts the program itself.

Protocol (SOCK_SEQPACKET, one message each, peers of the same user only):
  request  "hvd-warm 1" NUL cwd NUL argc NUL argv... NUL envc NUL env... NUL, with the
           descriptors stdout, stderr and the program's descriptors 3, 4, ... attached;
  answers  "cold <why>": run it yourself; "started <pid>", later "exit <status>" (a signal
           N as 128 + N). The requester closing its end (or dying) stops the rank: SIGTERM to
           its process group and every descendant, SIGKILL after --grace-ms.

A rank's descendants: the interpreter and every rank are child subreapers, so a process that
leaves the rank's group (setsid) or loses its parent stays the rank's descendant while the
rank runs and becomes the interpreter's child once the rank has ended. When a rank ends, its
group and every child of the interpreter that is not a rank (what an ended rank left) get
SIGTERM, and SIGKILL after --grace-ms; its "exit" answer waits until they are gone, so nothing
of a rank outlives it (a process left holding the rank's stdout would also keep mpirun
waiting for the rank), as the process runner does for a cold rank.
"""
import argparse
import atexit
import ctypes
import fcntl
import gc
import importlib
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import threading
import time
import traceback

MAGIC = "hvd-warm 1"
MAX_REQUEST = 1 << 20
MAX_FDS = 8
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _say(line):
    sys.stderr.write("hvd-warm[%d]: %s\n" % (os.getpid(), line))
    sys.stderr.flush()


def _parse(data):
    """(cwd, argv, env) of a request; ValueError if it is malformed."""
    parts = data.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    fields = [p.decode("utf-8", "surrogateescape") for p in parts]
    if len(fields) < 3 or fields[0] != MAGIC:
        raise ValueError("not an hvd-warm request")
    cwd, rest = fields[1], fields[2:]
    argc = int(rest[0])
    argv, rest = rest[1:1 + argc], rest[1 + argc:]
    envc = int(rest[0])
    env_items = rest[1:1 + envc]
    if argc < 1 or len(argv) != argc or len(env_items) != envc or len(rest) != 1 + envc:
        raise ValueError("bad counts")
    env = {}
    for item in env_items:
        k, sep, v = item.partition("=")
        if sep and k:
            env[k] = v
    return cwd, argv, env


def _resolve(prog, env, cwd):
    """prog as the rank's exec would find it: through its PATH, relative to its directory."""
    if "/" in prog:
        return os.path.join(cwd, prog)
    for d in env.get("PATH", os.defpath).split(os.pathsep):
        p = os.path.join(cwd, d or ".", prog)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def _same_interpreter(prog, env, cwd):
    """Whether prog is this interpreter: the same file in the same directory (a virtual
    environment's python is a link to the base one, but its directory makes it the venv's)."""
    path = _resolve(prog, env, cwd)
    if not path:
        return False

    def key(p):
        return os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))

    return key(path) == key(sys.executable)


# Variables read when native libraries load (the dynamic loader, OpenMP, MKL, OpenBLAS): a
# rank whose values differ from this interpreter's would not get them, so it starts cold.
# OMP_NUM_THREADS is the exception: torch.set_num_threads applies it in the rank.
_LOAD_TIME = ("LD_", "OMP_", "MKL_", "OPENBLAS_", "GOMP_", "KMP_", "MALLOC_")


# This interpreter's environment before its imports (a library may set variables as it
# loads: Intel's OpenMP sets KMP_INIT_AT_FORK).
_START_ENV = dict(os.environ)


def _load_time_change(env):
    for k in set(env) | set(_START_ENV):
        if k.startswith(_LOAD_TIME) and k != "OMP_NUM_THREADS" and env.get(k) != _START_ENV.get(k):
            return k
    return None


def _plan(argv, env, cwd):
    """What the child runs: ("path", file, args) / ("module", name, args) / ("code", text,
    args), and whether unbuffered; or a reason (str) to run cold."""
    if not _same_interpreter(argv[0], env, cwd):
        return "%s is not the warm interpreter %s" % (argv[0], sys.executable)
    changed = _load_time_change(env)
    if changed:
        return "%s differs from the warm interpreter's, and is read when libraries load" % changed
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    no_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-", "-m", "-c"):
        flags = argv[i][1:]
        if not flags or any(f not in "uB" for f in flags):
            return "option %s changes how Python starts" % argv[i]
        unbuffered |= "u" in flags
        no_bytecode |= "B" in flags
        i += 1
    if i >= len(argv):
        return "no script (an interactive interpreter)"
    if argv[i] in ("-m", "-c"):
        if i + 1 >= len(argv):
            return "%s without an argument" % argv[i]
        kind = "module" if argv[i] == "-m" else "code"
        return (kind, argv[i + 1], argv[i + 2:], unbuffered, no_bytecode)
    if argv[i] == "-":
        return "a script on stdin"
    if not os.path.isfile(os.path.join(cwd, argv[i])):
        return "%s is not a file (a directory or zip application starts cold)" % argv[i]
    return ("path", argv[i], argv[i + 1:], unbuffered, no_bytecode)


# ---- The child: becomes the rank ----------------------------------------------------------


def _prctl(option, value):
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _die_with(parent):
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def _take_fds(fds):
    """fds (stdout, stderr, then the program's 3, 4, ...) become 1, 2, 3, ...; 0 is
    /dev/null. Every other descriptor the zygote opened for itself is closed by the caller."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 256) for fd in fds]
    for fd in fds:
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    if null != 0:
        os.dup2(null, 0)
        os.close(null)
    for target, fd in zip([1, 2] + [3 + i for i in range(len(high) - 2)], high):
        os.dup2(fd, target)
        os.close(fd)


def _python_path(env):
    """The entries of the rank's PYTHONPATH the zygote's sys.path lacks, placed as Python
    would (before the standard library)."""
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[1:1] = extra


def _new_main(**attrs):
    """A fresh __main__ module that stays sys.modules["__main__"] to the end (atexit
    handlers and pickling at exit see the program's, not this module)."""
    main = type(sys)("__main__")
    main.__dict__.update(__builtins__=__builtins__, **attrs)
    sys.modules["__main__"] = main
    return main


def _reseed(env):
    """What a new process would have differently: fresh random seeds (Python's random
    reseeds itself after a fork; numpy's and torch's global generators do not), and the
    rank's OMP_NUM_THREADS for torch, whose OpenMP read it when it loaded."""
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
        n = env.get("OMP_NUM_THREADS", "")
        if n.isdigit() and int(n) > 0:
            torch.set_num_threads(int(n))


def _run(plan):
    kind, what, args, unbuffered, no_bytecode = plan
    if unbuffered:
        for s in (sys.stdout, sys.stderr):
            s.reconfigure(write_through=True)
    sys.dont_write_bytecode = no_bytecode
    if kind == "path":
        sys.argv = [what] + args
        sys.path[0] = os.path.dirname(os.path.abspath(what))
        with open(what, "rb") as f:
            code = compile(f.read(), what, "exec")
        main = _new_main(__file__=what, __cached__=None, __loader__=None, __spec__=None,
                         __package__=None)
        exec(code, main.__dict__)
    elif kind == "module":
        sys.argv = [what] + args
        sys.path[0] = os.getcwd()
        _new_main()  # runs in the dict of sys.modules["__main__"]: not this module's
        runpy._run_module_as_main(what, alter_argv=True)  # what `python -m` runs
    else:
        sys.argv = ["-c"] + args
        sys.path[0] = ""
        main = _new_main(__loader__=None, __spec__=None, __package__=None)
        exec(compile(what, "<string>", "exec"), main.__dict__)


def _exit_code(e):
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    sys.stderr.write("%s\n" % (e.code,))
    return 1


def _child(zygote, plan, cwd, env, fds):
    os.setpgid(0, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # its descendants stay its own while it runs
    _die_with(zygote)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _take_fds(fds)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _python_path(env)
    _reseed(env)
    code = 0
    try:
        _run(plan)
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 130 if isinstance(sys.exc_info()[1], KeyboardInterrupt) else 1
    # What the interpreter does on its way out: non-daemon threads, atexit, then the
    # program's objects (a file it never closed is flushed as it is finalised), the streams.
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        main = sys.modules.get("__main__")
        if main is not None and main.__name__ == "__main__":
            main.__dict__.clear()
        gc.collect()
    except BaseException:
        traceback.print_exc()
        code = code or 1
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


# ---- The zygote -----------------------------------------------------------------------------


def _parents():
    """{pid: parent pid} of every process (those that vanish while read are left out)."""
    found = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d, "rb") as f:
                found[int(d)] = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return found


def _descendants(roots, parents):
    """[(pid, parent pid)] of the processes below roots in parents ({pid: parent pid}), roots
    excluded."""
    kids = {}
    for pid, ppid in parents.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo, seen = [], list(roots), set(roots)
    while todo:
        parent = todo.pop()
        for kid in kids.get(parent, ()):
            if kid not in seen:  # a pid reused while /proc was read must not loop
                seen.add(kid)
                out.append((kid, parent))
                todo.append(kid)
    return out


def _kill(pid, parent, sig):
    """sig to pid if it is still parent's child: pinned with a pidfd first, so that a pid
    reused since /proc was read is never signalled."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # gone (or out of descriptors: a later round finds it again)
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            if int(f.read().rsplit(b")", 1)[1].split()[1]) == parent:
                signal.pidfd_send_signal(fd, sig)
    except (OSError, ValueError, IndexError):
        pass
    finally:
        os.close(fd)


def _gone(conn):
    """Whether the requester closed its end (it was stopped while waiting for an answer)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


class Rank:
    def __init__(self, conn, pid, pidfd):
        self.conn, self.pid, self.pidfd = conn, pid, pidfd
        self.kill_at = None  # SIGKILL after this time (monotonic), once stopped or ended
        self.code = None  # its exit status, once it has ended


class Zygote:
    def __init__(self, listener, grace_s):
        self.grace_s = grace_s
        self.sel = selectors.DefaultSelector()
        self.listener = listener
        self.sel.register(self.listener, selectors.EVENT_READ, ("accept", None))
        self.ranks = {}
        self.ending = []  # ended ranks, answered once what they left is gone (finish_ending)
        self.parent = os.getppid()
        _prctl(PR_SET_CHILD_SUBREAPER, 1)  # what an ended rank leaves comes here
        self.own_children = set()  # started by the imports, not by a rank

    def own_fds(self):
        """Every descriptor of the zygote's own: the child closes them."""
        fds = [self.listener.fileno(), self.sel.fileno()]
        fds += [k.fd for k in self.sel.get_map().values()]
        fds += [r.conn.fileno() for r in self.ending]
        for r in self.ranks.values():
            fds.append(r.conn.fileno())
            if r.pidfd is not None:
                fds.append(r.pidfd)
        return fds

    def accept(self):
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", cred)
        if uid != os.getuid():
            conn.close()
            return
        self.sel.register(conn, selectors.EVENT_READ, ("request", None))

    def request(self, conn):
        self.sel.unregister(conn)
        fds = []
        try:
            data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, MAX_FDS)
            cwd, argv, env = _parse(data)
            if len(fds) < 2:
                raise ValueError("no stdout and stderr")
        except (OSError, ValueError, IndexError) as e:
            for fd in fds:
                os.close(fd)
            self.answer(conn, "cold bad request: %s" % e)
            conn.close()
            return
        plan = _plan(argv, env, cwd)
        if isinstance(plan, tuple) and _gone(conn):
            plan = "the requester went away"  # stopped while we were importing
        if isinstance(plan, str):
            for fd in fds:
                os.close(fd)
            _say("a rank starts cold: %s" % plan)
            self.answer(conn, "cold " + plan)
            conn.close()
            return
        self.fork(conn, plan, cwd, env, fds)

    def fork(self, conn, plan, cwd, env, fds):
        sys.stdout.flush()
        sys.stderr.flush()
        me = os.getpid()
        mine = self.own_fds() + [conn.fileno()]
        try:
            pid = os.fork()
        except OSError as e:
            for fd in fds:
                os.close(fd)
            self.answer(conn, "cold cannot fork: %s" % e)
            conn.close()
            return
        if pid == 0:  # never returns: a child must not go on serving
            try:
                for fd in set(mine):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                _child(me, plan, cwd, env, fds)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(127)
        for fd in fds:
            os.close(fd)
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # out of descriptors: polled instead
            pidfd = None
        rank = Rank(conn, pid, pidfd)
        self.ranks[pid] = rank
        self.sel.register(conn, selectors.EVENT_READ, ("stop", rank))
        if pidfd is not None:
            self.sel.register(pidfd, selectors.EVENT_READ, ("exited", rank))
        self.answer(conn, "started %d" % pid)

    @staticmethod
    def answer(conn, text):
        try:
            conn.send(text.encode())
        except OSError:
            pass

    def stop(self, rank):
        """The requester closed its end or died: stop the rank, SIGKILL after the grace."""
        if self.ranks.get(rank.pid) is not rank:  # it exited in the same round
            return
        try:
            rank.conn.recv(64)
        except OSError:
            pass
        self.sel.unregister(rank.conn)
        if rank.kill_at is None:
            self.signal(rank, signal.SIGTERM)
            self.signal(rank, signal.SIGCONT)
            rank.kill_at = time.monotonic() + self.grace_s

    @staticmethod
    def signal(rank, sig, descendants=True):
        """sig to the rank's process group and to every descendant of the (live) rank."""
        try:
            os.killpg(rank.pid, sig)
        except OSError:
            pass
        for pid, parent in _descendants([rank.pid], _parents()) if descendants else ():
            _kill(pid, parent, sig)

    def leftovers(self):
        """The interpreter's children that no live rank and no import started: what ended
        ranks left (a live rank is a subreaper: its descendants stay its own). Reaps those
        that have exited; returns the others and the process table it read."""
        me = os.getpid()
        parents = _parents()
        left = []
        for pid, ppid in parents.items():
            if ppid != me or pid in self.ranks or pid in self.own_children:
                continue
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    continue
            except ChildProcessError:
                continue
            left.append(pid)
        return left, parents

    def signal_leftovers(self, sig):
        left, parents = self.leftovers()
        me = os.getpid()
        for pid, parent in [(p, me) for p in left] + _descendants(left, parents):
            _kill(pid, parent, sig)
        return left

    def sweep(self, within_s=1.0):
        """SIGKILLs what ended ranks left, until it is gone (one that forks while it is being
        killed hands its child up here). Bounded: what is still there after within_s is left
        to the next sweep."""
        deadline = time.monotonic() + within_s
        while True:
            left = self.signal_leftovers(signal.SIGKILL)
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        if left:            _say("processes left by ended ranks did not end within %.0f s of SIGKILL: %s"
                 % (within_s, " ".join(str(p) for p in left)))

    def exited(self, rank, status=None):
        """The rank ended: what it left gets SIGTERM (SIGKILL at the grace period's end), and
        its status is answered once that is gone (finish_ending)."""
        if status is None:
            _, status = os.waitpid(rank.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        rank.code = 128 - code if code < 0 else code
        if rank.pidfd is not None:
            self.sel.unregister(rank.pidfd)
            os.close(rank.pidfd)
        if rank.kill_at is None:
            self.sel.unregister(rank.conn)
        del self.ranks[rank.pid]
        # What it left, its group included, is the interpreter's children and what is below
        # them now (its own pid is free for reuse: no signal by it). A rank being stopped
        # keeps its deadline; one already SIGKILLed gets none.
        for sig in (signal.SIGTERM, signal.SIGCONT):
            self.signal_leftovers(sig)
        now = time.monotonic()
        if rank.kill_at is None:
            rank.kill_at = now + self.grace_s
        elif rank.kill_at == float("inf"):
            rank.kill_at = now
        self.ending.append(rank)
        self.finish_ending()

    def finish_ending(self):
        """Answers each ended rank once nothing it left runs; at its deadline, SIGKILLs what
        is left (what ended ranks left cannot be told apart: an earlier deadline also ends
        what a later rank left)."""
        if not self.ending:
            return
        due = [r for r in self.ending if time.monotonic() >= r.kill_at]
        if due:
            self.sweep()
        left, _ = self.leftovers()
        for rank in list(self.ending):
            if left and rank not in due:
                continue
            self.ending.remove(rank)
            self.answer(rank.conn, "exit %d" % rank.code)
            rank.conn.close()

    def timeout(self):
        due = [r.kill_at for r in list(self.ranks.values()) + self.ending
               if r.kill_at not in (None, float("inf"))]
        wait = max(0.0, min(due) - time.monotonic()) if due else 1.0
        if any(r.pidfd is None for r in self.ranks.values()):
            wait = min(wait, 0.05)
        if self.ending:  # what ended ranks left is polled: it has no descriptor to watch
            wait = min(wait, 0.05)
        return wait

    def poll_unwatched(self):
        """Ranks without a pidfd: reaped by polling."""
        for rank in [r for r in self.ranks.values() if r.pidfd is None]:
            pid, status = os.waitpid(rank.pid, os.WNOHANG)
            if pid:
                self.exited(rank, status)

    def serve(self):
        self.own_children = {p for p, _ in _descendants([os.getpid()], _parents())}
        while os.getppid() == self.parent:
            for key, _ in self.sel.select(self.timeout()):
                what, rank = key.data
                if what == "accept":
                    self.accept()
                elif what == "request":
                    self.request(key.fileobj)
                elif what == "stop":
                    self.stop(rank)
                else:
                    self.exited(rank)
            self.poll_unwatched()
            self.finish_ending()
            now = time.monotonic()
            for rank in list(self.ranks.values()):
                if rank.kill_at is not None and now >= rank.kill_at:
                    self.signal(rank, signal.SIGKILL)
                    rank.kill_at = float("inf")  # once: its pidfd says when it is gone


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m hvd_bridge._warm",
                                 description="A task service's warm interpreter (started by "
                                 "hvd-task --warm-python; not meant to be run by hand).")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--socket", help="bind and serve this Unix socket path")
    where.add_argument("--socket-fd", type=int,
                       help="serve this listening SOCK_SEQPACKET socket (hvd-task binds it "
                       "before it registers, so that no rank finds it missing)")
    ap.add_argument("--imports", default="torch",
                    help="comma-separated modules to import before serving")
    ap.add_argument("--grace-ms", type=int, default=5000,
                    help="SIGTERM to SIGKILL when a rank is stopped, and for what a rank left "
                    "running when it ended (default: 5000)")
    a = ap.parse_args(argv)
    if sys.version_info < (3, 9):  # socket.recv_fds, os.pidfd_open
        _say("a warm interpreter needs Python 3.9 or later (this is %d.%d): ranks start cold"
             % sys.version_info[:2])
        return 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if a.socket_fd is not None:
        listener = socket.socket(fileno=a.socket_fd)
    else:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(a.socket)
        listener.listen(128)
    z = Zygote(listener, a.grace_ms / 1000.0)
    for name in filter(None, (m.strip() for m in a.imports.split(","))):
        try:
            importlib.import_module(name)
        except Exception as e:  # the ranks that need it will say so themselves
            _say("cannot import %s: %s (ranks import it themselves)" % (name, e))
    z.serve()


if __name__ == "__main__":
    sys.exit(main())
