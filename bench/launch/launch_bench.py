#!/usr/bin/env python3
"""launch_bench.py: what it costs to launch `mpirun -np 4 /bin/true` over H fake hosts.

For each MPI given (--mpi: openmpi4, the system's Open MPI 4.1; openmpi5 and mpich, the PyPI
wheels of scripts/install-mpi-wheels.sh), in that MPI's dialect (docs/launcher.md: the agent
option -mca plm_rsh_agent, --prtemca plm_ssh_agent or -launcher-exec), up to three agents,
alternating run by run, the same host names and launcher arguments:

  hvd-rsh   through task services: per run a fresh `hvd-driver serve -np H --env-file F --
            /bin/true` and H `hvd-task`s (one host hash and one TMPDIR each), not timed; only
            mpirun (-mca plm_rsh_agent $HVD_RSH $HVD_MPIRUN_ARGS ...) is timed.
  pass      a minimal pass-through agent (C, built here with cc): skips ssh options and the
            host, sets TMPDIR per host and, as a task service does for its command, puts
            Open MPI's session directory and shared-memory segments in a directory of
            /dev/shm per host (OMPI_MCA_orte_tmpdir_base, OMPI_MCA_btl_vader_backing_directory),
            and runs /bin/sh -c "<words joined>" in a session of its own (as sshd and a task
            service do), waiting for it. Both matter on a shared machine: with the session
            directory on disk the floor was 1.2-1.3x slower, and with the kernel's autogroup
            scheduling (a session is a CPU group) orteds left in mpirun's session got 2x
            less CPU against other users' load than the hvd-rsh arm's, which run in task
            services' sessions (docs/performance.md, "Launch at scale").
  ssh       OpenSSH `ssh -F <cfg>` to a loopback sshd started here (scripts/sshd-test-env.sh);
            the config maps every fake host to 127.0.0.1, SetEnv gives each host its TMPDIR.
            Open MPI 4 only.

Every run also gets $HVD_MPIRUN_ARGS of that MPI (no name resolution, no stdin; Hydra:
-genvnone -localhost 127.0.0.1, and HYDRA_LAUNCHER_AUTOFORK=0 in the environment) and the
loopback interface (Open MPI 4: -mca btl_tcp_if_include lo -mca oob_tcp_if_include lo; Open
MPI 5: --mca btl_tcp_if_include lo, PRRTE's daemons cannot use loopback). Then
`hvd-driver run -np N --local N/2 -- /bin/true` end to end (Open MPI 4). Prints tables (median,
quartiles, min, max in ms; ratios of medians and minimums) and writes JSON with every sample
(--json). Results: docs/performance.md, section "Launch".

  python3 bench/launch/launch_bench.py [--bin build/bin] [--runs 7] [--hosts 2,4,8,16]
        [--mpi openmpi4,openmpi5,mpich] [--agents hvd-rsh,pass,ssh] [--agent-calls N]
        [--e2e 2,4,8,16,32] [--e2e-runs 5] [--json FILE] [--bin-ref OTHER_BIN]
--agent-calls N also times N single agent calls with no launcher (hvd-rsh against a fresh task,
the pass-through agent, hvd-rsh --help): what one call costs by itself. --bin-ref adds the arm
hvd-rsh-ref: the same agent from another build (A/B of a change).
Needs the MPIs (openmpi4: mpirun in PATH), cc, and for the ssh agent sshd/ssh/ssh-keygen
(skipped without).
"""
import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
import hvdtest  # noqa: E402

