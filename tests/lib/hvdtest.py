"""hvdtest: the one copy of what the Python tests (and the bench scripts) share.

Nothing to install: every script puts this folder on sys.path relative to its own file, so
that ctest and a developer running the script by hand get the same module:

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
    import hvdtest  # noqa: E402

(from bench/: os.path.join(<repo>, "tests", "lib")). Python 3 standard library only.

What it holds:
  outcomes      Failure, Skip, check(); SKIP (77, ctest's SKIP_RETURN_CODE) and skip();
                run_cases(), the ok/skip/FAIL loop of the scripts made of test_* cases;
                arg_parser(), the options every script takes (--bin DIR, ...)
  environment   marked_env(): a job's environment, with the mark MARK_VAR=<mark> that every
                process of the job inherits; add_asan_option()
  /proc         processes_with(mark): the live processes that carry a mark, as Proc tuples;
                proc_info(), descendants(), describe()
  leftovers     wait_gone(), kill(), leftovers(), assert_no_leftovers(): "nothing of the job
                is left", with a message listing pid and command line of what was
  files left    entries_left() (a job's directories in a TMPDIR), shm_dirs() (/dev/shm)
  running       run() (timeout, captured output), stop() (end a Popen, SIGKILL at the end),
                wait_for(), sh()
  driver, tasks start_driver(), task_hint() (how hvd-driver says to start its tasks),
                start_task(), read_env_file() (hvd-driver serve --env-file), parse_kv()
  network       free_port(), port_open(), NetnsHosts (fake hosts in network namespaces)
  MPIs          MPIS, mpi_install() (the PyPI wheels of Open MPI 5 and MPICH),
                runtime_build() (the runtime and the allreduce example against one of them)
"""
import argparse
import collections
import fcntl
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

# The variable that marks every process of a job (tests/e2e, faults, adversarial, ssh,
# valgrind): the test puts it in the job's environment, /proc finds the job by it.
MARK_VAR = "HVD_E2E_MARK"
# The mark of the JNI and Spark tests (tests/jni/jvm_probe.c reports it back per rank).
MARKER_VAR = "HVD_TEST_MARKER"
# ctest's SKIP_RETURN_CODE for every Python test.
SKIP = 77
# Variables of the caller's environment that would point a test's job at another driver,
# secret, host hash or ssh agent, or change what its programs print.
CLEARED_VARS = ("HVD_SECRET", "HVD_SECRET_FILE", "HVD_DRIVER_ADDRS", "HVD_HOST_HASH",
                "SSH_AUTH_SOCK", "HVD_RSH_VERBOSE")


# ---- outcomes ------------------------------------------------------------------------------

class Failure(Exception):
    """A check failed; the message says which, with what was seen."""


class Skip(Exception):
    """A case cannot run on this machine; the message says why."""


def check(cond, what):
    """Raises Failure(what) unless cond holds."""
    if not cond:
        raise Failure(what)


def skip(why):
    """Ends the script as skipped: prints "skip: <why>", exits SKIP (77)."""
    print("skip: " + why, flush=True)
    sys.exit(SKIP)


def arg_parser(*paths):
    """An argparse parser with the given options ("--bin", "--probe-lib", ...) required, each
    a path made absolute (the scripts run programs in other directories)."""
    ap = argparse.ArgumentParser()
    for opt in paths:
        ap.add_argument(opt, required=True, type=os.path.abspath)
    return ap


def cases_in(namespace):
    """{name: function} of the test_<name> functions of a module's globals()."""
    return {name[5:]: fn for name, fn in namespace.items() if name.startswith("test_") and callable(fn)}


def run_cases(cases, names):
    """Runs the named cases (every case, sorted, when names is empty), printing one line per
    case (ok / skip / FAIL with the reason) and "N passed, M failed, K skipped" last. A case
    fails on Failure, subprocess.TimeoutExpired or OSError. Returns the exit status: 1 on any
    failure, SKIP when cases ran and all were skipped, else 0."""
    passed = failed = skipped = 0
    for name in names or sorted(cases):
        t0 = time.time()
        try:
            cases[name]()
            passed += 1
            print("ok   %s (%.1f s)" % (name, time.time() - t0), flush=True)
        except Skip as e:
            skipped += 1
            print("skip %s: %s" % (name, e), flush=True)
        except (Failure, subprocess.TimeoutExpired, OSError) as e:
            failed += 1
            print("FAIL %s (%.1f s): %s" % (name, time.time() - t0, e), flush=True)
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    if failed:
        return 1
    return SKIP if skipped and not passed else 0


