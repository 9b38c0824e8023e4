#!/usr/bin/env python3
"""How fast an elastic job resets (docs/performance.md, "Elastic jobs").

    python3 bench/elastic/elastic_bench.py [--build build] [--hosts 2,4,8] [--runs 3] [--smoke]
                                           [--python PYTHON [--start cold|warm|both]
                                            [--horovod HPYTHON]]

Fake hosts on this machine (`hvd-driver run --local`), one task service and one rank each,
training the elastic SGD example (examples/train_sgd: a step every ~20 ms, a commit every 4
steps; rank 0 logs each launch's start and each commit with the time). Two measures per
number of hosts N:

  loss -> resumed    SIGKILL of one host's task service (its orted and rank die with it) to
                     the first line the ranks of the next launch write, once they restored the
                     newest commit (so: back in the training loop). Split into detection +
                     stopping the old launch (kill -> the driver's reset line) and the new
                     launch (reset line -> ranks training).
  new host -> training   a host added to the discovery script (N-1 listed at first) to the
                     first line of the launch that includes it. Split into discovery (the
                     script runs every second; the host's task service starts and registers:
                     add -> the driver tells the ranks), the commit boundary (-> the ranks'
                     last commit), and the relaunch (-> training).

With --python PYTHON (an interpreter with torch and scikit-learn), the ranks run the elastic
PyTorch example instead (examples/python/train_elastic.py: hvd_bridge.torch.elastic, a step
every ~20 ms plus the MLP's own, a commit every 4 steps; the package from build/python): the
relaunch then includes starting Python and importing torch in every new rank, and restoring
the TorchState. --start warm gives every task service a warm interpreter (hvd-task
--warm-python PYTHON with torch, scikit-learn and hvd_bridge.torch imported, docs/elastic.md):
new ranks are forked from it and import nothing; --start both measures cold and warm starts
alternately, run by run.

With --horovod HPYTHON (an interpreter with horovod==0.28.1 built with Gloo and its PyTorch
extension; see docs/performance.md for how), the same measures are taken of a Horovod elastic
job, alternating with hvd-bridge's, run by run: horovodrun --gloo with --min-np/--max-np and a
--host-discovery-script over the same fake host names, each resolved to 127.0.0.1 through an
/etc/hosts bind-mounted in a private mount namespace (unshare -m: horovodrun then starts the
workers itself, without ssh), running the same script with `import horovod.torch as hvd`. A
lost host is its worker SIGKILLed and its name dropped from the discovery script at once.
Horovod prints no reset line to split the times at: its stop, relaunch (after a loss) and
discovery cells read "-", and its commit cell runs from the host's appearance (so it includes
the discovery) to the last commit before the job with it. Needs root (unshare -m).

Prints a table (median of --runs, min-max) and writes build/elastic-bench.json (with --python,
build/elastic-bench-python.json). --smoke: one run at 2 hosts, for CI.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
import hvdtest  # noqa: E402

ARGS = None


class TrainLog:
    """Rank 0's log of the training example: "TIME start size=N ...", "TIME commit ..."."""

    def log_lines(self):
        try:
            with open(self.log) as f:
                return [l.split() for l in f if l.strip()]
        except OSError:
            return []

    def starts(self):
        return [(float(l[0]), int(l[2].split("=")[1])) for l in self.log_lines() if l[1] == "start"]

    def commits(self):
        return [float(l[0]) for l in self.log_lines() if l[1] == "commit"]

    def wait(self, pred, what, timeout=120):
        return hvdtest.wait_for(pred, timeout, what)