PASS_AGENT_C = r'''
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int i = 1;
    while (i < argc && argv[i][0] == '-') {          /* ssh-style options before the host */
        if (strchr("bcDEeFIiJLlmOoPpQRSWw", argv[i][1]) && argv[i][2] == '\0') i += 2; else i++;
    }
    if (i >= argc) { fprintf(stderr, "pass-agent: no host\n"); return 255; }
    const char *host = argv[i++];
    size_t len = 1;
    for (int j = i; j < argc; j++) len += strlen(argv[j]) + 1;
    char *cmd = calloc(len, 1);
    for (int j = i; j < argc; j++) { if (j > i) strcat(cmd, " "); strcat(cmd, argv[j]); }
    const char *base = getenv("PASS_AGENT_TMPBASE");
    if (base) {                                       /* one TMPDIR per fake host */
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", base, host);
        mkdir(base, 0700);
        mkdir(dir, 0700);
        setenv("TMPDIR", dir, 1);
        setenv("OMPI_MCA_btl_vader_backing_directory", dir, 1);
    }
    const char *shm = getenv("PASS_AGENT_SHMBASE");
    if (shm) {               /* as a task service does: session dir and segments in /dev/shm */
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", shm, host);
        mkdir(dir, 0700);
        setenv("OMPI_MCA_btl_vader_backing_directory", dir, 1);
        setenv("OMPI_MCA_orte_tmpdir_base", dir, 1);
    }
    char *const av[] = {"sh", "-c", cmd, NULL};
    if (!getenv("PASS_AGENT_SAME_SESSION")) { /* a session of its own, as sshd and a task */
        pid_t pid = fork();     /* service give the command (mpirun made us a group leader, */
        if (pid == 0) {         /* so only a child can call setsid) */
            setsid();
            execv("/bin/sh", av);
            _exit(127);
        }
        int st;
        if (pid < 0 || waitpid(pid, &st, 0) != pid) return 255;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    execv("/bin/sh", av);
    perror("pass-agent: execv /bin/sh");
    return 255;
}
'''

AGENTS = ["hvd-rsh", "pass", "ssh"]


class Mpi:
    """One MPI implementation: its launcher and how its command line names things."""

    def __init__(self, name):
        self.name = name
        self.prefix = hvdtest.mpi_install(name, REPO)  # None: the system's (PATH)
        self.mpirun = os.path.join(self.prefix, "bin", "mpirun") if self.prefix else "mpirun"
        self.args = None  # $HVD_MPIRUN_ARGS, from the first serve
        self.env = {}     # what the env file exports for the launcher itself

    def command(self, agent_words, hosts, np_):
        if self.name == "openmpi4":
            return ["mpirun", "--allow-run-as-root", "-np", str(np_), "-H", hosts, "-mca", "plm_rsh_agent",
                    agent_words] + self.args.split() + \
                ["-mca", "btl_tcp_if_include", "lo", "-mca", "oob_tcp_if_include", "lo", "/bin/true"]
        if self.name == "openmpi5":
            return [self.mpirun, "--allow-run-as-root", "-np", str(np_), "-H", hosts, "--prtemca",
                    "plm_ssh_agent", agent_words] + self.args.split() + \
                ["--mca", "btl_tcp_if_include", "lo", "/bin/true"]
        return [self.mpirun, "-np", str(np_), "-hosts", hosts, "-launcher", "ssh", "-launcher-exec",
                agent_words] + self.args.split() + ["/bin/true"]

    def version(self):
        out = subprocess.run([self.mpirun, "--version"], stdout=subprocess.PIPE, text=True).stdout
        return " ".join(l.strip() for l in out.splitlines()[:2] if l.strip())


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def loadavg():
    return [round(x, 2) for x in os.getloadavg()]


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def timed(cmd, env, cwd, timeout):
    """Runs cmd in its own process group; returns (seconds, rc, output tail), rc 124 when it
    ran past timeout (its group is killed then)."""
    t0 = time.perf_counter()
    try:
        rc, out, _, dt = hvdtest.run(cmd, env, timeout, cwd, merge=True, new_session=True)
    except subprocess.TimeoutExpired as e:
        return time.perf_counter() - t0, 124, (e.stdout or b"").decode(errors="replace")[-2000:]
    return dt, rc, out[-2000:]