def run_cases_in_tmpdir(namespace, names, prefix):
    """run_cases over the test_* functions of namespace with TMPDIR a fresh directory
    (prefix), for the jobs and for this process's own tempfile calls, removed afterwards
    with whatever the cases left there."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    os.environ["TMPDIR"] = tmp
    tempfile.tempdir = None  # tempfile read TMPDIR once already: read it again
    try:
        return run_cases(cases_in(namespace), names)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        tempfile.tempdir = None


def reset_lines(err):
    """hvd-driver's reset lines ("hvd-driver: reset N: ...") in an elastic job's stderr.
    mpirun writes to the same stderr, and a crashing mpirun of the old launch (Open MPI 4.1's
    segfault in PMIx_Finalize when its daemons are killed) may leave half a line that the
    driver's line then ends: found anywhere in a line."""
    found = (re.search(r"hvd-driver: reset \d+:.*", l) for l in err.splitlines())
    return [m.group(0) for m in found if m]


# ---- environment ---------------------------------------------------------------------------

def marked_env(mark, bin_dir=None, **extra):
    """The environment for a job's processes: this one, plus MARK_VAR=mark (when mark is not
    None), Open MPI allowed to run as root, bin_dir first in PATH (when given), without
    CLEARED_VARS, then extra (values turned into strings)."""
    env = dict(os.environ)
    if mark is not None:
        env[MARK_VAR] = mark
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    if bin_dir:
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
        if tsan_build(bin_dir):
            mpi_under_tsan(env)
    for k in CLEARED_VARS:
        env.pop(k, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


_TSAN_BUILDS = {}


def tsan_build(bin_dir):
    """Whether bin_dir's hvd-exec is a ThreadSanitizer build (it carries the TSan runtime)."""
    if bin_dir not in _TSAN_BUILDS:
        try:
            with open(os.path.join(bin_dir, "hvd-exec"), "rb") as f:
                _TSAN_BUILDS[bin_dir] = b"__tsan_init" in f.read()
        except OSError:
            _TSAN_BUILDS[bin_dir] = False
    return _TSAN_BUILDS[bin_dir]


def mpi_under_tsan(env):
    """What ranks that run Open MPI inside a TSan build of hvd-exec need: TSan's reports of
    Open MPI's own lock order left out (tests/lib/mpi-tsan.supp), and Open MPI 5's PMIx kept
    off shared memory at fixed addresses, which TSan's memory layout does not leave free
    (PMIX_MCA_gds=hash, what PMIx's own message advises)."""
    supp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi-tsan.supp")
    env["TSAN_OPTIONS"] = (env.get("TSAN_OPTIONS", "") + ":suppressions=" + supp).lstrip(":")
    env["PMIX_MCA_gds"] = "hash"
    return env


def add_asan_option(env, option):
    """Appends option ("name=value") to env's ASAN_OPTIONS; builds without ASan ignore it."""
    env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":" + option).lstrip(":")
    return env


# ---- /proc ---------------------------------------------------------------------------------

# One process as /proc shows it: argv (list of str, empty arguments dropped), env (dict of
# str, {} when unreadable), cmdline (argv joined by spaces), state (the letter of
# /proc/PID/stat: R, S, D, Z, ...).
Proc = collections.namedtuple("Proc", "pid argv env cmdline state")


def proc_info(pid):
    """Proc for pid, or None when it is gone."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    env = {}
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for kv in f.read().split(b"\0"):
                if b"=" in kv:
                    k, v = kv.split(b"=", 1)
                    env[k.decode(errors="replace")] = v.decode(errors="replace")
    except OSError:
        pass  # a zombie's environment cannot be read
    return Proc(pid, argv, env, " ".join(argv), state)


def processes_with(mark, var=MARK_VAR):
    """{pid: Proc} of the live (non-zombie) processes whose environment holds var=mark, this
    process excepted."""
    needle = ("%s=%s" % (var, mark)).encode()
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
        if info and info.state != "Z":
            found[int(d)] = info
    return found


def parent_of(pid):
    """The parent pid of pid, or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descendants(roots):
    """Pids of the processes below any of the roots (zombies included)."""
    roots = set(roots)
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        p, n = int(d), 0
        while p and p > 1 and n < 64:
            p = parent_of(p)
            n += 1
            if p in roots:
                found.append(int(d))
                break
    return found


