#!/usr/bin/env python3
"""Jobs on plain ssh hosts, against real OpenSSH sshds (no mocks).

    test_ssh_hosts.py --bin DIR --sshd-script S --probe-lib LIB --mpi-prog PROG CASE...

Two fake hosts, 127.0.0.2 and 127.0.0.3 (not interface addresses: mpirun treats them as
remote), each with its own sshd and host keys (fake_ssh_hosts.py). Cases:

  rsh_mpirun            mpirun -mca plm_rsh_agent "hvd-rsh ..." in ssh mode (no driver):
                        an MPI_Allreduce across both hosts, output checked
  rsh_unknown_host_key  host not in known_hosts: refused, mpirun fails fast with the reason
  rsh_changed_host_key  known_hosts holds another key for the host: refused likewise
  rsh_wrong_user_key    a key the server does not accept: refused likewise
  rsh_unreachable_port  nothing listens there: refused at once
  driver_ssh_hosts      hvd-driver run --ssh-hosts 127.0.0.2:2,127.0.0.3:2 with the shared
                        object entry point: results in rank order, each rank in the right task
  driver_env_cwd        the ranks run in the driver's directory with its environment (a
                        relative program path, a variable of the driver's), as horovodrun's
  driver_failing_rank   the same with rank 1 failing: exit 3, rank 1 named
  driver_interrupt      SIGINT to hvd-driver while the ranks run
  driver_killed         SIGKILL to hvd-driver while the ranks run
  driver_sweep          a stray process of the job: the final sweep kills it
  driver_ssh_refused    a wrong user key: hvd-driver fails fast, naming the host
  driver_unresponsive_host  a host that accepts TCP and never answers: --start-timeout holds
  driver_interrupt_starting SIGINT while that host keeps the job from starting
  driver_bad_bin_dir    --ssh-bin-dir where hvd-task is not: fails fast, with a hint
  driver_elastic_discovery  an elastic job with --host-discovery-script and --ssh (horovodrun's
                        way): task services started over ssh on the hosts the script names; a
                        host it adds joins; that host's task services SIGKILLed, the job goes
                        on without it, and the driver starts them again since the script still
                        names the host (needs --train-lib)

After every case nothing of the job may be left: no process whose environment holds the
case's HVD_E2E_MARK (the test's own processes get it from their environment, the remote ones
from sshd's SetEnv), no sshd session process (a session left open), and no job directory in
the hosts' TMPDIRs. Prints "N passed, M failed" last; exits 77 if sshd cannot run here.
"""
import json
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
from fake_ssh_hosts import FakeSshHosts, SshdUnavailable  # noqa: E402
from hvdtest import Failure, Skip, check  # noqa: E402

ARGS = None


def assert_nothing_left(mark, hosts, wait_s=15):
    """Nothing of the job may be left: no process with its mark, no sshd session process
    (one below a listener: a session left open), no job directory in the hosts' TMPDIRs."""
    deadline = time.time() + wait_s
    hvdtest.assert_no_leftovers(mark, wait_s, also=lambda: hvdtest.descendants(hosts.pids))
    tmps = [os.path.join(d, "tmp") for d in hosts.dirs]
    dirs = hvdtest.wait_gone(lambda: hvdtest.entries_left(tmps, "hvd-ssh."), deadline - time.time())
    check(not dirs, "job directories left on the hosts: %s" % dirs)


SANITIZER = re.compile(r"ERROR: (Address|Leak|Thread|Memory)Sanitizer|runtime error: |WARNING: ThreadSanitizer")


def no_sanitizer_reports(text):
    """Sanitizer builds: a report anywhere in the output (remote tasks' included) fails."""
    m = SANITIZER.search(text)
    check(not m, "sanitizer report:\n" + text[max(0, m.start() - 200):m.start() + 3000] if m else "")


def run(cmd, env, timeout=120, cwd=None):
    """hvdtest.run(), and no sanitizer report in the output."""
    rc, so, se, dt = hvdtest.run(cmd, env, timeout, cwd)
    no_sanitizer_reports(so + se)
    return rc, so, se, dt