def hosts_arg(names, np_):
    """-H list: every host named, np_ slots spread over them (at least 1 each)."""
    h = len(names)
    slots = [np_ // h + (1 if k < np_ % h else 0) for k in range(h)]
    return ",".join("%s:%d" % (n, max(s, 1)) for n, s in zip(names, slots))


class Bench:
    def __init__(self, a):
        self.a = a
        self.bin = os.path.abspath(a.bin)
        self.work = tempfile.mkdtemp(prefix="hvd-launch-bench.")
        self.base_env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        for k in list(self.base_env):
            if k.startswith(("HVD_", "OMPI_MCA_")):
                del self.base_env[k]
        self.sshd = None
        self.ssh_cfg = None
        self.samples = {}        # (mpi, agent, H) -> [ms]
        self.failures = {}       # (mpi, agent, H) -> [text]
        self.orteds = {}         # (mpi, H) -> agent invocations seen (pass agent, counted once)

    # ---------- agents ----------
    def build_pass_agent(self):
        src = os.path.join(self.work, "pass-agent.c")
        with open(src, "w") as f:
            f.write(PASS_AGENT_C)
        self.pass_agent = os.path.join(self.work, "pass-agent")
        subprocess.run(["cc", "-O2", "-o", self.pass_agent, src], check=True)

    def start_sshd(self, names):
        script = os.path.join(REPO, "scripts", "sshd-test-env.sh")
        d = os.path.join(self.work, "sshd")
        os.mkdir(d)
        port = hvdtest.free_port()
        r = subprocess.run(["bash", script, "setup", d, "127.0.0.1", str(port)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            log("ssh agent skipped: sshd-test-env.sh setup: %s" % r.stdout.decode().strip())
            return False
        with open(os.path.join(d, "sshd_config"), "a") as f:
            f.write("AcceptEnv TMPDIR OMPI_MCA_btl_vader_backing_directory\n")
        self.sshd_log = open(os.path.join(d, "sshd.log"), "w")
        self.sshd = subprocess.Popen(["bash", script, "exec", d], stdin=subprocess.DEVNULL,
                                     stdout=self.sshd_log, stderr=subprocess.STDOUT)
        for _ in range(100):
            if hvdtest.port_open("127.0.0.1", port):
                break
            if self.sshd.poll() is not None:
                log("ssh agent skipped: sshd exited (%s)" % os.path.join(d, "sshd.log"))
                return False
            time.sleep(0.05)
        cfg = os.path.join(d, "ssh_config")
        with open(cfg, "w") as f:
            for n in names:  # first match wins in ssh_config: per-host blocks before Host *
                t = os.path.join(self.work, "ssh-tmp", n)
                os.makedirs(t, exist_ok=True)
                f.write("Host %s\n  SetEnv TMPDIR=%s OMPI_MCA_btl_vader_backing_directory=%s\n" % (n, t, t))
            f.write("Host *\n  HostName 127.0.0.1\n  Port %d\n  User %s\n  BatchMode yes\n"
                    "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
                    "  IdentityFile %s\n  IdentitiesOnly yes\n"
                    % (port, os.environ.get("USER") or "root", os.path.join(d, "id_ed25519")))
        self.ssh_cfg = cfg
        r = subprocess.run(["ssh", "-F", cfg, names[0], "echo $TMPDIR"], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20)
        log("ssh check: rc=%d %s" % (r.returncode, r.stdout.decode().strip()))
        return r.returncode == 0

    # ---------- hvd-rsh: serve + tasks ----------
    def serve(self, mpi, h, names, d, bin_dir=None):
        bin_dir = bin_dir or self.bin
        env_file = os.path.join(d, "job.env")
        srv = hvdtest.start_driver(bin_dir, ["serve", "-np", str(h), "--env-file", env_file, "--mpi", mpi.name,
                                             "--mpirun", mpi.mpirun, "--", "/bin/true"],
                                   self.base_env, d, stdout=subprocess.DEVNULL, start_new_session=True)
        tenv = dict(self.base_env, **hvdtest.task_hint(srv, "hvd-driver serve"))
        tasks = []
        for i, n in enumerate(names):
            t = os.path.join(d, "tmp", n)
            os.makedirs(t, exist_ok=True)
            tasks.append(hvdtest.start_task(bin_dir, i, dict(tenv, TMPDIR=t), n, cwd=d, start_new_session=True))
        hvdtest.wait_for(lambda: os.path.exists(env_file) or srv.poll() is not None, 60, interval=0.02)
        if not os.path.exists(env_file):
            raise RuntimeError("no env file from hvd-driver serve")
        time.sleep(self.a.settle)  # let the services go idle before mpirun is timed
        return srv, tasks, hvdtest.read_env_file(env_file)

    def stop_serve(self, srv, tasks):
        for p in [srv] + tasks:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGINT if p is srv else signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in [srv] + tasks:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_group(p)
                p.wait()
        srv.stderr.close()

    # ---------- one run ----------
    def mpirun(self, mpi, agent_words, hosts, extra_env, cwd):
        cmd = mpi.command(agent_words, hosts, self.a.np)
        return timed(cmd, dict(self.base_env, **mpi.env, **extra_env), cwd, self.a.timeout)

    def run_one(self, mpi, agent, h, names):
        d = tempfile.mkdtemp(dir=self.work, prefix="run.")
        hosts = hosts_arg(names, self.a.np)
        if agent in ("hvd-rsh", "hvd-rsh-ref"):
            srv, tasks, vals = self.serve(mpi, h, names, d, self.a.bin_ref if agent == "hvd-rsh-ref" else None)
            try:
                if mpi.args is None:
                    mpi.args = vals["HVD_MPIRUN_ARGS"]
                    mpi.env = {k: vals[k] for k in vals if not k.startswith("HVD_")}
                # serve's -H list gives each host one slot per task; ours spreads np over them
                assert set(x.split(":")[0] for x in vals["HVD_HOSTS"].split(",")) == set(names)
                dt, rc, out = self.mpirun(mpi, vals["HVD_RSH"], hosts,
                                          {"HVD_DRIVER_ADDRS": vals["HVD_DRIVER_ADDRS"],
                                           "HVD_SECRET_FILE": vals["HVD_SECRET_FILE"]}, d)
            finally:
                self.stop_serve(srv, tasks)
        elif agent == "pass":
            shm = tempfile.mkdtemp(dir="/dev/shm", prefix="hvd-launch-bench.")
            dt, rc, out = self.mpirun(mpi, self.pass_agent, hosts,
                                      {"PASS_AGENT_TMPBASE": os.path.join(d, "tmp"), "PASS_AGENT_SHMBASE": shm}, d)
            shutil.rmtree(shm, ignore_errors=True)
        else:
            dt, rc, out = self.mpirun(mpi, "ssh -F %s" % self.ssh_cfg, hosts, {}, d)
        shutil.rmtree(d, ignore_errors=True)
        key = (mpi.name, agent, h)
        if rc == 0:
            self.samples.setdefault(key, []).append(dt * 1000)
        else:
            self.failures.setdefault(key, []).append("rc=%d %s" % (rc, out.strip()[-300:]))
            log("FAIL %s %s H=%d rc=%d: %s" % (mpi.name, agent, h, rc, out.strip()[-300:]))

    def count_orteds(self, mpi, h, names):
        """How many agent calls (= remote daemons) the launcher makes for -np np over h hosts."""
        d = tempfile.mkdtemp(dir=self.work, prefix="count.")
        wrap = os.path.join(d, "count-agent.sh")
        with open(wrap, "w") as f:
            f.write("#!/bin/sh\necho x >> %s/calls\nexec %s \"$@\"\n" % (d, self.pass_agent))
        os.chmod(wrap, 0o755)
        dt, rc, out = self.mpirun(mpi, wrap, hosts_arg(names, self.a.np),
                                  {"PASS_AGENT_TMPBASE": os.path.join(d, "tmp")}, d)
        try:
            with open(os.path.join(d, "calls")) as f:
                n = len(f.readlines())
        except OSError:
            n = 0
        shutil.rmtree(d, ignore_errors=True)
        return n if rc == 0 else None

    # ---------- one agent call, no launcher ----------
    def agent_calls(self, runs):
        """What one agent call costs by itself: `AGENT fakehost00 /bin/true`, timed from the
        agent's start to its exit, alternating hvd-rsh (a fresh serve and task per call, not
        timed: a task service runs one command) and the pass-through agent; plus
        `hvd-rsh --help` (start-up and exit only). Returns {what: [ms]}."""
        res = {}
        for r in range(runs):
            for what in (["hvd-rsh", "pass", "hvd-rsh --help"] if r % 2 == 0 else
                         ["pass", "hvd-rsh --help", "hvd-rsh"]):
                d = tempfile.mkdtemp(dir=self.work, prefix="agent.")
                if what == "hvd-rsh":
                    srv, tasks, vals = self.serve(self.agent_mpi, 1, ["fakehost00"], d)
                    try:
                        dt, rc, out = timed([vals["HVD_RSH"], "fakehost00", "/bin/true"],
                                            dict(self.base_env, HVD_DRIVER_ADDRS=vals["HVD_DRIVER_ADDRS"],
                                                 HVD_SECRET_FILE=vals["HVD_SECRET_FILE"]), d, self.a.timeout)
                    finally:
                        self.stop_serve(srv, tasks)
                elif what == "pass":
                    dt, rc, out = timed([self.pass_agent, "fakehost00", "/bin/true"],
                                        dict(self.base_env, PASS_AGENT_TMPBASE=d), d, self.a.timeout)
                else:
                    dt, rc, out = timed([os.path.join(self.bin, "hvd-rsh"), "--help"], self.base_env, d,
                                        self.a.timeout)
                shutil.rmtree(d, ignore_errors=True)
                if rc == 0:
                    res.setdefault(what, []).append(dt * 1000)
                else:
                    log("FAIL agent call %s rc=%d: %s" % (what, rc, out.strip()[-300:]))
        return res

    # ---------- end to end ----------
    def e2e(self):
        res = {}
        for n in self.a.e2e:
            for r in range(self.a.e2e_runs):
                d = tempfile.mkdtemp(dir=self.work, prefix="e2e.")
                dt, rc, out = timed([os.path.join(self.bin, "hvd-driver"), "run", "-np", str(n),
                                     "--local", str(max(n // 2, 1)), "--", "/bin/true"],
                                    self.base_env, d, self.a.timeout * 4)
                shutil.rmtree(d, ignore_errors=True)
                if rc == 0:
                    res.setdefault(n, []).append(dt * 1000)
                else:
                    self.failures.setdefault(("e2e", n), []).append("rc=%d %s" % (rc, out.strip()[-300:]))
                    log("FAIL e2e N=%d rc=%d: %s" % (n, rc, out.strip()[-300:]))
        return res

    def main(self):
        info = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(),
                "kernel": platform.release(), "cpus": os.cpu_count(), "np": self.a.np,
                "runs": self.a.runs, "load_start": loadavg()}
        mpis = []
        for name in self.a.mpi:
            try:
                mpis.append(Mpi(name))
            except hvdtest.Skip as e:
                log("%s skipped: %s" % (name, e))
        info["mpis"] = {m.name: m.version() for m in mpis}
        try:
            info["ssh"] = subprocess.run(["ssh", "-V"], stderr=subprocess.PIPE, text=True).stderr.strip()
        except OSError:
            info["ssh"] = None
        try:
            info["git"] = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                                         stdout=subprocess.PIPE, text=True).stdout.strip()
        except OSError:
            pass
        info["cpu_model"] = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                                  if l.startswith("model name")), "?")
        maxh = max(self.a.hosts)
        all_names = ["fakehost%02d" % k for k in range(maxh)]
        self.build_pass_agent()
        agents = [a for a in self.a.agents if a in AGENTS] + (["hvd-rsh-ref"] if self.a.bin_ref else [])
        if "ssh" in agents and not (shutil.which("ssh") and self.start_sshd(all_names)):
            agents.remove("ssh")

        def agents_of(mpi):  # ssh: Open MPI 4 only (Hydra's -launcher-exec takes one path)
            return [a for a in agents if a != "ssh" or mpi.name == "openmpi4"]

        log("mpis: %s; agents: %s; load %s" % ([m.name for m in mpis], agents, info["load_start"]))
        # one untimed warm-up of each (page cache, first serve gives $HVD_MPIRUN_ARGS)
        for mpi in mpis:
            for h in self.a.hosts:
                names = all_names[:h]
                for ag in agents_of(mpi):
                    self.run_one(mpi, ag, h, names)
                self.orteds[(mpi.name, h)] = self.count_orteds(mpi, h, names)
        self.samples.clear()
        self.failures.clear()
        loads = []
        for r in range(self.a.runs):
            for mpi in mpis:
                ags = agents_of(mpi)
                for h in self.a.hosts:
                    names = all_names[:h]
                    order = ags[r % len(ags):] + ags[:r % len(ags)]
                    for ag in order:
                        self.run_one(mpi, ag, h, names)
            loads.append(loadavg())
            log("round %d done, load %s" % (r + 1, loads[-1]))
        info["load_during"] = loads
        e2e = self.e2e() if self.a.e2e else {}
        if self.a.agent_calls and mpis:
            self.agent_mpi = mpis[0]
            info["agent_calls"] = self.agent_calls(self.a.agent_calls)
        info["load_end"] = loadavg()
        self.report(info, mpis, agents_of, e2e)

    def report(self, info, mpis, agents_of, e2e):
        def stats(v):
            if not v:
                return (float("nan"),) * 5
            q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
            return statistics.median(v), q[0], q[2], min(v), max(v)

        print("# launch_bench %s on %s (%s, %d CPUs); %s; %s" % (
            info["date"], info["host"], info["cpu_model"], info["cpus"],
            "; ".join("%s: %s" % kv for kv in info["mpis"].items()), info.get("ssh")))
        print("# load average start %s, end %s; per round %s"
              % (info["load_start"], info["load_end"], info["load_during"]))
        for mpi in mpis:
            agents = agents_of(mpi)
            print()
            print("%s, launcher -np %d /bin/true, ms: median [quartiles] (min-max) of n runs; "
                  "launcher args: %s" % (mpi.name, self.a.np, mpi.args))
            ratios = "hvd-rsh/pass (median, min)" + (" | ssh/hvd-rsh (median, min)" if "ssh" in agents else "")
            print("| hosts | daemons | " + " | ".join(agents) + " | " + ratios + " |")
            print("|---|---|" + "---|" * len(agents) + "---|" * (2 if "ssh" in agents else 1))
            for h in self.a.hosts:
                cells, med, mn = [], {}, {}
                for ag in agents:
                    v = self.samples.get((mpi.name, ag, h), [])
                    m, q1, q3, lo, hi = stats(v)
                    med[ag], mn[ag] = m, lo
                    nf = len(self.failures.get((mpi.name, ag, h), []))
                    cells.append("%.0f [%.0f-%.0f] (%.0f-%.0f) n=%d%s" % (m, q1, q3, lo, hi, len(v),
                                                                         " fail=%d" % nf if nf else ""))
                row = "%.2f, %.2f" % (med["hvd-rsh"] / med["pass"], mn["hvd-rsh"] / mn["pass"])
                if "ssh" in agents:
                    row += " | %.2f, %.2f" % (med["ssh"] / med["hvd-rsh"], mn["ssh"] / mn["hvd-rsh"])
                print("| %d | %s | %s | %s |" % (h, self.orteds.get((mpi.name, h)), " | ".join(cells), row))
        if info.get("agent_calls"):
            print()
            print("One agent call by itself, `AGENT fakehost00 /bin/true`, ms: median [quartiles] (min-max)")
            print("| call | ms |")
            print("|---|---|")
            for what, v in sorted(info["agent_calls"].items()):
                m, q1, q3, lo, hi = stats(v)
                print("| %s | %.1f [%.1f-%.1f] (%.1f-%.1f) n=%d |" % (what, m, q1, q3, lo, hi, len(v)))
        if e2e:
            print()
            print("hvd-driver run -np N --local N/2 -- /bin/true, ms: median (min-max) of n runs")
            print("| N | fake hosts | wall ms |")
            print("|---|---|---|")
            for n in self.a.e2e:
                v = e2e.get(n, [])
                m, _, _, lo, hi = stats(v)
                nf = len(self.failures.get(("e2e", n), []))
                print("| %d | %d | %.0f (%.0f-%.0f) n=%d%s |" % (n, max(n // 2, 1), m, lo, hi, len(v),
                                                                  " fail=%d" % nf if nf else ""))
        if self.a.json:
            with open(self.a.json, "w") as f:
                json.dump({"info": info, "mpirun_args": {m.name: m.args for m in mpis},
                           "daemons": {"%s/%d" % k: v for k, v in self.orteds.items()},
                           "samples": {"/".join(map(str, k)): v for k, v in self.samples.items()},
                           "e2e": e2e,
                           "failures": {"/".join(map(str, k)): v for k, v in self.failures.items()}},
                          f, indent=1)

    def close(self):
        if self.sshd:
            hvdtest.stop(self.sshd, 5, signal.SIGTERM)
        shutil.rmtree(self.work, ignore_errors=True)


def main():
    ints = lambda s: [int(x) for x in s.split(",") if x]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default=os.path.join(REPO, "build", "bin"))
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--hosts", type=ints, default=[2, 4, 8, 16])
    p.add_argument("--mpi", type=lambda s: [x for x in s.split(",") if x], default=["openmpi4"],
                   help="openmpi4,openmpi5,mpich (the wheels: scripts/install-mpi-wheels.sh)")
    p.add_argument("--agent-calls", type=int, default=0,
                   help="also time N single agent calls without a launcher (0: none)")
    p.add_argument("--e2e", type=ints, default=[2, 4, 8, 16, 32], help="'' to skip")
    p.add_argument("--e2e-runs", type=int, default=5)
    p.add_argument("--timeout", type=int, default=60)
    p.add_argument("--settle", type=float, default=0.3,
                   help="seconds between serve's env file and the timed mpirun (hvd-rsh only)")
    p.add_argument("--agents", type=lambda t: t.split(","), default=AGENTS,
                   help="which of hvd-rsh,pass,ssh (default all; hvd-rsh and pass are needed)")
    p.add_argument("--bin-ref", help="another build's bin dir: adds the arm hvd-rsh-ref (A/B of a change)")
    p.add_argument("--json")
    b = Bench(p.parse_args())
    try:
        b.main()
    finally:
        b.close()


if __name__ == "__main__":
    main()
