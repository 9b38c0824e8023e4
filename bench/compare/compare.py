#!/usr/bin/env python3
"""compare.py: hvd-bridge against Horovod-on-Spark (horovod==0.28.1) and ssh, on this machine,
in one run, alternating the systems run by run. `bench/compare/run.sh` sets up the virtual
environment and calls this; see docs/performance.md, section "Against Horovod on Spark".

Measures (each: --runs timed runs per cell after one untimed warm-up, medians, min, max):

  launch  per-host launch cost: `mpirun -np H -H h0:1,..,hH-1:1 /bin/true` with the same
          mpirun arguments, through
            horovod  `python -m horovod.spark.driver.mpirun_rsh A S` (plm_rsh_agent) and H
                     Horovod SparkTaskServices (one process each, registered with a
                     SparkDriverService under host hash hN; horovod_side.py)
            hvd      hvd-rsh and H hvd-task services (`hvd-driver serve`)
          services are started fresh for every run and are not timed: only mpirun is.
  rss     peak RSS (KiB) and peak Pss (proportional set size: shared pages divided among the
          processes mapping them) of the agent, of the task side (the task service process,
          and its per-command helper: Horovod's spawn middleman, our keeper) and of the rank
          bootstrap (`python -m horovod.spark.task.mpirun_exec_fn A S` vs `hvd-exec`),
          H=2 hosts, one rank each, the real entry (Horovod: a function returning time.time(),
          hvd: /bin/true). Processes are sampled while they live (maxrss.c, 2 ms; the task
          side every 5 ms); a process that was never sampled fails the run (it is not 0).
  spark   a real local Spark cluster (local-cluster[2,4,1024]): horovod.spark.run (MPI mode)
          with a trivial function vs org.hvdbridge.spark.HorovodSpark.run with a trivial entry
          point, N Spark tasks = N ranks (spark_app.py, in one Spark application).
  stream  `head -c BYTES /dev/zero` run in a task service, its output streamed to the caller:
          hvd-rsh, Horovod's rsh(background=False) stream, OpenSSH to a loopback sshd.
  pyspark the same Python function (returns its rank) through horovod.spark.run and
          hvd_bridge.spark.run on a local Spark cluster (local-cluster[2,4,1024]), N ranks =
          N Spark tasks: time to the results at the driver (one application,
          pyspark_app.py time), then peak memory per process kind (a second application with
          spark.python.worker.reuse=false, pyspark_app.py rss, --rss-runs runs at the largest
          N). The package comes from --pythonpath (the build's staged build/python).

Writes every sample as JSON (--json) and prints Markdown tables (--markdown FILE).
"""
import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "bench", "launch"))
import launch_bench  # noqa: E402  (timed, kill_group, loadavg, the sshd setup, hvd-driver serve)

log = launch_bench.log


def median_min_max(v):
    return (statistics.median(v), min(v), max(v)) if v else (None, None, None)