class Case:
    """One case: a mark, a temp dir and two fake ssh hosts."""

    def __enter__(self):
        self.mark = uuid.uuid4().hex
        self.tmp = tempfile.mkdtemp(prefix="hvd-ssh-test.")
        self.hosts = FakeSshHosts(ARGS.sshd_script, self.tmp, mark=self.mark)
        try:
            self.hosts.start()
        except SshdUnavailable as e:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise Skip(str(e))
        self.env = hvdtest.marked_env(self.mark, ARGS.bin)
        return self

    def __exit__(self, *exc):
        try:
            assert_nothing_left(self.mark, self.hosts, wait_s=15 if exc[0] is None else 5)
        except Failure:
            if exc[0] is None:
                raise  # else the case's own failure is the one to report
        finally:
            self.hosts.stop()
            shutil.rmtree(self.tmp, ignore_errors=True)
        return False

    def agent(self, known_hosts=None, key=None, port=None):
        return "%s -p %d -i %s -o UserKnownHostsFile=%s -o ConnectTimeout=10" % (
            os.path.join(ARGS.bin, "hvd-rsh"), port or self.hosts.port, key or self.hosts.key,
            known_hosts or self.hosts.known_hosts)

    def mpirun(self, hosts, np_, agent, prog, timeout=90):
        cmd = ["mpirun", "--tag-output", "-np", str(np_), "-H", hosts, "-mca", "plm_rsh_agent", agent,
               "-mca", "oob_tcp_if_include", "lo", "-mca", "btl_tcp_if_include", "lo",
               "-mca", "pml", "ob1", "-mca", "btl", "self,vader,tcp", "--stdin", "none"] + prog
        return run(cmd, self.env, timeout=timeout, cwd=self.tmp)

    def driver(self, *args, key=None, extra=()):
        return [os.path.join(ARGS.bin, "hvd-driver"), "run", "-np", "4", "--ssh-hosts", "127.0.0.2:2,127.0.0.3:2",
                "--ssh-port", str(self.hosts.port), "--ssh-identity", key or self.hosts.key,
                "--ssh-known-hosts", self.hosts.known_hosts, "--ssh-fake-hosts",
                "--start-timeout", "60"] + list(extra) + list(args)


# ---- hvd-rsh in ssh mode under mpirun ----------------------------------------------------

def test_rsh_mpirun():
    with Case() as c:
        rc, so, se, dt = c.mpirun("127.0.0.2:2,127.0.0.3:2", 4, c.agent(), [ARGS.mpi_prog])
        check(rc == 0, "mpirun exited %d:\n%s\n%s" % (rc, so, se))
        lines = sorted(l for l in so.splitlines() if "<stdout>:rank" in l)
        check(len(lines) == 4, "4 ranks answered:\n" + so)
        for r, l in enumerate(lines):
            m = re.match(r"\[\d+,(\d+)\]<stdout>:rank (\d+) size 4 sum 10 host (\S+)$", l)
            check(m and int(m.group(1)) == r and int(m.group(2)) == r, "rank %d's line: %r" % (r, l))
            want = "127.0.0.2" if r < 2 else "127.0.0.3"
            check(m.group(3) == want, "rank %d ran on %s, not %s" % (r, m.group(3), want))


def refused(c, agent, expect, hosts="127.0.0.2:1", np_=1):
    rc, so, se, dt = c.mpirun(hosts, np_, agent, ["/bin/true"], timeout=60)
    out = so + se
    check(rc != 0, "mpirun must fail, exited 0:\n" + out)
    check(dt < 20, "mpirun took %.1f s to fail" % dt)
    line = [l for l in out.splitlines() if l.startswith("hvd-rsh: ")]
    check(line and re.search(expect, line[0]), "the agent says why (%s):\n%s" % (expect, out))
    return line[0]


def test_rsh_unknown_host_key():
    with Case() as c:
        kh = os.path.join(c.tmp, "kh_other")
        c.hosts.write_known_hosts(kh, hosts=[1])  # only 127.0.0.3 is known
        refused(c, c.agent(known_hosts=kh), r"127\.0\.0\.2.*host key verification: no host key is known")


def test_rsh_changed_host_key():
    with Case() as c:
        kh = os.path.join(c.tmp, "kh_changed")
        with open(kh, "w") as f:  # 127.0.0.2 listed with the keys of 127.0.0.3
            f.writelines(c.hosts.host_key_lines(1, host="127.0.0.2"))
        refused(c, c.agent(known_hosts=kh), r"127\.0\.0\.2.*host key for \S+ has changed")


def test_rsh_wrong_user_key():
    with Case() as c:
        refused(c, c.agent(key=c.hosts.other_key), r"authentication: permission denied \(publickey\)")


