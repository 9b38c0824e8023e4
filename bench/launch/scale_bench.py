#!/usr/bin/env python3
"""scale_bench.py: launch at scale, hvd-rsh against the pass-through floor, alternating.

For each size (H fake hosts x S slots = N ranks), run by run alternating the two agents with
the same mpirun, the same host names and the same rank program:

  hvd-rsh   per run a fresh `hvd-driver serve -np N --env-file F -- STAMP DIR` and N
            `hvd-task`s (S per host hash, one TMPDIR per host), started and registered before
            the clock starts; then `mpirun -np N -H $HVD_HOSTS -mca plm_rsh_agent $HVD_RSH
            $HVD_MPIRUN_ARGS ... $HVD_EXEC` is timed: each rank is hvd-exec, which maps its
            rank to a task, fetches the entry point from the driver and runs STAMP, then
            reports its result to the driver.
  hvd-rsh-agent  the same services and agent, but the rank program is STAMP itself, not
            hvd-exec: the agent path alone (what launch_bench.py times), without the rank
            bootstrap; the driver's figures are not taken for it.
  pass      a minimal pass-through agent (launch_bench.py's: skips ssh options and the host,
            one TMPDIR per host, Open MPI's session directory in /dev/shm per host as a task
            service gives its command, exec /bin/sh -c "<words>"); the rank program is STAMP.

STAMP is a tiny C program that writes the wall clock at its entry to DIR. Per run:
  entry  the latest rank's entry stamp minus the time mpirun was started;
  end    mpirun's exit (every rank done; with hvd-rsh every result is at the driver by then);
and for hvd-rsh the driver's (hvd-driver serve's) peak RSS and CPU time over its whole life
(wait4's rusage: registration, probing, the job, shutdown), the sockets it held at most and
while the ranks ran (sampled from /proc every 20 ms), and its CPU time during mpirun.

With more than 64 hosts Open MPI's tree spawn starts: orteds call the agent themselves (the
"by orted" column counts such agent calls in the hvd-rsh arm from HVD_RSH_VERBOSE output).

  python3 bench/launch/scale_bench.py [--bin build/bin] [--sizes 16x1,32x1,...,256x4]
                                      [--runs 3] [--json FILE] [--plot PNG]
  python3 bench/launch/scale_bench.py --from-json FILE [--plot PNG]   (report only)

Prints a Markdown table (median and min-max of the runs; the ratios are taken run by run,
each hvd-rsh run against the pass run next to it). Needs Open MPI, cc, gnuplot for --plot.
Results: docs/performance.md, section "Launch at scale".
"""
import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
sys.path.insert(0, HERE)
import hvdtest  # noqa: E402
import launch_bench  # noqa: E402  (the pass-through agent)

STAMP_C = r'''
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (argc < 2) return 2;
    char path[4096], line[64];
    snprintf(path, sizeof path, "%s/%d", argv[1], (int)getpid());
    int n = snprintf(line, sizeof line, "%lld.%09ld\n", (long long)ts.tv_sec, ts.tv_nsec);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, line, (size_t)n) != n) return 1;
    return close(fd) != 0;
}
'''