def describe(procs, width=300):
    """["pid: command line"] of {pid: Proc}, by pid, each command line cut at width."""
    out = []
    for pid, p in sorted(procs.items()):
        cmd = p.cmdline if len(p.cmdline) <= width else p.cmdline[:width - 3] + "..."
        out.append("%d: %s" % (pid, cmd))
    return out


# ---- leftovers -----------------------------------------------------------------------------

def wait_gone(scan, timeout, interval=0.1):
    """Calls scan() until it returns something empty or timeout s have passed; returns its
    last result (what is still there)."""
    deadline = time.time() + timeout
    left = scan()
    while left and time.time() < deadline:
        time.sleep(interval)
        left = scan()
    return left


def kill(pids, sig=signal.SIGKILL):
    """Sends sig to every pid; those already gone are skipped."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def leftovers(mark, wait_s=10, var=MARK_VAR, also=None):
    """Waits up to wait_s s for every process carrying var=mark (and every pid that also(),
    when given, returns) to be gone, SIGKILLs what is still there and returns its
    description (describe()); [] when nothing was left."""
    def scan():
        procs = processes_with(mark, var)
        for pid in (also() if also else ()):
            info = procs.get(pid) or proc_info(pid)
            if info:
                procs[pid] = info
        return procs
    left = wait_gone(scan, wait_s)
    kill(left)
    return describe(left)


def assert_no_leftovers(mark, wait_s=10, var=MARK_VAR, also=None):
    """leftovers(), as a Failure that lists them."""
    left = leftovers(mark, wait_s, var, also)
    check(not left, "processes of the job left behind:\n  " + "\n  ".join(left))


# ---- files left ----------------------------------------------------------------------------

def entries_left(dirs, prefix):
    """Paths of the entries of dirs whose name starts with prefix (a job's private
    directories in a TMPDIR: hvd-driver.*, hvd-ssh.*), sorted."""
    return sorted(os.path.join(d, n) for d in dirs for n in os.listdir(d) if n.startswith(prefix))


def shm_dirs(prefix="hvd-task-"):
    """The set of /dev/shm entries whose name starts with prefix (Open MPI's shared-memory
    backing directories of hvd-task's commands)."""
    return set(glob.glob(os.path.join("/dev/shm", glob.escape(prefix) + "*")))


class ShmWatch:
    """Notes the /dev/shm backing directories that a job's processes (those with var=mark)
    name, from a thread that looks every 50 ms while the job runs, so that a check for what the
    job left there is not confused by other jobs running on the machine at the same time.
    ``left()`` stops watching and returns those of them that still exist."""

    ENV = "OMPI_MCA_btl_vader_backing_directory"

    def __init__(self, mark, var=MARK_VAR):
        import threading
        self.mark, self.var, self.seen = mark, var, set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        while not self.stop.is_set():
            for p in processes_with(self.mark, self.var).values():
                d = p.env.get(self.ENV)
                if d and d.startswith("/dev/shm/"):
                    self.seen.add(d)
            self.stop.wait(0.05)

    def left(self):
        self.stop.set()
        self.thread.join()
        return sorted(d for d in self.seen if os.path.exists(d))


# ---- running -------------------------------------------------------------------------------

def run(cmd, env=None, timeout=120, cwd=None, merge=False, new_session=False):
    """Runs cmd with stdin from /dev/null, its output captured; returns (status, stdout,
    stderr, seconds), the output decoded ("" for stderr with merge=True: it goes to stdout).
    Past timeout s it kills the command (its whole process group with new_session=True) and
    raises subprocess.TimeoutExpired, which holds the output so far."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                         start_new_session=new_session)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if new_session:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
        p.kill()
        p.wait()
        raise
    return (p.returncode, out.decode(errors="replace"), (err or b"").decode(errors="replace"),
            time.perf_counter() - t0)


def stop(proc, timeout=10, sig=None, drain=False):
    """Ends a Popen: sends sig (when given and it still runs), waits up to timeout s (with
    drain=True reading its pipes meanwhile, so that a chatty process cannot block on a full
    one), then SIGKILLs and reaps it. True when it ended before the SIGKILL."""
    if sig is not None and proc.poll() is None:
        proc.send_signal(sig)
    try:
        if drain:
            proc.communicate(timeout=timeout)
        else:
            proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False


def wait_for(pred, timeout, what=None, interval=0.05):
    """Calls pred() until it returns something true, and returns that. After timeout s:
    Failure("timed out waiting for <what>") when what is given, else pred()'s last (false)
    result."""
    deadline = time.time() + timeout
    while True:
        v = pred()
        if v or time.time() >= deadline:
            break
        time.sleep(interval)
    if not v and what is not None:
        raise Failure("timed out after %g s waiting for %s" % (timeout, what))
    return v


def stalling_fork_agent_args(d):
    """Open MPI 4 mpirun arguments under which every orted comes up but never starts a rank:
    a fork agent, written into directory d, that sleeps instead of starting it (how PRRTE 3.0
    stalls now and then by itself: docs/launcher.md). For --mpi-args."""
    agent = os.path.join(d, "stall.sh")
    with open(agent, "w") as f:
        f.write("#!/bin/sh\nexec sleep 300\n")
    os.chmod(agent, 0o755)
    return "-mca orte_fork_agent " + agent


def sh(*cmd):
    """Runs a setup command (ip ...); subprocess.CalledProcessError, with its stderr, when it
    fails."""
    subprocess.run(list(cmd), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


# ---- driver and tasks ----------------------------------------------------------------------

# What hvd-driver prints when it waits for tasks started by hand.
TASK_HINT = re.compile(rb"HVD_SECRET_FILE=(\S+) hvd-task --driver '([^']+)'")


def start_driver(bin_dir, args, env, cwd, prefix=(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 **popen):
    """Popen of `[prefix...] hvd-driver args...` with stdin from /dev/null."""
    return subprocess.Popen(list(prefix) + [os.path.join(bin_dir, "hvd-driver")] + list(args), env=env,
                            cwd=cwd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, **popen)


def task_hint(proc, what="hvd-driver", timeout=30, errfile=None):
    """How to start the tasks a driver waits for: hvd-driver prints `HVD_SECRET_FILE=F hvd-task
    --driver 'ADDRS' --index ...` on stderr. Reads proc.stderr (a pipe) line by line or, with
    errfile (the file proc's stderr goes to), rereads that, for up to timeout s. Returns
    {"HVD_SECRET_FILE": F, "HVD_DRIVER_ADDRS": ADDRS}, for the tasks' environment. Failure
    when the driver exits first or does not say it."""
    deadline = time.time() + timeout
    text = b""
    if errfile is None:
        while b"--index" not in text and time.time() < deadline:
            text += proc.stderr.readline()
            if proc.poll() is not None:
                raise Failure("%s exited early: %r" % (what, text[-2000:]))
    else:
        while time.time() < deadline and proc.poll() is None:
            errfile.seek(0)
            text = errfile.read()
            if TASK_HINT.search(text):
                break
            time.sleep(0.05)
    m = TASK_HINT.search(text)
    if not m:
        raise Failure("%s did not say how to start tasks: %r" % (what, text[-2000:]))
    return {"HVD_SECRET_FILE": m.group(1).decode(), "HVD_DRIVER_ADDRS": m.group(2).decode()}


def start_task(bin_dir, index, env, host=None, start_timeout=60, cwd=None, prefix=(), args=(),
               stderr=subprocess.DEVNULL, **popen):
    """Popen of `[prefix...] hvd-task --index I --start-timeout S args...`, with
    HVD_HOST_HASH=host (when given) and stdin and stdout on /dev/null."""
    if host is not None:
        env = dict(env, HVD_HOST_HASH=host)
    cmd = list(prefix) + [os.path.join(bin_dir, "hvd-task"), "--index", str(index), "--start-timeout",
                          str(start_timeout)] + list(args)
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=stderr, **popen)


def read_env_file(path):
    """{name: value} of the `export NAME='value'` lines of hvd-driver serve's --env-file."""
    vals = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"export (\w+)='?([^']*)'?$", line.strip())
            if m:
                vals[m.group(1)] = m.group(2)
    return vals


def serve_mpirun_cmd(vals, hosts_override=None, np_=None):
    """The command of docs/launcher.md's generic form, as argv, from the values of hvd-driver
    serve's env file (read_env_file)."""
    return [vals["HVD_MPIRUN"], "-np", np_ or vals["HVD_NP"], vals["HVD_HOSTS_OPT"],
            hosts_override or vals["HVD_HOSTS"]] + vals["HVD_AGENT_ARGS"].split() + \
        vals["HVD_MPIRUN_ARGS"].split() + vals["HVD_IFACE_ARGS"].split() + [vals["HVD_EXEC"]]


def parse_kv(text):
    """{key: value} of a "k=v k=v ..." text (a probe's result)."""
    return dict(kv.split("=", 1) for kv in text.split())


# ---- network -------------------------------------------------------------------------------

def free_port(addrs=("127.0.0.1",), tries=50):
    """A TCP port free on every address of addrs (nothing listens there now), or None."""
    import socket
    for _ in range(tries):
        s = socket.socket()
        s.bind((addrs[0], 0))
        port = s.getsockname()[1]
        s.close()
        ok = True
        for a in addrs:
            t = socket.socket()
            try:
                t.bind((a, port))
            except OSError:
                ok = False
            finally:
                t.close()
        if ok:
            return port
    return None


def port_open(addr, port, timeout=0.2):
    """Whether something accepts TCP connections at addr:port."""
    import socket
    try:
        socket.create_connection((addr, port), timeout=timeout).close()
        return True
    except OSError:
        return False


class NetnsHosts:
    """Fake hosts in network namespaces, one per key, each with lo and an eth0 whose veth peer
    is on one bridge; host keys[i] has the address <net>.<x>.<10+i>/24 (x from a random tag).

        with NetnsHosts("abd", net="10.79", prefix="hvdf") as hosts:
            cmd = hosts.exec_in("a") + [...]      # ip netns exec <namespace of a> ...
            hosts.ns["a"], hosts.veth["a"]        # the namespace, the bridge side of its link

    create() (or entering the with) raises Skip when this machine cannot make them (not
    root, no ip, bridges or namespaces refused); remove() (or leaving the with) deletes what
    was made, whatever happened. Names are unique per instance (a random tag): tests running
    at the same time do not meet."""

    def __init__(self, keys, net, prefix="hvd"):
        tag = uuid.uuid4().hex[:6]
        self.keys = list(keys)
        self.ns = {k: "%s%s%s" % (prefix, tag, k) for k in self.keys}
        self.veth = {k: "%sv%s%s" % (prefix, tag, k) for k in self.keys}
        self.bridge = "%sbr%s" % (prefix, tag)
        self.net = "%s.%d" % (net, int(tag[:2], 16) % 250)
        self.made = []

    @staticmethod
    def check_possible():
        """Skip unless this process may make namespaces (root, with iproute2's ip)."""
        if os.geteuid() != 0:
            raise Skip("needs root to create network namespaces")
        if not shutil.which("ip"):
            raise Skip("no ip command (iproute2)")

    def create(self):
        self.check_possible()
        try:
            try:
                sh("ip", "link", "add", self.bridge, "type", "bridge")
            except (subprocess.CalledProcessError, OSError) as e:
                raise Skip("cannot create a bridge: %s" %
                           (e.stderr.decode().strip() if getattr(e, "stderr", None) else e))
            self.made.append(("link", self.bridge))
            sh("ip", "link", "set", self.bridge, "up")
            for i, k in enumerate(self.keys):
                try:
                    sh("ip", "netns", "add", self.ns[k])
                except subprocess.CalledProcessError as e:
                    raise Skip("cannot create a network namespace: %s" % e.stderr.decode().strip())
                self.made.append(("netns", self.ns[k]))
                sh("ip", "link", "add", self.veth[k], "type", "veth", "peer", "name", "eth0", "netns", self.ns[k])
                self.made.append(("link", self.veth[k]))
                sh("ip", "link", "set", self.veth[k], "master", self.bridge, "up")
                sh("ip", "-n", self.ns[k], "addr", "add", "%s.%d/24" % (self.net, 10 + i), "dev", "eth0")
                sh("ip", "-n", self.ns[k], "link", "set", "eth0", "up")
                sh("ip", "-n", self.ns[k], "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise
        return self

    def exec_in(self, key):
        """The command prefix that runs a program in key's namespace."""
        return ["ip", "netns", "exec", self.ns[key]]

    def remove(self):
        for kind, name in reversed(self.made):
            if kind == "netns":
                subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)
            else:
                subprocess.run(["ip", "link", "del", name], stderr=subprocess.DEVNULL)
        self.made = []

    def __enter__(self):
        return self.create()

    def __exit__(self, *exc):
        self.remove()
        return False


# ---- the Python package's tests ------------------------------------------------------------

def package_test_args(programs=("mpirun",), modules=("cloudpickle",)):
    """The options of tests/python's scripts (--pythonpath DIR, --sanitize S, case names),
    parsed; skips (77) under a sanitizer build (the extensions cannot load a sanitized runtime),
    without one of the programs, or without one of the modules in this Python. Puts the staged
    package first on sys.path and PYTHONPATH (the jobs' processes inherit it), clears
    CLEARED_VARS and lets Open MPI run as root."""
    ap = arg_parser()
    ap.add_argument("--pythonpath", default="", type=lambda p: os.path.abspath(p) if p else p)
    ap.add_argument("--sanitize", default="")
    ap.add_argument("cases", nargs="*")
    args = ap.parse_args()
    if args.sanitize:
        skip("a sanitizer build: the extensions cannot load a sanitized runtime")
    for prog in programs:
        if not shutil.which(prog):
            skip("no %s" % prog)
    for mod in modules:
        try:
            __import__(mod)
        except ImportError as e:
            skip("%s in %s (scripts/install-python.sh makes the test Python)" % (e,
                 sys.executable))
    if args.pythonpath:
        sys.path.insert(0, args.pythonpath)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (args.pythonpath, os.environ.get("PYTHONPATH")) if p)
    for k in CLEARED_VARS:
        os.environ.pop(k, None)
    os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return args