def test_rsh_unreachable_port():
    with Case() as c:
        closed = hvdtest.free_port(("127.0.0.2",))
        refused(c, c.agent(port=closed), r"connect: .*Connection refused", hosts="127.0.0.2:1,127.0.0.3:1",
                np_=2)


# ---- hvd-driver --ssh-hosts --------------------------------------------------------------

def test_driver_ssh_hosts():
    with Case() as c:
        out = os.path.join(c.tmp, "results.json")
        rc, so, se, dt = run(c.driver("--results-json", out, "--entry", ARGS.probe_lib + ":probe_entry"),
                             c.env, cwd=c.tmp)
        check(rc == 0, "hvd-driver exited %d:\n%s\n%s" % (rc, so, se))
        with open(out) as f:
            ranks = json.load(f)["ranks"]
        check([r["rank"] for r in ranks] == [0, 1, 2, 3], "results in rank order: %s" % ranks)
        for r in ranks:
            check(r["reported"] and r["status"] == 0, "rank %d succeeded: %s" % (r["rank"], r))
            info = hvdtest.parse_kv(r["result_text"])
            check(int(info["rank"]) == r["rank"] and info["size"] == "4", "rank %d's result: %s" % (r["rank"], info))
            check(int(info["task"]) == r["rank"], "rank %d stands for task %s" % (r["rank"], info["task"]))
            first = (r["rank"] // 2) * 2
            check(int(info["ancestor_task"]) == first,
                  "rank %d runs inside task %d's service, found in %s's" % (r["rank"], first, info["ancestor_task"]))
            want = "hvdssh000-127-0-0-2" if r["rank"] < 2 else "hvdssh001-127-0-0-3"
            check(info["host"] == want and r["host_hash"] == want, "rank %d on host %s" % (r["rank"], info["host"]))


RANK_CMDLINE = """import os, sys
with open(os.path.join(sys.argv[1], "rank" + os.environ["OMPI_COMM_WORLD_RANK"]), "w") as f:
    f.write(open("/proc/self/cmdline").read().replace("\\0", " "))
"""


def test_driver_warm_python():
    """HVD_WARM_PYTHON and HVD_WARM_IMPORTS in the driver's environment reach the task services
    that ssh starts (whose sessions inherit nothing of it): each keeps a warm interpreter, and
    the Python ranks are forked from it (a forked rank's command line is the interpreter's,
    `PY -m hvd_bridge._warm`; a cold one's is its own)."""
    with Case() as c:
        venv = os.path.join(c.tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
        py = os.path.join(venv, "bin", "python")
        site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        with open(os.path.join(site, "hvd-build.pth"), "w") as f:  # the build's package, found
            f.write(os.path.join(os.path.dirname(ARGS.bin), "python") + "\n")  # without PYTHONPATH
        if subprocess.run([py, "-c", "import hvd_bridge._warm"], capture_output=True).returncode != 0:
            raise Skip("hvd_bridge._warm does not import with %s" % py)
        prog = os.path.join(c.tmp, "rank.py")
        with open(prog, "w") as f:
            f.write(RANK_CMDLINE)
        env = dict(c.env, HVD_WARM_PYTHON=py, HVD_WARM_IMPORTS="json")
        rc, so, se, dt = run(c.driver("--", py, prog, c.tmp), env, cwd=c.tmp)
        check(rc == 0, "hvd-driver exited %d:\n%s\n%s" % (rc, so, se))
        check("warm interpreter" not in se, "no warning about the warm interpreter:\n" + se)
        for r in range(4):
            with open(os.path.join(c.tmp, "rank%d" % r)) as f:
                cmdline = f.read()
            check("-m hvd_bridge._warm" in cmdline and "--imports json" in cmdline,
                  "rank %d was forked from the warm interpreter; its command line: %r" % (r, cmdline))


RANK_WHERE = """import json, os
with open("where" + os.environ["OMPI_COMM_WORLD_RANK"], "w") as f:  # relative: in its cwd
    json.dump({"cwd": os.getcwd(), "var": os.environ.get("E2E_FORWARDED"),
               "tmpdir": os.environ.get("TMPDIR")}, f)
"""


def test_driver_env_cwd():
    """As horovodrun's (and mpirun's) remote ranks: the ranks on the ssh hosts run in the
    driver's directory (it exists on these hosts), so a relative program path works, and get
    the driver's environment (E2E_FORWARDED), but their own host's TMPDIR. Before, they ran
    in the task's directory under TMPDIR with the ssh login's environment."""
    with Case() as c:
        with open(os.path.join(c.tmp, "where.py"), "w") as f:
            f.write(RANK_WHERE)
        env = dict(c.env, E2E_FORWARDED="from the driver")
        rc, so, se, dt = run(c.driver("--", sys.executable, "where.py"), env, cwd=c.tmp)
        check(rc == 0, "hvd-driver exited %d:\n%s\n%s" % (rc, so, se))
        for r in range(4):
            with open(os.path.join(c.tmp, "where%d" % r)) as f:
                w = json.load(f)
            check(os.path.realpath(w["cwd"]) == os.path.realpath(c.tmp) and
                  w["var"] == "from the driver" and w["tmpdir"] != env.get("TMPDIR") and
                  "/hvd-ssh." in (w["tmpdir"] or ""),
                  "rank %d: cwd, the driver's variable, the host's TMPDIR: %s" % (r, w))


def test_driver_failing_rank():
    with Case() as c:
        rc, so, se, dt = run(c.driver("--entry", ARGS.probe_lib + ":probe_entry", "--entry-arg", "fail=1"),
                             c.env, cwd=c.tmp)
        check(rc == 3, "exit status 3 (the failed rank's), got %d:\n%s" % (rc, se))
        check("rank 1 failed on purpose" in se, "the rank's error text reaches the user:\n" + se)
        check(re.search(r"job failed: rank 1 \(task 1", se), "the failed rank is named:\n" + se)


def job_commands(c):
    """The command lines of the case's job's processes."""
    return [p.cmdline for p in hvdtest.processes_with(c.mark).values()]


def start_sleeping_job(c):
    """hvd-driver running `sleep 300` on 4 ranks; returns the Popen once all 4 sleep."""
    p = subprocess.Popen(c.driver("--", "sleep", "300"), env=c.env, cwd=c.tmp, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    sleeping = []
    while len(sleeping) < 4 and time.time() < deadline and p.poll() is None:
        sleeping = [cmd for cmd in job_commands(c) if cmd.startswith("sleep 300")]
        time.sleep(0.1)
    if len(sleeping) < 4:
        p.kill()
        so, se = p.communicate()
        raise Failure("4 ranks run `sleep 300`: %s\n%s" % (sleeping, se.decode(errors="replace")))
    return p


def check_secret_hidden(mark):
    """The job secret is in the remote tasks' environment, and on no command line."""
    secret = None
    for p in hvdtest.processes_with(mark).values():
        if "HVD_SSH_JOB" in p.env and "HVD_SECRET" in p.env:
            secret = p.env["HVD_SECRET"].encode()
    check(secret and len(secret) == 44, "the remote tasks have the secret in their environment")
    for pid in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                check(secret not in f.read(), "the secret is on the command line of pid %s" % pid)
        except OSError:
            pass


def test_driver_interrupt():
    with Case() as c:
        p = start_sleeping_job(c)
        try:
            check_secret_hidden(c.mark)
            t0 = time.time()
            p.send_signal(signal.SIGINT)
            so, se = p.communicate(timeout=60)
            dt = time.time() - t0
        finally:
            hvdtest.stop(p, 0)
        no_sanitizer_reports((so + se).decode(errors="replace"))
        check(p.returncode != 0, "hvd-driver exits non-zero after SIGINT")
        check(dt < 30, "hvd-driver took %.1f s to stop after SIGINT" % dt)


def test_driver_killed():
    """SIGKILL to hvd-driver: no sweep can run; the tasks see the driver go and end the job."""
    with Case() as c:
        p = start_sleeping_job(c)
        p.kill()
        p.communicate(timeout=30)
        assert_nothing_left(c.mark, c.hosts, wait_s=30)


def test_driver_sweep():
    """A process of the job that outlived its task (here: one we start with the job's mark
    HVD_SSH_JOB, as a daemon a rank started could): the final sweep kills it, and says so."""
    with Case() as c:
        p = subprocess.Popen(c.driver("--", "sleep", "4"), env=c.env, cwd=c.tmp, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stray = None
        try:
            token = None
            deadline = time.time() + 30
            while not token and time.time() < deadline and p.poll() is None:
                for l in job_commands(c):
                    m = re.search(r"HVD_SSH_JOB=([0-9a-f]{16})", l)
                    if m:
                        token = m.group(1)
                time.sleep(0.05)
            check(token, "the remote command line carries the job's mark")
            stray = subprocess.Popen(["sleep", "600"], env=dict(c.env, HVD_SSH_JOB=token),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
            so, se = p.communicate(timeout=90)
            se = se.decode(errors="replace")
        finally:
            hvdtest.stop(p, 0)
            if stray and not hvdtest.stop(stray, 10):
                raise Failure("the sweep left the stray process running")
        no_sanitizer_reports(se)
        check(p.returncode == 0, "hvd-driver exited %d:\n%s" % (p.returncode, se))
        check(stray.returncode == -signal.SIGKILL, "the stray process was SIGKILLed: %s" % stray.returncode)
        check(re.search(r"warning: killed \d leftover process(es)? of the job on 127\.0\.0\.[23]", se),
              "the sweep says what it did:\n" + se)


def silent_listener(c):
    """127.0.0.4 at the hosts' port: accepts TCP connections and never says a word."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.4", c.hosts.port))
    s.listen(16)
    return s


def driver_with_silent_host(c):
    """hvd-driver running `true` on 127.0.0.2 and on 127.0.0.4 (silent_listener)."""
    cmd = c.driver("--", "true")
    cmd[cmd.index("--ssh-hosts") + 1] = "127.0.0.2:2,127.0.0.4:2"
    return cmd


def test_driver_unresponsive_host():
    with Case() as c:
        s = silent_listener(c)
        try:
            cmd = driver_with_silent_host(c)
            cmd[cmd.index("--start-timeout") + 1] = "3"
            rc, so, se, dt = run(cmd, c.env, cwd=c.tmp, timeout=60)
        finally:
            s.close()
        check(rc != 0, "hvd-driver must fail")
        check(dt < 15, "hvd-driver took %.1f s to fail" % dt)
        # One line names the host and says what went wrong, whichever fired first: the ssh
        # session's own timeout (its key exchange) or the driver's (tasks 2-3 missing).
        named = [l for l in se.splitlines() if "127.0.0.4" in l and
                 re.search(r"key exchange|missing task\(s\) 2-3", l)]
        check(named, "the host is named:\n" + se)


def test_driver_interrupt_starting():
    with Case() as c:
        s = silent_listener(c)
        try:
            p = subprocess.Popen(driver_with_silent_host(c), env=c.env, cwd=c.tmp, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            deadline = time.time() + 30
            tasks = []
            while len(tasks) < 2 and time.time() < deadline and p.poll() is None:
                tasks = [l for l in job_commands(c) if "hvd-task --driver" in l]
                time.sleep(0.1)
            check(len(tasks) == 2, "the tasks of 127.0.0.2 run: %s" % tasks)
            t0 = time.time()
            p.send_signal(signal.SIGINT)
            so, se = p.communicate(timeout=60)
            dt = time.time() - t0
        finally:
            s.close()
            hvdtest.stop(p, 0)
        se = se.decode(errors="replace")
        no_sanitizer_reports(se)
        check(p.returncode != 0, "hvd-driver exits non-zero after SIGINT")
        check(dt < 15, "hvd-driver took %.1f s to stop after SIGINT" % dt)
        check("interrupted by SIGINT" in se, "says why:\n" + se)


def test_driver_ssh_refused():
    with Case() as c:
        rc, so, se, dt = run(c.driver("--", "true", key=c.hosts.other_key), c.env, cwd=c.tmp, timeout=60)
        check(rc != 0, "hvd-driver must fail")
        check(dt < 20, "hvd-driver took %.1f s to fail" % dt)
        check(re.search(r"ssh host 127\.0\.0\.[23] .*permission denied \(publickey\)", se),
              "the reason names the host:\n" + se)


def test_driver_bad_bin_dir():
    with Case() as c:
        rc, so, se, dt = run(c.driver("--", "true", extra=("--ssh-bin-dir", "/nonexistent/bin")), c.env,
                             cwd=c.tmp, timeout=60)
        check(rc != 0, "hvd-driver must fail")
        check(dt < 20, "hvd-driver took %.1f s to fail" % dt)
        check("/nonexistent/bin/hvd-task" in se and "--ssh-bin-dir" in se, "the reason helps:\n" + se)


def train_log(path):
    """(size, commit) of every launch's "start" line and the commits, from the elastic SGD
    example's log (rank 0 appends them)."""
    starts, commits = [], []
    try:
        with open(path) as f:
            for words in (l.split() for l in f if l.strip()):
                if words[1] == "start":
                    kv = dict(w.split("=") for w in words[2:])
                    starts.append(int(kv["size"]))
                elif words[1] == "commit":
                    commits.append(int(words[2][3:]))
    except OSError:
        pass
    return starts, commits


def test_driver_elastic_discovery():
    if not ARGS.train_lib:
        raise Skip("no --train-lib (examples/train_sgd not built)")
    with Case() as c:
        hosts = os.path.join(c.tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.2:2\n")
        log = os.path.join(c.tmp, "train.log")
        rank_tsan = hvdtest.mpi_under_tsan(dict(c.env))
        cmd = c.driver("--min-np", "2", "--max-np", "4", "--host-discovery-script", "cat " + hosts,
                       "--ssh", "--entry", ARGS.train_lib + ":hvd_example_train_sgd_elastic",
                       "--entry-arg", "epochs=20,commit=4,sleep=40,log=" + log,
                       # The ranks run under task services that ssh started, with none of this
                       # environment: under ASan they leave leak checking to the runtime's own
                       # tests (a rank that resets exits without MPI_Finalize, and Open MPI's
                       # plugins' memory cannot be told apart: tests/elastic/test_elastic.py),
                       # under TSan they need Open MPI's suppressions (builds without either
                       # sanitizer ignore both).
                       "--mpi-arg", "-x", "--mpi-arg", "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1",
                       "--mpi-arg", "-x", "--mpi-arg", "TSAN_OPTIONS=" + rank_tsan["TSAN_OPTIONS"])
        del cmd[cmd.index("--ssh-hosts"):cmd.index("--ssh-hosts") + 2]
        cmd[cmd.index("-np") + 1] = "2"
        err = open(os.path.join(c.tmp, "driver.err"), "w+b")
        p = subprocess.Popen(cmd, env=c.env, cwd=c.tmp, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=err)

        def stderr():
            err.seek(0)
            return err.read().decode(errors="replace")

        def wait(pred, what):
            hvdtest.wait_for(lambda: pred() or p.poll() is not None, 120, what)
            check(pred(), "%s: hvd-driver exited %s:\n%s" % (what, p.returncode, stderr()[-4000:]))
        try:
            wait(lambda: len(train_log(log)[1]) >= 2, "2 ranks on 127.0.0.2 committing")
            with open(hosts + ".new", "w") as f:
                f.write("127.0.0.2:2\n127.0.0.3:2\n")
            os.rename(hosts + ".new", hosts)
            wait(lambda: train_log(log)[0][-1:] == [4], "the job growing to 127.0.0.3")
            found = [pid for pid, pr in hvdtest.processes_with(c.mark).items()
                     if os.path.basename(pr.argv[0]) == "hvd-task" and "127-0-0-3" in pr.argv]
            victims = [pid for pid in found if hvdtest.parent_of(pid) not in found]
            check(len(victims) == 2, "127.0.0.3's two task services: %s" % victims)
            hvdtest.kill(victims)
            wait(lambda: train_log(log)[0][2:4] == [2, 4],
                 "the job going on without 127.0.0.3, then growing to it again")
            so, _ = p.communicate(timeout=120)
            se = stderr()
            no_sanitizer_reports(se)
            check(p.returncode == 0, "hvd-driver exited %d:\n%s" % (p.returncode, se[-4000:]))
            resets = hvdtest.reset_lines(se)
            check(len(resets) >= 3 and "came: 127-0-0-3" in resets[0] and
                  "left: 127-0-0-3" in resets[1] and "came: 127-0-0-3" in resets[2],
                  "resets: 127.0.0.3 came, left, came again: %s" % resets)
        finally:
            hvdtest.stop(p, 10, signal.SIGTERM)
            err.close()


CASES = hvdtest.cases_in(globals())


def main():
    global ARGS
    ap = hvdtest.arg_parser("--bin", "--sshd-script", "--probe-lib", "--mpi-prog")
    ap.add_argument("--train-lib", type=os.path.abspath,
                    help="the elastic SGD example's library (driver_elastic_discovery)")
    ap.add_argument("cases", nargs="*")
    ARGS = ap.parse_args()
    if not shutil.which("mpirun"):
        hvdtest.skip("mpirun not found")
    return hvdtest.run_cases(CASES, ARGS.cases)


if __name__ == "__main__":
    sys.exit(main())