class HorovodServices:
    """A SparkDriverService and H SparkTaskServices, each in its own process (horovod_side.py)."""

    def __init__(self, py, work, names, base_env):
        self.procs = []
        self.py = py
        d = tempfile.mkdtemp(dir=work, prefix="hvdsvc.")
        self.dir = d
        self.driver_file = os.path.join(d, "driver.json")
        side = os.path.join(HERE, "horovod_side.py")
        self.driver = subprocess.Popen([py, side, "driver", "--np", str(len(names)), "--out", self.driver_file],
                                       env=base_env, cwd=d, stdin=subprocess.PIPE,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        self.procs.append(self.driver)
        deadline = time.time() + 60
        while not os.path.exists(self.driver_file):
            if self.driver.poll() is not None or time.time() > deadline:
                raise RuntimeError("horovod driver did not start: %s" % self.driver.stderr.read().decode()[-500:])
            time.sleep(0.02)
        with open(self.driver_file) as f:
            self.blob = json.load(f)
        self.tasks = []
        for i, n in enumerate(names):
            t = os.path.join(d, "tmp", n)
            os.makedirs(t)
            p = subprocess.Popen([py, side, "task", "--index", str(i), "--host-hash", n,
                                  "--driver-file", self.driver_file],
                                 env=dict(base_env, TMPDIR=t), cwd=d, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            self.tasks.append(p)
            self.procs.append(p)
        for p in self.tasks:
            line = p.stdout.readline().decode()
            if not line.startswith("registered"):
                raise RuntimeError("horovod task did not register: %r" % (line + p.stdout.read().decode()[-500:]))

    def agent(self):
        return "%s -m horovod.spark.driver.mpirun_rsh %s %s" % (self.py, self.blob["addrs"], self.blob["settings"])

    def rank(self):
        return [self.py, "-m", "horovod.spark.task.mpirun_exec_fn", self.blob["addrs"], self.blob["settings"]]

    def env(self):
        return {"_HOROVOD_SECRET_KEY": self.blob["key"]}

    def task_outputs(self):
        """Closes the tasks' stdin (they end) and returns what each printed."""
        for p in self.tasks:
            p.stdin.close()
        out = []
        for p in self.tasks:
            killer = threading.Timer(20, launch_bench.kill_group, (p,))
            killer.start()
            out.append(p.stdout.read().decode(errors="replace"))
            killer.cancel()
            p.wait()
        return out

    def close(self):
        for p in self.procs:
            try:
                if p.stdin and not p.stdin.closed:
                    p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            launch_bench.kill_group(p)  # whatever a service left in its session
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


class HvdServices:
    """`hvd-driver serve` and H hvd-task services (launch_bench.Bench.serve)."""

    def __init__(self, lb, work, names):
        self.lb = lb
        self.dir = tempfile.mkdtemp(dir=work, prefix="hvdbridge.")
        # Open MPI 4 (the system's), as the Horovod side; entry: /bin/true
        self.srv, self.tasks, self.vals = lb.serve(launch_bench.Mpi("openmpi4"), len(names), names, self.dir)

    def agent(self):
        return self.vals["HVD_RSH"]

    def rank(self):
        return [self.vals["HVD_EXEC"]]

    def env(self):
        return {"HVD_DRIVER_ADDRS": self.vals["HVD_DRIVER_ADDRS"], "HVD_SECRET_FILE": self.vals["HVD_SECRET_FILE"]}

    def close(self):
        self.lb.stop_serve(self.srv, self.tasks)
        shutil.rmtree(self.dir, ignore_errors=True)


def proc_status(pid, field):
    try:
        with open("/proc/%d/status" % pid) as f:
            for l in f:
                if l.startswith(field + ":"):
                    return int(l.split()[1])
    except (OSError, ValueError):
        pass
    return None


def children(pid):
    """Direct children of pid, whichever of its threads forked them."""
    out = []
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                    out += [int(x) for x in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def pss_kib(pid):
    """The Pss line of /proc/PID/smaps_rollup (KiB: shared pages divided among the processes
    mapping them), or None."""
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class HelperSampler(threading.Thread):
    """Samples, every 5 ms until stopped, the task service processes (VmHWM as last seen, the
    largest Pss) and their direct children, the per-command helpers (Horovod's spawn middleman
    and resource tracker, our keeper: the largest per-task sums of VmHWM and of Pss). A process
    never seen stays 0 there, and the caller fails the run: a missed sample is no data."""

    def __init__(self, pids):
        super().__init__(daemon=True)
        self.pids = pids
        self.peak = {p: 0 for p in pids}       # helpers' VmHWM sum
        self.peak_pss = {p: 0 for p in pids}   # helpers' Pss sum
        self.task_hwm = {p: 0 for p in pids}
        self.task_pss = {p: 0 for p in pids}
        self.stop = threading.Event()

    def run(self):
        seen = {p: {} for p in self.pids}
        seen_pss = {p: {} for p in self.pids}
        while not self.stop.is_set():
            self.once(seen, seen_pss)
            time.sleep(0.005)
        self.once(seen, seen_pss)

    def once(self, seen, seen_pss):
        for p in self.pids:
            v = proc_status(p, "VmHWM")
            if v:
                self.task_hwm[p] = max(self.task_hwm[p], v)
            v = pss_kib(p)
            if v:
                self.task_pss[p] = max(self.task_pss[p], v)
            for c in children(p):
                v = proc_status(c, "VmHWM")
                if v:
                    seen[p][c] = max(seen[p].get(c, 0), v)
                v = pss_kib(c)
                if v:
                    seen_pss[p][c] = max(seen_pss[p].get(c, 0), v)
            self.peak[p] = max(self.peak[p], sum(seen[p].values()))
            self.peak_pss[p] = max(self.peak_pss[p], sum(seen_pss[p].values()))


class Compare:
    def __init__(self, a):
        self.a = a
        self.bin = os.path.abspath(a.bin)
        self.lb = launch_bench.Bench(argparse.Namespace(bin=self.bin, settle=a.settle, np=1,
                                                        timeout=a.timeout))
        self.work = self.lb.work  # removed by self.lb.close()
        self.base_env = self.lb.base_env
        self.samples = {}   # "measure/system/param" -> [values]
        self.failures = {}
        self.mpirun_args = "-mca if_base_do_not_resolve 1 --stdin none"

    def record(self, key, ok, value, why=""):
        if ok:
            self.samples.setdefault(key, []).append(value)
        else:
            self.failures.setdefault(key, []).append(why[-400:])
            log("FAIL %s: %s" % (key, why[-400:]))

    def mpirun(self, hosts_words, np_, agent, rank_cmd, extra_env, cwd):
        cmd = ["mpirun", "--allow-run-as-root", "-np", str(np_), "-H", hosts_words,
               "-mca", "plm_rsh_agent", agent] + self.mpirun_args.split() + \
              ["-mca", "btl_tcp_if_include", "lo", "-mca", "oob_tcp_if_include", "lo"] + rank_cmd
        return launch_bench.timed(cmd, dict(self.base_env, **extra_env), cwd, self.a.timeout)

    def services(self, system, names):
        if system == "horovod":
            return HorovodServices(self.a.python, self.work, names, self.base_env)
        return HvdServices(self.lb, self.work, names)

    # ---------- 1. launch ----------
    def launch_once(self, system, h, record=True):
        names = ["h%d" % i for i in range(h)]
        svc = self.services(system, names)
        try:
            time.sleep(self.a.settle)
            dt, rc, out = self.mpirun(",".join(n + ":1" for n in names), h, svc.agent(), ["/bin/true"],
                                      svc.env(), svc.dir)
        finally:
            svc.close()
        if record:
            self.record("launch/%s/%d" % (system, h), rc == 0, dt * 1000, "rc=%d %s" % (rc, out))

    def launch(self):
        for system in self.systems():
            self.launch_once(system, self.a.hosts[0], record=False)  # warm-up (page cache)
        for r in range(self.a.runs):
            for h in self.a.hosts:
                for system in self.rotate(self.systems(), r):
                    self.launch_once(system, h)
            log("launch: round %d/%d done" % (r + 1, self.a.runs))

    # ---------- 3. peak RSS ----------
    def rss_once(self, system):
        names = ["h0", "h1"]
        svc = self.services(system, names)
        d = svc.dir
        wrap = [self.maxrss_bin()]
        try:
            time.sleep(self.a.settle)
            task_pids = [p.pid for p in svc.tasks]
            sampler = HelperSampler(task_pids)
            sampler.start()
            agent = " ".join(wrap + [os.path.join(d, "agent"), "--", svc.agent()])
            rank = wrap + [os.path.join(d, "rank"), "--"] + svc.rank()
            dt, rc, out = self.mpirun("h0:1,h1:1", 2, agent, rank, svc.env(), d)
            sampler.stop.set()
            sampler.join()
            outs = svc.task_outputs() if system == "horovod" else []
            if system == "horovod" and not all("done" in o and "exit 0" in o for o in outs):
                rc = rc or 1
                out += " task outputs: %r" % outs
            found = {"agent": [], "rank": []}    # (maxrss, peak Pss) per process
            for fn in os.listdir(d):
                kind = fn.split(".")[0]
                if kind in found:
                    with open(os.path.join(d, fn)) as f:
                        found[kind] += [tuple(int(x) for x in l.split()[:2]) for l in f if l.strip()]
        finally:
            svc.close()
        # Every number must have been measured: a process the samplers missed fails the run
        # (it once read as 0 MiB and was averaged in).
        missed = [k for k in ("agent", "rank") if len(found[k]) != 2 or min(x for v in found[k] for x in v) <= 0]
        missed += ["task %d" % p for p in task_pids if not sampler.task_hwm[p] or not sampler.task_pss[p]]
        missed += ["helpers of task %d" % p for p in task_pids if not sampler.peak[p] or not sampler.peak_pss[p]]
        ok = rc == 0 and not missed
        why = "rc=%d, not measured: %s; %s" % (rc, ", ".join(missed) or "-", out)
        for k, (rss, pss) in {"agent": (max(x[0] for x in found["agent"]) if found["agent"] else 0,
                                        max(x[1] for x in found["agent"]) if found["agent"] else 0),
                              "task": (max(sampler.task_hwm.values()), max(sampler.task_pss.values())),
                              "helper": (max(sampler.peak.values()), max(sampler.peak_pss.values())),
                              "rank": (max(x[0] for x in found["rank"]) if found["rank"] else 0,
                                       max(x[1] for x in found["rank"]) if found["rank"] else 0)}.items():
            self.record("rss/%s/%s" % (system, k), ok, rss, why)
            self.record("pss/%s/%s" % (system, k), ok, pss, why)

    def rss(self):
        for r in range(self.a.rss_runs):
            for system in self.rotate(self.systems(), r):
                self.rss_once(system)

    def maxrss_bin(self):
        exe = os.path.join(self.work, "maxrss")
        if not os.path.exists(exe):
            subprocess.run(["cc", "-O2", "-o", exe, os.path.join(HERE, "maxrss.c")], check=True)
        return exe

    # ---------- 4. streamed output ----------
    def stream_once(self, system, record=True):
        n = self.a.stream_mib << 20
        if system == "ssh":
            cmd = ["sh", "-c", "ssh -F %s h0 'head -c %d /dev/zero' | wc -c" % (self.lb.ssh_cfg, n)]
            dt, rc, out = launch_bench.timed(cmd, self.base_env, self.work, self.a.timeout)
            got = int(out.split()[-1]) if rc == 0 and out.split() else -1
        elif system == "hvd":
            svc = HvdServices(self.lb, self.work, ["h0"])
            try:
                time.sleep(self.a.settle)
                cmd = ["sh", "-c", "\"$0\" h0 head -c %d /dev/zero | wc -c" % n, svc.agent()]
                dt, rc, out = launch_bench.timed(cmd, dict(self.base_env, **svc.env()), svc.dir, self.a.timeout)
                got = int(out.split()[-1]) if rc == 0 and out.split() else -1
            finally:
                svc.close()
        else:
            svc = HorovodServices(self.a.python, self.work, ["h0"], self.base_env)
            try:
                time.sleep(self.a.settle)
                cmd = [self.a.python, os.path.join(HERE, "horovod_side.py"), "stream", "--driver-file",
                       svc.driver_file, "--host-hash", "h0", "--bytes", str(n)]
                dt, rc, out = launch_bench.timed(cmd, self.base_env, svc.dir, self.a.timeout)
                m = re.search(r"bytes (\d+) rc 0", out)
                got = int(m.group(1)) if m else -1
            finally:
                svc.close()
        if record:
            self.record("stream/%s/%d" % (system, self.a.stream_mib), rc == 0 and got == n,
                        self.a.stream_mib / dt, "rc=%d got %d of %d bytes: %s" % (rc, got, n, out))

    def stream(self):
        systems = self.systems() + (["ssh"] if self.lb.ssh_cfg else [])
        for s in systems:
            self.stream_once(s, record=False)
        for r in range(self.a.runs):
            for s in self.rotate(systems, r):
                self.stream_once(s)

    # ---------- 2. Spark ----------
    def spark(self):
        cmd = [sys.executable, os.path.join(HERE, "spark_cluster.py"), "--bin", self.bin,
               "--python", self.a.python, "--jar", self.a.jar,
               "--tasks", ",".join(map(str, self.a.spark_tasks)), "--runs", str(self.a.runs),
               "--out", os.path.join(self.work, "spark.json")]
        log("spark: " + " ".join(cmd))
        r = subprocess.run(cmd, env=self.base_env, cwd=self.work, timeout=self.a.spark_timeout)
        if r.returncode != 0:
            self.failures.setdefault("spark", []).append("spark_cluster.py exited %d" % r.returncode)
            return
        with open(os.path.join(self.work, "spark.json")) as f:
            res = json.load(f)
        for k, v in res["samples"].items():
            self.samples.setdefault(k, []).extend(v)
        for k, v in res["failures"].items():
            self.failures.setdefault(k, []).extend(v)
        self.spark_info = res.get("info", {})

    # ---------- 5. a Python function on Spark ----------
    def pyspark(self):
        self.pyspark_info = {}
        for mode, tasks, runs in (("time", self.a.pyspark_tasks, self.a.runs),
                                  ("rss", self.a.pyspark_tasks[-1:], self.a.rss_runs)):
            out = os.path.join(self.work, "pyspark-%s.json" % mode)
            cmd = [sys.executable, os.path.join(HERE, "spark_cluster.py"), "--app", "python", "--mode", mode,
                   "--python", self.a.python, "--pythonpath", self.a.pythonpath,
                   "--tasks", ",".join(map(str, tasks)), "--runs", str(runs),
                   "--warmups", str(self.a.pyspark_warmups), "--out", out]
            log("pyspark: " + " ".join(cmd))
            r = subprocess.run(cmd, env=self.base_env, cwd=self.work, timeout=self.a.spark_timeout)
            if r.returncode != 0 or not os.path.exists(out):
                self.failures.setdefault("pyspark/" + mode, []).append("spark_cluster.py exited %d" % r.returncode)
                continue
            with open(out) as f:
                res = json.load(f)
            for k, v in res["samples"].items():
                self.samples.setdefault(k, []).extend(v)
            for k, v in res["failures"].items():
                self.failures.setdefault(k, []).extend(v)
            self.pyspark_info[mode] = res.get("info", {})

    # ---------- driver ----------
    def systems(self):
        return [s for s in ("horovod", "hvd") if s in self.a.systems]

    @staticmethod
    def rotate(xs, r):
        r %= len(xs)
        return xs[r:] + xs[:r]

    def versions(self):
        def out(cmd):
            try:
                return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      timeout=60).stdout.decode().strip()
            except (OSError, subprocess.TimeoutExpired):
                return "?"
        cpu = "?"
        with open("/proc/cpuinfo") as f:
            for l in f:
                if l.startswith("model name"):
                    cpu = l.split(":", 1)[1].strip()
                    break
        return {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": "%s, %d CPUs, %.0f GiB, kernel %s" % (cpu, os.cpu_count(),
                                                             os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
                                                             platform.release()),
            "os": out(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
            "horovod": out([self.a.python, "-c", "import horovod; print(horovod.__version__)"]),
            "pyspark": out([self.a.python, "-c", "import pyspark; print(pyspark.__version__)"]),
            "python": out([self.a.python, "-c", "import sys; print(sys.version.split()[0])"]),
            "java": out(["sh", "-c", "java -version 2>&1 | head -1"]),
            "mpirun": out(["mpirun", "--version"]).splitlines()[0],
            "ssh": out(["ssh", "-V"]),
            "hvd_bridge": out(["git", "-C", REPO, "describe", "--always", "--dirty"]),
        }

    def main(self):
        a = self.a
        info = self.versions()
        info["load_start"] = launch_bench.loadavg()
        t0 = time.time()
        try:
            if "stream" in a.measures and not self.lb.start_sshd(["h0"]):
                log("stream: ssh skipped (no sshd)")
            for m in a.measures:
                log("=== %s" % m)
                getattr(self, m)()
        finally:
            info["load_end"] = launch_bench.loadavg()
            info["seconds"] = round(time.time() - t0)
            self.lb.close()
        info["spark"] = getattr(self, "spark_info", {})
        info["pyspark_app"] = getattr(self, "pyspark_info", {})
        res = {"info": info, "args": {k: v for k, v in vars(a).items()}, "samples": self.samples,
               "failures": self.failures}
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        log("compare: %d s, %d failures" % (info["seconds"], sum(len(v) for v in self.failures.values())))
        return 1 if self.failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--python", required=True, help="the virtual environment's python (horovod, pyspark)")
    ap.add_argument("--jar", default=os.path.join(REPO, "build", "lib", "hvd-bridge.jar"),
                    help="hvd-bridge.jar, built with Spark's jars (org.hvdbridge.spark.HorovodSpark)")
    ap.add_argument("--measures", default="launch,rss,spark,stream,pyspark")
    ap.add_argument("--systems", default="horovod,hvd", type=lambda t: t.split(","),
                    help="horovod,hvd (default); hvd alone needs no Horovod (no ratios then)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per cell (default 5)")
    ap.add_argument("--rss-runs", type=int, default=3)
    ap.add_argument("--hosts", default="1,2,4,8")
    ap.add_argument("--spark-tasks", default="2,4,8")
    ap.add_argument("--stream-mib", type=int, default=256)
    ap.add_argument("--pyspark-tasks", default="2,4,8")
    ap.add_argument("--pyspark-warmups", type=int, default=1, help="untimed calls of each system first")
    ap.add_argument("--pythonpath", default=os.path.join(REPO, "build", "python"),
                    help="the staged hvd_bridge package (measure pyspark)")
    ap.add_argument("--settle", type=float, default=0.3, help="seconds between services up and mpirun")
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--spark-timeout", type=int, default=900)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    if os.sep in a.python:
        a.python = os.path.abspath(a.python)  # services run in their own directories
    a.measures = [m for m in a.measures.split(",") if m]
    a.hosts = [int(x) for x in a.hosts.split(",") if x]
    a.spark_tasks = [int(x) for x in a.spark_tasks.split(",") if x]
    a.pyspark_tasks = [int(x) for x in a.pyspark_tasks.split(",") if x]
    a.pythonpath = os.path.abspath(a.pythonpath)
    os.environ.pop("_HOROVOD_SECRET_KEY", None)
    return Compare(a).main()


if __name__ == "__main__":
    sys.exit(main())