# ---- MPI implementations -------------------------------------------------------------------

# The MPIs whose launchers hvd-bridge drives (docs/launcher.md), by hvd-driver's --mpi names:
# openmpi4 is the system's (Debian's Open MPI 4.1, mpirun in PATH); openmpi5 and mpich are the
# PyPI wheels that scripts/install-mpi-wheels.sh puts in virtual environments.
MPIS = ("openmpi4", "openmpi5", "mpich")


def mpi_install(name, repo):
    """The installation prefix of MPI `name` (None for openmpi4: the system's, from PATH),
    installing its wheel if needed (scripts/install-mpi-wheels.sh: quick when present). Skip
    with the script's reason when it cannot be installed here (no network, no wheel)."""
    if name == "openmpi4":
        if not shutil.which("mpirun"):
            raise Skip("no mpirun in PATH (Debian: openmpi-bin)")
        return None
    r = subprocess.run(["bash", os.path.join(repo, "scripts", "install-mpi-wheels.sh"), name],
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    if r.returncode != 0 or not r.stdout.split():
        why = (r.stderr.strip().splitlines() or ["exit status %d" % r.returncode])[-1]
        raise Skip("the %s wheel cannot be installed here: %s" % (name, why))
    return r.stdout.split()[-1]


def runtime_build(name, prefix, repo, build_root):
    """The allreduce example (entry point .so, program) built against the MPI at prefix: a
    second, runtime-only build in <build_root>/mpi/<name> (cmake -DHVD_MPI=prefix
    -DHVD_RUNTIME_ONLY=ON), configured once and brought up to date on every call (a lock
    serializes the cases ctest runs side by side). Returns (lib, prog); Failure with the
    build's last lines if it fails."""
    d = os.path.join(build_root, "mpi", name)
    os.makedirs(os.path.dirname(d), exist_ok=True)
    lib = os.path.join(d, "examples", "allreduce", "libhvd_example_allreduce.so")
    prog = os.path.join(d, "examples", "allreduce", "hvd-example-allreduce")
    with open(d + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        steps = []
        if not os.path.exists(os.path.join(d, "CMakeCache.txt")):
            steps.append(["cmake", "-S", repo, "-B", d, "-DHVD_MPI=" + prefix, "-DHVD_RUNTIME_ONLY=ON",
                          "-DHVD_NCCL=OFF", "-DHVD_WERROR=ON", "-DCMAKE_BUILD_TYPE=RelWithDebInfo"])
        steps.append(["cmake", "--build", d, "-j2", "--target", "hvd_example_allreduce",
                      "hvd-example-allreduce"])
        for cmd in steps:
            r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
            check(r.returncode == 0, "building the runtime against %s failed: %s\n%s"
                  % (prefix, " ".join(cmd), "\n".join(r.stdout.splitlines()[-15:])))
    return lib, prog