ARMS = ["hvd-rsh", "pass", "hvd-rsh-agent"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def loadavg():
    return [round(x, 2) for x in os.getloadavg()]


def read_stamps(d):
    out = []
    for name in os.listdir(d):
        try:
            with open(os.path.join(d, name)) as f:
                out.append(float(f.read()))
        except (OSError, ValueError):
            pass
    return out


class Sampler(threading.Thread):
    """Samples a process's sockets and CPU time every 20 ms until stopped or it is gone."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid = pid
        self.stop_ev = threading.Event()
        self.samples = []  # (time, sockets, cpu_s)
        self.hwm_kib = 0   # VmHWM, the last seen

    def one(self):
        try:
            fds = os.listdir("/proc/%d/fd" % self.pid)
            socks = 0
            for fd in fds:
                try:
                    if os.readlink("/proc/%d/fd/%s" % (self.pid, fd)).startswith("socket:"):
                        socks += 1
                except OSError:
                    pass
            with open("/proc/%d/stat" % self.pid) as f:
                st = f.read().rsplit(")", 1)[1].split()
            cpu = (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
            with open("/proc/%d/status" % self.pid) as f:
                m = re.search(r"^VmHWM:\s+(\d+)", f.read(), re.M)
            self.hwm_kib = int(m.group(1)) if m else self.hwm_kib
            self.samples.append((time.time(), socks, cpu))
            return True
        except (OSError, IndexError, ValueError):
            return False

    def run(self):
        while not self.stop_ev.is_set() and self.one():
            self.stop_ev.wait(0.02)

    def between(self, t0, t1):
        return [s for s in self.samples if t0 <= s[0] <= t1]


class Bench:
    def __init__(self, a):
        self.a = a
        self.bin = os.path.abspath(a.bin)
        self.work = tempfile.mkdtemp(prefix="hvd-scale-bench.")
        self.base_env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        for k in list(self.base_env):
            if k.startswith(("HVD_", "OMPI_MCA_")):
                del self.base_env[k]
        self.runs = []  # one dict per run

    def build(self):
        for name, src in (("pass-agent", launch_bench.PASS_AGENT_C), ("stamp", STAMP_C)):
            c = os.path.join(self.work, name + ".c")
            with open(c, "w") as f:
                f.write(src)
            subprocess.run(["cc", "-O2", "-o", os.path.join(self.work, name), c], check=True)
        self.pass_agent = os.path.join(self.work, "pass-agent")
        self.stamp = os.path.join(self.work, "stamp")

    def mpirun_cmd(self, np_, hosts, agent, prog):
        return (["mpirun", "--allow-run-as-root", "-np", str(np_), "-H", hosts, "-mca", "plm_rsh_agent", agent,
                 "-mca", "if_base_do_not_resolve", "1", "--stdin", "none", "-bind-to", "none",
                 "-mca", "btl_tcp_if_include", "lo", "-mca", "oob_tcp_if_include", "lo"]
                + self.a.mpi_arg + prog)

    def timed_mpirun(self, cmd, env, cwd, stamps):
        t0 = time.time()
        p = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=self.a.timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            launch_bench.kill_group(p)
            out, _ = p.communicate()
            rc = 124
        t1 = time.time()
        st = read_stamps(stamps)
        return t0, t1, rc, out.decode(errors="replace"), st

    def run_hvd(self, h, s, d, rec, exec_ranks=True):
        n = h * s
        names = ["fakehost%03d" % k for k in range(h)]
        stamps = os.path.join(d, "stamps")
        os.mkdir(stamps)
        env_file = os.path.join(d, "job.env")
        errf = open(os.path.join(d, "serve.err"), "w+b")
        srv = hvdtest.start_driver(self.bin, ["serve", "-np", str(n), "--env-file", env_file, "--",
                                              self.stamp, stamps], self.base_env, d,
                                   stdout=subprocess.DEVNULL, stderr=errf, start_new_session=True)
        tasks = []
        try:
            tenv = dict(self.base_env, **hvdtest.task_hint(srv, "hvd-driver serve", errfile=errf),
                        HVD_RSH_VERBOSE="1")
            for i in range(n):
                host = names[i // s]
                t = os.path.join(d, "tmp", host)
                os.makedirs(t, exist_ok=True)
                w = os.path.join(d, "work", str(i))
                os.makedirs(w)
                tasks.append(hvdtest.start_task(self.bin, i, dict(tenv, TMPDIR=t), host, start_timeout=300, cwd=w,
                                                start_new_session=True, stderr=errf))
            hvdtest.wait_for(lambda: os.path.exists(env_file) or srv.poll() is not None, 300, interval=0.05)
            if not os.path.exists(env_file):
                raise RuntimeError("no env file from hvd-driver serve: %s" % errf.name)
            vals = hvdtest.read_env_file(env_file)
            time.sleep(self.a.settle)
            samp = Sampler(srv.pid)
            samp.start()
            env = dict(self.base_env, HVD_DRIVER_ADDRS=vals["HVD_DRIVER_ADDRS"],
                       HVD_SECRET_FILE=vals["HVD_SECRET_FILE"], HVD_RSH_VERBOSE="1")
            prog = [vals["HVD_EXEC"]] if exec_ranks else [self.stamp, stamps]
            cmd = self.mpirun_cmd(n, vals["HVD_HOSTS"], vals["HVD_RSH"], prog)
            t0, t1, rc, out, st = self.timed_mpirun(cmd, env, d, stamps)
            if not exec_ranks:  # no rank reports to this driver: stop it, take no figures
                samp.stop_ev.set()
                samp.join()
                return t0, t1, rc, out, st
            # serve exits once every result is in; its rusage is the driver's whole life
            deadline = time.time() + 60
            ru = None
            while time.time() < deadline:
                pid, status, ru = os.wait4(srv.pid, os.WNOHANG)
                if pid:
                    srv.returncode = os.waitstatus_to_exitcode(status)
                    break
                time.sleep(0.02)
            samp.stop_ev.set()
            samp.join()
            if ru is None or not pid:
                rc = rc or 125
                out += "\nhvd-driver serve did not exit within 60 s of mpirun"
            else:
                rec["driver_rss_mib"] = ru.ru_maxrss / 1024.0
                rec["driver_cpu_s"] = ru.ru_utime + ru.ru_stime
                if srv.returncode != 0:
                    rc = rc or srv.returncode
                    errf.seek(0)
                    out += "\nserve exited %d: %s" % (srv.returncode, errf.read()[-500:].decode(errors="replace"))
            during = samp.between(t0, t1)
            if samp.hwm_kib:
                rec["driver_hwm_mib"] = samp.hwm_kib / 1024.0
            if during:
                rec["driver_sockets_peak"] = max(x[1] for x in samp.samples)
                rec["driver_cpu_mpirun_s"] = during[-1][2] - during[0][2]
            errf.seek(0)
            text = errf.read().decode(errors="replace")
            calls = re.findall(r'orte_parent_uri "\d+\.(\d+);', text + out)
            rec["agent_calls"] = len(calls)
            rec["agent_calls_by_orted"] = sum(1 for c in calls if c != "0")
        finally:
            for p in tasks:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
            if srv.poll() is None and srv.returncode is None:
                launch_bench.kill_group(srv)
            for p in tasks:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    launch_bench.kill_group(p)
                    p.wait()
            try:
                srv.wait(timeout=10)
            except (subprocess.TimeoutExpired, ChildProcessError):
                pass
            errf.close()
        return t0, t1, rc, out, st

    def run_pass(self, h, s, d):
        n = h * s
        names = ["fakehost%03d" % k for k in range(h)]
        stamps = os.path.join(d, "stamps")
        os.mkdir(stamps)
        hosts = ",".join("%s:%d" % (x, s) for x in names)
        shm = tempfile.mkdtemp(dir="/dev/shm", prefix="hvd-scale-bench.")
        env = dict(self.base_env, PASS_AGENT_TMPBASE=os.path.join(d, "tmp"), PASS_AGENT_SHMBASE=shm)
        try:
            return self.timed_mpirun(self.mpirun_cmd(n, hosts, self.pass_agent, [self.stamp, stamps]), env, d,
                                     stamps)
        finally:
            shutil.rmtree(shm, ignore_errors=True)

    def run_one(self, arm, h, s, rnd):
        d = tempfile.mkdtemp(dir=self.work, prefix="run.")
        rec = {"arm": arm, "hosts": h, "slots": s, "round": rnd, "load": loadavg()}
        try:
            if arm == "pass":
                t0, t1, rc, out, st = self.run_pass(h, s, d)
            else:
                t0, t1, rc, out, st = self.run_hvd(h, s, d, rec, exec_ranks=arm == "hvd-rsh")
        except Exception as e:  # a failed set-up fails the run, not the benchmark
            t0, t1, rc, out, st = 0, 0, 126, repr(e), []
        n = h * s
        rec["rc"] = rc
        if rc == 0 and len(st) != n:
            rec["rc"] = rc = 127
            out += "\n%d of %d ranks stamped their entry" % (len(st), n)
        if rc == 0:
            rec["entry_ms"] = (max(st) - t0) * 1000
            rec["end_ms"] = (t1 - t0) * 1000
        else:
            rec["error"] = out.strip()[-1500:]
            log("FAIL %s %dx%d rc=%d: %s" % (arm, h, s, rc, out.strip()[-600:]))
        shutil.rmtree(d, ignore_errors=True)
        self.runs.append(rec)
        log("%s %dx%d: %s" % (arm, h, s, {k: (round(v, 1) if isinstance(v, float) else v)
                                          for k, v in rec.items() if k not in ("error", "arm")}))

    def main(self):
        info = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(),
                "kernel": platform.release(), "cpus": os.cpu_count(), "runs": self.a.runs,
                "sizes": self.a.sizes, "load_start": loadavg(), "mpi_args": self.a.mpi_arg,
                "mem_total_mib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2 ** 20}
        info["mpirun"] = subprocess.run(["mpirun", "--version"], stdout=subprocess.PIPE,
                                        text=True).stdout.splitlines()[0]
        info["git"] = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                                     stdout=subprocess.PIPE, text=True).stdout.strip()
        info["cpu_model"] = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                                  if l.startswith("model name")), "?")
        self.build()
        t_start = time.time()
        arms = [x for x in ARMS if x in self.a.arms]
        for rnd in range(self.a.runs + self.a.warmup):
            for (h, s) in self.a.sizes:
                order = arms[rnd % len(arms):] + arms[:rnd % len(arms)]
                for arm in order:
                    self.run_one(arm, h, s, rnd - self.a.warmup)
        info["load_end"] = loadavg()
        info["seconds"] = round(time.time() - t_start)
        res = {"info": info, "runs": [r for r in self.runs if r["round"] >= 0]}
        if self.a.json:
            with open(self.a.json, "w") as f:
                json.dump(res, f, indent=1)
        return res

    def close(self):
        shutil.rmtree(self.work, ignore_errors=True)


def med(v):
    return "%.0f (%.0f-%.0f)" % (statistics.median(v), min(v), max(v)) if v else "-"


def medf(v, fmt="%.2f"):
    return (fmt + " (" + fmt + "-" + fmt + ")") % (statistics.median(v), min(v), max(v)) if v else "-"


def report(res):
    info, runs = res["info"], res["runs"]
    L = ["Run of %s on %s (%s, %d CPUs, %d MiB), %s, hvd-bridge %s; %d timed run(s) per arm and "
         "size after %s warm-up; %d s in all; load average %s at the start, %s at the end."
         % (info["date"], info["host"], info["cpu_model"], info["cpus"], info.get("mem_total_mib", 0),
            info["mpirun"], info["git"], info["runs"], "a" if info.get("warmup", 1) else "no",
            info["seconds"], info["load_start"], info["load_end"]), ""]
    L.append("Time in ms, median (min-max) of the runs; ratios run by run against the pass run of the same "
             "round, median (min-max).")
    L.append("")
    L.append("| hosts x slots = ranks | orteds started by orteds | last rank in entry: hvd-rsh + hvd-exec / "
             "hvd-rsh + program / pass | ratio to pass: hvd-exec, program | mpirun done: hvd-rsh + hvd-exec / "
             "hvd-rsh + program / pass | ratio to pass: hvd-exec, program | failed runs (hvd-exec / program / pass) |")
    L.append("|---|---|---|---|---|---|---|")
    D = ["| hosts x slots = ranks | driver peak RSS (MiB) | driver CPU, whole life (s) | driver CPU during mpirun (s) "
         "| driver sockets, peak |", "|---|---|---|---|---|"]
    sizes = []
    for r in runs:
        if (r["hosts"], r["slots"]) not in sizes:
            sizes.append((r["hosts"], r["slots"]))
    for (h, s) in sizes:
        rr = [r for r in runs if r["hosts"] == h and r["slots"] == s]
        ok = {a: [r for r in rr if r["arm"] == a and r["rc"] == 0] for a in ARMS}
        fails = {a: sum(1 for r in rr if r["arm"] == a and r["rc"] != 0) for a in ARMS}
        ratios = {(a, k): [] for a in ("hvd-rsh", "hvd-rsh-agent") for k in ("entry_ms", "end_ms")}
        for rnd in sorted(set(r["round"] for r in rr)):
            pair = {r["arm"]: r for r in rr if r["round"] == rnd and r["rc"] == 0}
            for (a, k), v in ratios.items():
                if a in pair and "pass" in pair:
                    v.append(pair[a][k] / pair["pass"][k])
        hv = ok["hvd-rsh"]
        col = lambda k: " / ".join(med([r[k] for r in ok[a]]) for a in ("hvd-rsh", "hvd-rsh-agent", "pass"))
        L.append("| %d x %d = %d | %s | %s | %s, %s | %s | %s, %s | %s |" % (
            h, s, h * s,
            "/".join(sorted(set(str(r.get("agent_calls_by_orted", "?")) for r in hv + ok["hvd-rsh-agent"]))) or "-",
            col("entry_ms"), medf(ratios[("hvd-rsh", "entry_ms")]), medf(ratios[("hvd-rsh-agent", "entry_ms")]),
            col("end_ms"), medf(ratios[("hvd-rsh", "end_ms")]), medf(ratios[("hvd-rsh-agent", "end_ms")]),
            "%d / %d / %d" % (fails["hvd-rsh"], fails["hvd-rsh-agent"], fails["pass"])))
        D.append("| %d x %d = %d | %s | %s | %s | %s |" % (
            h, s, h * s, medf([r["driver_hwm_mib"] for r in hv if "driver_hwm_mib" in r], "%.1f"),
            medf([r["driver_cpu_s"] for r in hv if "driver_cpu_s" in r], "%.2f"),
            medf([r["driver_cpu_mpirun_s"] for r in hv if "driver_cpu_mpirun_s" in r], "%.2f"),
            med([r["driver_sockets_peak"] for r in hv if "driver_sockets_peak" in r])))
    L.append("")
    L.append("The driver (`hvd-driver serve`, hvd-rsh + hvd-exec arm): VmHWM, CPU time from wait4 (registration, "
             "probing, the job, shutdown) and sampled during mpirun, sockets held at most (sampled every 20 ms):")
    L.append("")
    L += D
    errs = [r for r in runs if r["rc"] != 0]
    if errs:
        L.append("")
        for r in errs:
            L.append("- failed: %s %dx%d round %d rc=%d: %s" % (r["arm"], r["hosts"], r["slots"], r["round"], r["rc"],
                                                             r.get("error", "")[-300:].replace("\n", " ")))
    return "\n".join(L)


def plot(res, png):
    runs = res["runs"]
    arms = ["hvd-rsh", "hvd-rsh-agent", "pass"]
    sizes = sorted(set((r["hosts"], r["slots"]) for r in runs))
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "scale.dat")
        with open(data, "w") as f:
            for (h, s) in sizes:
                if s != 1:
                    continue
                row = [str(h)]
                for arm in arms:
                    for k in ("end_ms", "entry_ms"):
                        v = [r[k] / 1000.0 for r in runs if r["hosts"] == h and r["slots"] == s and r["arm"] == arm
                             and r["rc"] == 0]
                        row.append("%.3f %.3f %.3f" % (statistics.median(v), min(v), max(v)) if v else "NaN NaN NaN")
                f.write(" ".join(row) + "\n")
        xs = [h for (h, s) in sizes if s == 1]
        gp = """set terminal pngcairo size 800,480 font "sans,11"
set output "%s"
set title "mpirun -np H over H fake hosts on 2 cores (tree spawn from 65 hosts)"
set xlabel "hosts (H), log scale"
set ylabel "seconds (median, bars: min-max)"
set logscale x 2
set logscale y 2
set key top left
set grid
set xtics (%s)
plot "%s" using 1:2:3:4 with yerrorlines lw 2 lc rgb "#1f77b4" title "hvd-rsh + hvd-exec: mpirun done", \\
     "" using 1:5:6:7 with yerrorlines lw 1 dt 2 lc rgb "#1f77b4" title "hvd-rsh + hvd-exec: last rank in entry", \\
     "" using 1:8:9:10 with yerrorlines lw 2 lc rgb "#2ca02c" title "hvd-rsh, program as rank: mpirun done", \\
     "" using 1:14:15:16 with yerrorlines lw 2 lc rgb "#ff7f0e" title "pass-through: mpirun done", \\
     "" using 1:17:18:19 with yerrorlines lw 1 dt 2 lc rgb "#ff7f0e" title "pass-through: last rank in entry"
""" % (png, ", ".join(map(str, xs)), data)
        r = subprocess.run(["gnuplot"], input=gp.encode(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            log("gnuplot failed: %s" % r.stdout.decode()[-500:])
            return False
    return True


def main():
    def sizes(text):
        out = []
        for x in text.split(","):
            h, _, s = x.partition("x")
            out.append((int(h), int(s or 1)))
        return out

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default=os.path.join(REPO, "build", "bin"))
    p.add_argument("--sizes", type=sizes, default=sizes("16x1,32x1,64x1,128x1,256x1,256x4"),
                   help="HOSTSxSLOTS,... (default 16x1,32x1,64x1,128x1,256x1,256x4)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--settle", type=float, default=0.5, help="seconds between serve's env file and mpirun")
    p.add_argument("--mpi-arg", action="append", default=[], help="extra mpirun word, every arm")
    p.add_argument("--arms", type=lambda t: t.split(","), default=ARMS, help="default: hvd-rsh,pass,hvd-rsh-agent")
    p.add_argument("--json")
    p.add_argument("--from-json", help="report on an earlier run's JSON instead of running")
    p.add_argument("--plot", help="write the time-against-hosts plot here (gnuplot)")
    a = p.parse_args()
    if a.from_json:
        with open(a.from_json) as f:
            res = json.load(f)
    else:
        b = Bench(a)
        try:
            res = b.main()
            res["info"]["warmup"] = a.warmup
        finally:
            b.close()
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    print(report(res))
    if a.plot:
        plot(res, a.plot)
    return 0 if all(r["rc"] == 0 for r in res["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
