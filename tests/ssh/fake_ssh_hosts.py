"""Several "ssh hosts" on this one machine, for tests and benchmarks: one real OpenSSH sshd per
loopback address (127.0.0.2, 127.0.0.3, ...; not interface addresses, so mpirun treats them as
remote), all on the same port, each with its own generated host keys (scripts/sshd-test-env.sh).

    hosts = FakeSshHosts(script, workdir, mark="abc")
    hosts.start()            # raises SshdUnavailable if sshd cannot run here (tests exit 77)
    hosts.port, hosts.addrs, hosts.key, hosts.other_key, hosts.known_hosts
    hosts.stop()

Every host accepts the same user key (hosts.key; hosts.other_key is accepted by none). Each
sshd gives its sessions, through SetEnv:
  - TMPDIR=<its own dir>/tmp and OMPI_MCA_btl_vader_backing_directory=<same>: the orteds of
    different fake hosts must not share Open MPI's session and shared-memory files;
  - HVD_FAKE_HOST=<address>, so that a rank can tell which fake host it runs on;
  - HVD_E2E_MARK=<mark> (when given), so that a test finds every process of a job in /proc;
    the sshd listeners run with the mark too (their own pids are in hosts.pids), so that
    session processes left open are found as well;
  - OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1 (CI runs as root).
"""
import ctypes
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import hvdtest  # noqa: E402


class SshdUnavailable(Exception):
    pass


def _die_with_parent():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class FakeSshHosts:
    def __init__(self, script, workdir, addrs=("127.0.0.2", "127.0.0.3"), mark=None):
        self.script = script
        self.workdir = workdir
        self.addrs = list(addrs)
        self.mark = mark
        self.port = None
        self.dirs = []
        self.procs = []
        self.pids = []
        self.key = None
        self.other_key = None
        self.known_hosts = os.path.join(workdir, "known_hosts")

    def start(self):
        self.port = hvdtest.free_port(self.addrs)
        if self.port is None:
            raise SshdUnavailable("no port free on all of %s" % (self.addrs,))
        for i, addr in enumerate(self.addrs):
            d = os.path.join(self.workdir, "host%d" % i)
            os.makedirs(os.path.join(d, "tmp"), mode=0o700)
            p = subprocess.run(["bash", self.script, "setup", d, addr, str(self.port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if p.returncode == 77:
                raise SshdUnavailable(p.stdout.decode(errors="replace").strip())
            if p.returncode != 0:
                raise SshdUnavailable("sshd-test-env.sh setup failed: " + p.stdout.decode(errors="replace"))
            self.dirs.append(d)
        self.key = os.path.join(self.dirs[0], "id_ed25519")
        self.other_key = os.path.join(self.dirs[0], "id_other")
        with open(self.key + ".pub") as f:
            user_pub = f.read()
        for i, d in enumerate(self.dirs):
            with open(os.path.join(d, "authorized_keys"), "w") as f:
                f.write(user_pub)
            tmp = os.path.join(d, "tmp")
            env = ["TMPDIR=" + tmp, "OMPI_MCA_btl_vader_backing_directory=" + tmp,
                   "HVD_FAKE_HOST=" + self.addrs[i], "OMPI_ALLOW_RUN_AS_ROOT=1",
                   "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"]
            if self.mark:
                env.append(hvdtest.MARK_VAR + "=" + self.mark)
            with open(os.path.join(d, "sshd_config"), "a") as f:
                f.write("SetEnv %s\n" % " ".join(env))
        self.write_known_hosts(self.known_hosts)
        for i, d in enumerate(self.dirs):
            env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
            if self.mark:
                env[hvdtest.MARK_VAR] = self.mark
            log = open(os.path.join(d, "sshd.log"), "wb")
            proc = subprocess.Popen(["bash", self.script, "exec", d], env=env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=log, preexec_fn=_die_with_parent)
            log.close()
            self.procs.append(proc)
            self.pids.append(proc.pid)  # bash execs sshd: same pid
        deadline = time.time() + 10
        for i, addr in enumerate(self.addrs):
            while not hvdtest.port_open(addr, self.port):
                if self.procs[i].poll() is not None or time.time() > deadline:
                    with open(os.path.join(self.dirs[i], "sshd.log"), errors="replace") as f:
                        log = f.read()
                    self.stop()
                    raise SshdUnavailable("sshd on %s:%d did not start: %s" % (addr, self.port, log[-2000:]))
                time.sleep(0.05)
        return self

    def host_key_lines(self, i, host=None):
        """known_hosts lines for host i (under the name `host`, default its address)."""
        name = "[%s]:%d" % (host or self.addrs[i], self.port)
        lines = []
        for t in ("ed25519", "ecdsa"):
            with open(os.path.join(self.dirs[i], "ssh_host_%s_key.pub" % t)) as f:
                kt, blob = f.read().split()[:2]
            lines.append("%s %s %s\n" % (name, kt, blob))
        return lines

    def write_known_hosts(self, path, hosts=None):
        with open(path, "w") as f:
            for i in (range(len(self.addrs)) if hosts is None else hosts):
                f.writelines(self.host_key_lines(i))

    def ssh_config(self, path):
        """An OpenSSH client config that reaches the fake hosts without questions."""
        with open(path, "w") as f:
            f.write("Host %s\n" % " ".join(self.addrs))
            f.write("  Port %d\n  User %s\n  IdentityFile %s\n  IdentitiesOnly yes\n"
                    "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
                    "  GlobalKnownHostsFile /dev/null\n  BatchMode yes\n  LogLevel ERROR\n"
                    % (self.port, _user(), self.key))

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            hvdtest.stop(p, 5)
        self.procs = []


def _user():
    import pwd
    return pwd.getpwuid(os.geteuid()).pw_name