class Job(TrainLog):
    """hvd-driver run over fake hosts, its stderr lines and rank 0's log timestamped."""

    def __init__(self, d, args, warm):
        self.mark = uuid.uuid4().hex
        self.log = os.path.join(d, "train.log")
        env = hvdtest.marked_env(self.mark)
        env.pop("HVD_WARM_PYTHON", None)
        if ARGS.python:
            env["PYTHONPATH"] = os.path.join(ARGS.build, "python")
            if warm:
                env["HVD_WARM_PYTHON"] = ARGS.python
                env["HVD_WARM_IMPORTS"] = "torch,torch._dynamo,sklearn.datasets,hvd_bridge.torch"
            work = ["--", ARGS.python, os.path.join(REPO, "examples", "python", "train_elastic.py"),
                    "--epochs", "400", "--commit-every", "4", "--sleep", "0.02", "--log-file",
                    self.log]
        else:
            arg = "epochs=400,commit=4,sleep=20,log=" + self.log
            work = ["--entry", os.path.join(ARGS.build, "examples", "train_sgd",
                                            "libhvd_example_train_sgd.so") +
                    ":hvd_example_train_sgd_elastic", "--entry-arg", arg]
        cmd = ["run", "--verbose"] + args + work
        self.lines = []  # (time, line) of hvd-driver's stderr
        self.proc = hvdtest.start_driver(os.path.join(ARGS.build, "bin"), cmd, env, d,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in self.proc.stderr:
            self.lines.append((time.time(), raw.decode(errors="replace").rstrip()))

    def driver_line(self, pattern, after):
        for t, line in self.lines:
            if t >= after and re.search(pattern, line):
                return t
        return None

    def task_pid(self, index):
        found = [pid for pid, p in hvdtest.processes_with(self.mark).items()
                 if os.path.basename(p.argv[0]) == "hvd-task" and
                 p.argv[p.argv.index("--index") + 1] == str(index)]
        return [p for p in found if hvdtest.parent_of(p) not in found][0]

    def end(self):
        hvdtest.stop(self.proc, 20, signal.SIGTERM)
        hvdtest.assert_no_leftovers(self.mark, 20)


def horovod_script(d):
    """examples/python/train_elastic.py with its one hvd_bridge import swapped for Horovod's."""
    with open(os.path.join(REPO, "examples", "python", "train_elastic.py")) as f:
        text = f.read()
    line = re.compile(r"^import hvd_bridge\.torch as hvd.*$", re.M)
    hvdtest.check(len(line.findall(text)) == 1, "train_elastic.py: no single import to swap")
    path = os.path.join(d, "train_elastic_horovod.py")
    with open(path, "w") as f:
        f.write(line.sub("import horovod.torch as hvd", text))
    return path


class HorovodJob(TrainLog):
    """horovodrun --gloo, elastic, over fake hosts named in a discovery file; the names resolve
    to 127.0.0.1 through an /etc/hosts of its own (a private mount namespace), so that
    horovodrun takes them for this machine and starts the workers itself."""

    def __init__(self, d, names, np_, max_np):
        self.mark = uuid.uuid4().hex
        self.log = os.path.join(d, "train.log")
        self.hosts = os.path.join(d, "hosts")
        self.set_hosts(names)
        script = os.path.join(d, "discover.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\ncat %s\n" % self.hosts)
        os.chmod(script, 0o755)
        etc_hosts = os.path.join(d, "etc-hosts")
        with open("/etc/hosts") as f, open(etc_hosts, "w") as g:
            g.write(f.read() + "\n127.0.0.1 " + " ".join(ALL_NAMES) + "\n")
        horovodrun = os.path.join(os.path.dirname(ARGS.horovod), "horovodrun")
        cmd = ["unshare", "-m", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', etc_hosts,
               horovodrun, "--gloo", "-np", str(np_), "--min-np", "1", "--max-np", str(max_np),
               "--host-discovery-script", script, "--network-interface", "lo",
               ARGS.horovod, horovod_script(d), "--epochs", "400", "--commit-every", "4",
               "--sleep", "0.02", "--log-file", self.log]
        self.out = open(os.path.join(d, "horovodrun.out"), "wb")
        self.proc = subprocess.Popen(cmd, env=hvdtest.marked_env(self.mark), cwd=d,
                                     stdin=subprocess.DEVNULL, stdout=self.out,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def set_hosts(self, names):
        with open(self.hosts + ".new", "w") as f:
            f.write("".join(h + ":1\n" for h in names))
        os.rename(self.hosts + ".new", self.hosts)

    def kill_host(self, name):
        """SIGKILLs the worker(s) horovodrun started for host name; returns how many."""
        pids = [pid for pid, p in hvdtest.processes_with(self.mark).items()
                if p.env.get("HOROVOD_HOSTNAME") == name]
        hvdtest.check(pids, "no worker of host %s to kill" % name)
        hvdtest.kill(pids)
        return len(pids)

    def wait(self, pred, what, timeout=120):
        """TrainLog.wait, with horovodrun's last lines when it fails (the directory goes)."""
        try:
            super().wait(lambda: pred() or self.proc.poll() is not None, what, timeout)
            hvdtest.check(pred(), "%s: horovodrun exited with status %s" % (what, self.proc.returncode))
        except hvdtest.Failure as e:
            self.out.flush()
            with open(self.out.name, "rb") as f:
                tail = f.read()[-3000:].decode(errors="replace")
            raise hvdtest.Failure("%s; horovodrun's last output:\n%s" % (e, tail))

    def end(self):
        hvdtest.stop(self.proc, 20, signal.SIGTERM)
        self.out.close()
        left = hvdtest.wait_gone(lambda: hvdtest.processes_with(self.mark), 10)
        hvdtest.kill(list(left))  # Horovod's leftovers are not what this measures
        if left:
            print("note: %d process(es) of the Horovod job were left after horovodrun ended"
                  % len(left), flush=True)


ALL_NAMES = ["elbench%d" % i for i in range(64)]


def horovod_loss(n):
    """SIGKILL of host n-1's worker, its name dropped from discovery -> rank 0 training again
    in the re-formed job."""
    with tempfile.TemporaryDirectory() as d:
        job = HorovodJob(d, ALL_NAMES[:n], n, n)
        try:
            job.wait(lambda: len(job.commits()) >= 3 and job.starts()[-1][1] == n, "commits")
            job.set_hosts(ALL_NAMES[:n - 1])
            t_kill = time.time()
            job.kill_host(ALL_NAMES[n - 1])
            job.wait(lambda: len(job.starts()) >= 2, "the re-formed job")
            t_start, size = job.starts()[1]
            return {"total": t_start - t_kill, "size": size}
        finally:
            job.end()


def horovod_grow(n):
    """A host added to the discovery script -> rank 0 training in the job with it."""
    with tempfile.TemporaryDirectory() as d:
        job = HorovodJob(d, ALL_NAMES[:n - 1], n - 1, n)
        try:
            job.wait(lambda: len(job.commits()) >= 3 and job.starts()[-1][1] == n - 1,
                     "commits of the first job")
            t_add = time.time()
            job.set_hosts(ALL_NAMES[:n])
            job.wait(lambda: any(s[1] == n for s in job.starts()), "the job with it")
            t_start = [s[0] for s in job.starts() if s[1] == n][0]
            t_commit = max(c for c in job.commits() if c <= t_start)
            return {"total": t_start - t_add, "commit": max(0.0, t_commit - t_add),
                    "relaunch": t_start - t_commit, "size": n}
        finally:
            job.end()


def loss(n, warm):
    """SIGKILL of host n-1's task service -> the next launch's ranks training."""
    with tempfile.TemporaryDirectory() as d:
        job = Job(d, ["-np", str(n), "--min-np", "1", "--max-np", str(n), "--local", str(n)],
                  warm)
        try:
            job.wait(lambda: len(job.commits()) >= 3, "commits")
            t_kill = time.time()
            os.kill(job.task_pid(n - 1), signal.SIGKILL)
            job.wait(lambda: len(job.starts()) >= 2, "the next launch")
            t_start = job.starts()[1][0]
            t_reset = job.wait(lambda: job.driver_line(r"hvd-driver: reset 1:", t_kill), "reset")
            return {"total": t_start - t_kill, "stop": t_reset - t_kill,
                    "relaunch": t_start - t_reset, "size": job.starts()[1][1]}
        finally:
            job.end()


def grow(n, warm):
    """A host added to the discovery script -> the launch with it training."""
    with tempfile.TemporaryDirectory() as d:
        hosts = os.path.join(d, "hosts")
        names = ["elbench%d" % i for i in range(n)]
        with open(hosts, "w") as f:
            f.write("".join(h + ":1\n" for h in names[:-1]))
        job = Job(d, ["-np", str(n - 1), "--min-np", "1", "--max-np", str(n), "--local", "1",
                      "--host-discovery-script", "cat " + hosts], warm)
        try:
            job.wait(lambda: len(job.commits()) >= 3 and job.starts()[-1][1] == n - 1,
                     "commits of the first launch")
            with open(hosts + ".new", "w") as f:
                f.write("".join(h + ":1\n" for h in names))
            t_add = time.time()
            os.rename(hosts + ".new", hosts)
            job.wait(lambda: any(s[1] == n for s in job.starts()), "the launch with it")
            t_start = [s[0] for s in job.starts() if s[1] == n][0]
            t_told = job.driver_line(r"the hosts changed", t_add) or t_add
            t_commit = max(c for c in job.commits() if c <= t_start)
            return {"total": t_start - t_add, "discovery": t_told - t_add,
                    "commit": max(0.0, t_commit - t_told), "relaunch": t_start - t_commit,
                    "size": n}
        finally:
            job.end()


def summary(runs, key):
    """"median (min-max)" of key over runs; "-" where it was not measured."""
    v = sorted(r[key] for r in runs if key in r)
    if not v:
        return "-"
    return "%.2f (%.2f-%.2f)" % (statistics.median(v), v[0], v[-1])


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "build"), type=os.path.abspath)
    ap.add_argument("--hosts", default="2,4,8")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--python", help="run examples/python/train_elastic.py with this Python")
    ap.add_argument("--start", choices=["cold", "warm", "both"], default="cold",
                    help="with --python: how new ranks start (default cold)")
    ap.add_argument("--horovod", metavar="HPYTHON", type=os.path.abspath,
                    help="with --python: also a Horovod elastic job, run by this Python (with "
                         "horovod built with Gloo and PyTorch)")
    ARGS = ap.parse_args()
    if ARGS.smoke:
        ARGS.hosts, ARGS.runs = "2", 1
    if ARGS.start != "cold" and not ARGS.python:
        ap.error("--start %s needs --python" % ARGS.start)
    if ARGS.horovod and not ARGS.python:
        ap.error("--horovod needs --python (the same PyTorch script runs both ways)")
    if ARGS.horovod and subprocess.run(["unshare", "-m", "true"]).returncode != 0:
        ap.error("--horovod needs `unshare -m` (root): the fake hosts' names are resolved by an "
                 "/etc/hosts of the job's own")
    modes = ["cold", "warm"] if ARGS.start == "both" else [ARGS.start]
    if ARGS.horovod:
        modes.append("horovod")
    os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    out = {"load_before": load, "cores": os.cpu_count(),
           "ranks": "python train_elastic.py" if ARGS.python else "train_sgd (C)"}
    for m in modes:
        out[m] = {"loss": {}, "grow": {}}
    print("load average before: %s (%d cores)" % (" ".join(load), os.cpu_count()))
    for n in [int(x) for x in ARGS.hosts.split(",")]:
        for r in range(ARGS.runs):  # the modes alternate, the order rotating run by run
            for m in modes[r % len(modes):] + modes[:r % len(modes)]:
                if m == "horovod":
                    out[m]["loss"].setdefault(n, []).append(horovod_loss(n))
                    out[m]["grow"].setdefault(n, []).append(horovod_grow(n))
                else:
                    out[m]["loss"].setdefault(n, []).append(loss(n, m == "warm"))
                    out[m]["grow"].setdefault(n, []).append(grow(n, m == "warm"))
    print("| %shosts | loss -> resumed (s) | of which: stop | relaunch | new host -> training (s) "
          "| of which: discovery | commit | relaunch |" % ("ranks start | " if ARGS.python else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if ARGS.python else ""))
    for m in modes:
        for n in out[m]["loss"]:
            l, g = out[m]["loss"][n], out[m]["grow"][n]
            print("| %s%d | %s | %s | %s | %s | %s | %s | %s |" % (
                m + " | " if ARGS.python else "", n, summary(l, "total"), summary(l, "stop"),
                summary(l, "relaunch"), summary(g, "total"), summary(g, "discovery"),
                summary(g, "commit"), summary(g, "relaunch")))
    with open("/proc/loadavg") as f:
        out["load_after"] = f.read().split()[:3]
    print("load average after: %s" % " ".join(out["load_after"]))
    if not ARGS.smoke:
        name = "elastic-bench-python.json" if ARGS.python else "elastic-bench.json"
        with open(os.path.join(ARGS.build, name), "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
