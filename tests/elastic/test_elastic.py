#!/usr/bin/env python3
"""Elastic jobs end to end: real mpirun, real task services, real SIGKILLs.

    test_elastic.py --bin DIR --train-lib LIB [CASE...]

Every job is `hvd-driver run --min-np ... --local ...` training the elastic SGD example
(examples/train_sgd: hvd_example_train_sgd_elastic), which commits every 4 steps and whose rank
0 appends "start ..." and "commit ..." lines to a log file; the cases wait on those lines (no
sleeps stand for assertions). The final weights are compared with an undisturbed run over the
same samples: every step's global batch is the same whatever the number of ranks, so they
agree up to floating-point summation order. Every process carries HVD_E2E_MARK=<random>, and
after each case /proc is scanned: nothing of the job may be left, whatever happened.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import hvdtest  # noqa: E402
from hvdtest import check  # noqa: E402

ARGS = None
TOL = 1e-9        # weights after a kill and a grow vs an undisturbed run (relative)
JOB_LIMIT = 90    # seconds a job may take here (a loaded 2-core machine)
# Under ASan, the ranks (the example's MPI inside hvd-exec) leave leak checking to the
# runtime's own tests: Open MPI's unloaded plugins cannot be told apart (as in
# tests/runtime/run_train_sgd.sh). The driver and the task services keep theirs.
RANK_ASAN = ["--mpi-arg", "-x", "--mpi-arg",
             "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1"]


def sgd_arg(log, epochs=6, sleep=30, **extra):
    """The training example's --entry-arg. sleep: ms per step, so that a kill or a grow at an
    early commit lands in the middle of training (96 steps at 6 epochs: about 3 s; with 15 ms,
    since 4 ranks on 2 CPUs yield instead of polling, the first launch could end before a kill
    at commit 3 took effect: once in CI)."""
    kv = dict(epochs=epochs, commit=4, sleep=sleep, log=log, **extra)
    return ",".join("%s=%s" % (k, v) for k, v in kv.items())


class Job:
    """One hvd-driver run in a directory of its own, its processes marked."""

    def __init__(self, d, args, entry_arg, mark=None):
        self.dir = d
        self.mark = mark or uuid.uuid4().hex
        self.log = os.path.join(d, "train.log")
        self.results = os.path.join(d, "results.json")
        self.err = open(os.path.join(d, "driver.err"), "w+b")
        cmd = ["run", "--results-json", self.results] + list(args) + RANK_ASAN + [
            "--entry", ARGS.train_lib + ":hvd_example_train_sgd_elastic",
            "--entry-arg", entry_arg]
        self.t0 = time.time()
        self.proc = hvdtest.start_driver(ARGS.bin, cmd, hvdtest.marked_env(self.mark, ARGS.bin),
                                         d, stdout=subprocess.DEVNULL, stderr=self.err)

    def lines(self):
        try:
            with open(self.log) as f:
                return [l.split() for l in f if l.strip()]
        except OSError:
            return []

    def commits(self, before=None):
        """Commit ids written so far (with before: only those logged before that time)."""
        return [int(l[2][3:]) for l in self.lines()
                if len(l) > 2 and l[1] == "commit" and (before is None or float(l[0]) < before)]

    def starts(self):
        """(time, size, commit) of every launch's start."""
        out = []
        for l in self.lines():
            if l[1] == "start":
                kv = dict(w.split("=") for w in l[2:])
                out.append((float(l[0]), int(kv["size"]), int(kv["commit"])))
        return out

    def wait_commit(self, n, what):
        try:
            hvdtest.wait_for(lambda: any(c >= n for c in self.commits()) or self.proc.poll() is not None,
                             JOB_LIMIT, "%s (commit %d in %s)" % (what, n, self.log))
        except hvdtest.Failure as e:
            raise hvdtest.Failure("%s; hvd-driver's stderr so far:\n%s" % (e, self.stderr()[-4000:]))
        if not any(c >= n for c in self.commits()):
            raise hvdtest.Failure("hvd-driver exited %d before %s (commit %d):\n%s" % (
                self.proc.returncode, what, n, self.stderr()[-4000:]))

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def finish(self):
        """Waits for hvd-driver; returns (status, its stderr)."""
        try:
            rc = self.proc.wait(timeout=JOB_LIMIT)
        except subprocess.TimeoutExpired:
            hvdtest.stop(self.proc, 5, signal.SIGTERM)
            raise hvdtest.Failure("hvd-driver still ran after %d s:\n%s" % (JOB_LIMIT,
                                                                             self.stderr()[-3000:]))
        return rc, self.stderr()

    def weights(self):
        with open(self.results) as f:
            res = json.load(f)
        text = res["ranks"][0]["result_text"]
        return [float(w) for w in text.split()[:-1]], res

    def task_pids(self, indices):
        """The hvd-task processes of these indices (not their keepers: hvd-keeper, or with
        HVD_KEEPER=none forks that keep the argv, children of an hvd-task)."""
        found = [pid for pid, p in hvdtest.processes_with(self.mark).items()
                 if os.path.basename(p.argv[0]) == "hvd-task" and "--index" in p.argv and
                 int(p.argv[p.argv.index("--index") + 1]) in indices]
        return [pid for pid in found if hvdtest.parent_of(pid) not in found]

    def close(self):
        if self.proc.poll() is None:
            hvdtest.stop(self.proc, 10, signal.SIGTERM)
        self.err.close()
        hvdtest.assert_no_leftovers(self.mark)


def reference(d, epochs=6):
    """The weights of an undisturbed 4-rank run over the same samples."""
    job = Job(d, ["-np", "4", "--min-np", "4", "--local", "2"],
              sgd_arg(os.path.join(d, "ref.log"), epochs=epochs, sleep=0))
    try:
        rc, err = job.finish()
        check(rc == 0, "the undisturbed run failed (%d):\n%s" % (rc, err[-3000:]))
        return job.weights()[0]
    finally:
        job.close()


def same_weights(got, ref):
    worst = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(got, ref))
    check(len(got) == len(ref) and worst <= TOL,
          "weights differ from the undisturbed run by %.3g (tolerance %g):\n%s\n%s" % (
              worst, TOL, got, ref))


# ---- cases ----------------------------------------------------------------------------------

def test_kill_host():
    """SIGKILL both task services of one fake host (and with them its orted and ranks) in the
    middle of training, --min-np 2 --max-np 4: the job goes on with the other host's ranks from
    the last commit, ends with the weights of an undisturbed run, and the lost host's ranks
    are not blamed."""
    with tempfile.TemporaryDirectory() as d:
        ref = reference(d)
        job = Job(d, ["-np", "4", "--min-np", "2", "--max-np", "4", "--local", "2"],
                  sgd_arg(os.path.join(d, "train.log")))
        try:
            job.wait_commit(3, "the first launch committing")
            victims = job.task_pids({2, 3})
            check(len(victims) == 2, "the two task services of the second host: %s" % victims)
            killed_at = time.time()
            hvdtest.kill(victims)
            rc, err = job.finish()
            check(rc == 0, "the job failed after losing a host (%d):\n%s" % (rc, err[-4000:]))
            resets = hvdtest.reset_lines(err)
            later = [" ".join(l) for l in job.lines() if float(l[0]) >= killed_at]
            check(len(resets) == 1 and "went away" in resets[0] and "now 2 ranks" in resets[0],
                  "one reset line naming the lost task and the new size: %s\n(killed %s at %.3f; "
                  "the training log from then: %s)\n%s" % (resets, victims, killed_at, later[:12], err[-3000:]))
            check(re.search(r"resuming from commit \d+", resets[0]),
                  "the reset names the commit it resumes from: %s" % resets[0])
            check("job failed" not in err and "blacklisted" not in err,
                  "the lost host is not blamed:\n%s" % err[-3000:])
            starts = job.starts()
            check([s[1] for s in starts] == [4, 2] and starts[1][2] >= 3,
                  "4 ranks, then 2 from commit >= 3: %s" % starts)
            got, res = job.weights()
            check(len(res["ranks"]) == 2, "the last launch's 2 ranks report: %s" % res["ranks"])
            same_weights(got, ref)
        finally:
            job.close()


def test_kill_one_task_of_host():
    """SIGKILL one of the two task services of a fake host: the host stays with one slot, and
    the reset line says so (it said only "hosts left: none; came: none")."""
    with tempfile.TemporaryDirectory() as d:
        job = Job(d, ["-np", "4", "--min-np", "2", "--max-np", "4", "--local", "2"],
                  sgd_arg(os.path.join(d, "train.log")))
        try:
            job.wait_commit(2, "the first launch committing")
            victims = job.task_pids({3})
            check(len(victims) == 1, "task 3's service: %s" % victims)
            hvdtest.kill(victims)
            rc, err = job.finish()
            check(rc == 0, "the job failed after losing a task (%d):\n%s" % (rc, err[-4000:]))
            resets = hvdtest.reset_lines(err)
            check(len(resets) == 1 and "hosts left: none; came: none; slots changed: " in resets[0]
                  and re.search(r"slots changed: \S+ 2 -> 1; now 3 ranks", resets[0]),
                  "one reset naming the host that lost a slot: %s\n%s" % (resets, err[-3000:]))
            check([s[1] for s in job.starts()] == [4, 3], "sizes: %s" % job.starts())
        finally:
            job.close()


def test_grow():
    """A discovery script that adds a host mid-run: the job grows to it at the next commit
    (the ranks end with status 75, the driver relaunches over both hosts) and ends with the
    weights of an undisturbed run. With --output-filename each launch's ranks write their
    output in a directory of the launch's own: the relaunch overwrites nothing."""
    with tempfile.TemporaryDirectory() as d:
        ref = reference(d)
        hosts = os.path.join(d, "hosts")
        with open(hosts, "w") as f:
            f.write("elgrowA:2\n")
        job = Job(d, ["--min-np", "2", "--max-np", "4", "--local", "1",
                      "--host-discovery-script", "cat " + hosts, "--output-filename", "out"],
                  sgd_arg(os.path.join(d, "train.log")))
        try:
            job.wait_commit(2, "the first launch committing")
            with open(hosts + ".new", "w") as f:
                f.write("elgrowA:2\nelgrowB:2\n")
            os.rename(hosts + ".new", hosts)
            rc, err = job.finish()
            check(rc == 0, "the job failed (%d):\n%s" % (rc, err[-4000:]))
            resets = hvdtest.reset_lines(err)
            check(len(resets) == 1 and "came: elgrowB" in resets[0] and "now 4 ranks" in resets[0],
                  "one reset that adds elgrowB: %s\n(the driver's stderr, end:)\n%s" % (resets, err[-4000:]))
            starts = job.starts()
            check([s[1] for s in starts] == [2, 4], "2 ranks, then 4: %s" % starts)
            # The grow happens at a commit: the new launch starts from the last one the first
            # launch made, none lost.
            before = job.commits(before=starts[1][0])
            check(before and starts[1][2] == max(before),
                  "resumed from the last commit before the relaunch: %s %s" % (starts, before))
            got, res = job.weights()
            check(len(res["ranks"]) == 4, "4 ranks report: %s" % res["ranks"])
            same_weights(got, ref)
            for launch, ranks in ((1, 2), (2, 4)):
                where = os.path.join(d, "out", "launch.%d" % launch, "1")
                found = sorted(os.listdir(where)) if os.path.isdir(where) else []
                check(found == ["rank.%d" % r for r in range(ranks)],
                      "launch %d's output in %s: %s" % (launch, where, found))
        finally:
            job.close()


def write_hosts(path, text):
    with open(path + ".new", "w") as f:
        f.write(text)
    os.rename(path + ".new", path)


def test_discovery_below_min():
    """The discovery script drops a host below --min-np while the job trains. Back within
    --elastic-timeout: the job waits, resumes over both hosts from the last commit and ends with
    the weights of an undisturbed run. Gone for good: one clear line once the timeout is over,
    a non-zero exit, nothing left running."""
    with tempfile.TemporaryDirectory() as d:
        ref = reference(d)
        for back in (True, False):
            sub = os.path.join(d, "back" if back else "gone")
            os.mkdir(sub)
            hosts = os.path.join(sub, "hosts")
            write_hosts(hosts, "elminA:2\nelminB:2\n")
            timeout = 60 if back else 3
            job = Job(sub, ["--min-np", "4", "--max-np", "4", "--local", "1",
                            "--host-discovery-script", "cat " + hosts,
                            "--elastic-timeout", str(timeout)],
                      sgd_arg(os.path.join(sub, "train.log")))
            try:
                job.wait_commit(2, "the first launch committing")
                write_hosts(hosts, "elminA:2\n")
                t_drop = time.time()
                waiting = "waiting for hosts: 2 slot(s) usable, 4 needed"
                if back:
                    hvdtest.wait_for(lambda: waiting in job.stderr() or job.proc.poll() is not None,
                                     JOB_LIMIT, "the driver waiting for hosts after elminB left")
                    write_hosts(hosts, "elminA:2\nelminB:2\n")
                rc, err = job.finish()
                took = time.time() - t_drop
                if back:
                    check(rc == 0, "the job failed (%d):\n%s" % (rc, err[-4000:]))
                    check(waiting in err, "the driver said it waits for hosts:\n%s" % err[-3000:])
                    starts = job.starts()
                    check(len(starts) >= 2 and all(s[1] == 4 for s in starts),
                          "every launch had 4 ranks (none below --min-np): %s" % starts)
                    same_weights(job.weights()[0], ref)
                else:
                    check(rc != 0 and waiting in err, "the job must fail after waiting:\n%s" % err[-3000:])
                    last = [l for l in err.splitlines() if l.startswith("hvd-driver:")][-1]
                    check("only 2 slot(s) were usable for 3 s, and 4 are needed" in last,
                          "the last line says why: %s" % last)
                    check(3 <= took < 30, "failed %.1f s after the drop (3 s timeout)" % took)
            finally:
                job.close()


def test_blacklist():
    """A host whose ranks fail is blacklisted for its cool-down: the job goes on without it and
    never uses it again within the cool-down."""
    with tempfile.TemporaryDirectory() as d:
        hosts = os.path.join(d, "hosts")
        with open(hosts, "w") as f:
            f.write("elblA:1\nelblBad:1\nelblC:1\n")
        job = Job(d, ["--min-np", "2", "--max-np", "2", "--local", "1",
                      "--host-discovery-script", "cat " + hosts,
                      "--blacklist-cooldown-range", "60", "120"],
                  sgd_arg(os.path.join(d, "train.log"), epochs=2, sleep=0, fail_host="elblBad"))
        try:
            rc, err = job.finish()
            check(rc == 0, "the job failed (%d):\n%s" % (rc, err[-4000:]))
            resets = hvdtest.reset_lines(err)
            check(len(resets) == 1, "one reset: %s" % resets)
            check(re.search(r"on host elblBad\) failed with status 3.*host elblBad blacklisted "
                            r"for \d+ s", resets[0]), "the reset blames elblBad: %s" % resets[0])
            secs = int(re.search(r"blacklisted for (\d+) s", resets[0]).group(1))
            check(60 <= secs <= 120, "a cool-down within the range: %d" % secs)
            check("came: elblC" in resets[0] and "now 2 ranks on elblA:1,elblC:1" in resets[0],
                  "the next launch uses elblA and elblC: %s" % resets[0])
            _, res = job.weights()
            check(sorted(r["host_hash"] for r in res["ranks"]) == ["elblA", "elblC"],
                  "elblBad is not used again: %s" % res["ranks"])
            check(time.time() - job.t0 < secs, "the job ended within the cool-down")
        finally:
            job.close()


def test_reset_limit():
    """Rank 1 fails at every launch: each reset blacklists its host; the second reset is more
    than --reset-limit 1: one clear line, a non-zero exit, nothing left running."""
    with tempfile.TemporaryDirectory() as d:
        hosts = os.path.join(d, "hosts")
        with open(hosts, "w") as f:
            f.write("elrl0:1\nelrl1:1\nelrl2:1\nelrl3:1\n")
        job = Job(d, ["--min-np", "2", "--max-np", "2", "--local", "1", "--reset-limit", "1",
                      "--host-discovery-script", "cat " + hosts],
                  sgd_arg(os.path.join(d, "train.log"), epochs=2, sleep=0, fail_rank=1))
        try:
            rc, err = job.finish()
            check(rc != 0, "the job must fail:\n%s" % err[-3000:])
            last = [l for l in err.splitlines() if l.startswith("hvd-driver:")][-1]
            check("reset 2 times, more than --reset-limit 1 allows" in last,
                  "the last line says why: %s" % last)
            check(len(hvdtest.reset_lines(err)) == 1, "one reset ran: %s" % hvdtest.reset_lines(err))
        finally:
            job.close()


def test_elastic_timeout():
    """Fewer than --min-np slots for longer than --elastic-timeout: one clear line, a non-zero
    exit, nothing left running."""
    with tempfile.TemporaryDirectory() as d:
        job = Job(d, ["-np", "2", "--min-np", "2", "--local", "2", "--elastic-timeout", "3"],
                  sgd_arg(os.path.join(d, "train.log"), epochs=40, sleep=20))
        try:
            job.wait_commit(2, "the first launch committing")
            hvdtest.kill(job.task_pids({1}))
            t_kill = time.time()
            rc, err = job.finish()
            took = time.time() - t_kill
            check(rc != 0, "the job must fail:\n%s" % err[-3000:])
            last = [l for l in err.splitlines() if l.startswith("hvd-driver:")][-1]
            check("only 1 slot(s) were usable for 3 s, and 2 are needed" in last and
                  "min_np 2 within the elastic timeout, 3 s" in last,
                  "the last line says why: %s" % last)
            check(3 <= took < 30, "failed %.1f s after the loss (3 s timeout)" % took)
        finally:
            job.close()


def test_registered_tasks():
    """Task services that register themselves (as Spark executors do): a task that registers
    mid-run is a host coming (the job grows at the next commit), a task killed is a host
    going (the job goes on without it); the weights are an undisturbed run's."""
    with tempfile.TemporaryDirectory() as d:
        ref = reference(d, epochs=8)
        job = Job(d, ["-np", "2", "--min-np", "2", "--max-np", "3", "--start-timeout", "60"],
                  sgd_arg(os.path.join(d, "train.log"), epochs=8))
        tasks = []
        try:
            env = dict(hvdtest.marked_env(job.mark, ARGS.bin),
                       **hvdtest.task_hint(job.proc, errfile=job.err))
            check("--elastic" in job.stderr(), "the hint says --elastic: %s" % job.stderr())

            def start(i, host):
                work = os.path.join(d, "task%d" % i)
                os.makedirs(work)
                tasks.append(hvdtest.start_task(ARGS.bin, i, env, host=host, cwd=work,
                                                args=["--elastic", "--min-lifetime", "0"]))
            start(0, "elregA")
            start(1, "elregB")
            job.wait_commit(2, "the first launch committing")
            start(2, "elregC")
            hvdtest.wait_for(lambda: any(s[1] == 3 for s in job.starts()), JOB_LIMIT,
                             "the job growing to the third task")
            job.wait_commit(max(job.commits()) + 1, "the grown job committing")
            hvdtest.kill([tasks[1].pid])
            rc, err = job.finish()
            check(rc == 0, "the job failed (%d):\n%s" % (rc, err[-4000:]))
            resets = hvdtest.reset_lines(err)
            check(len(resets) == 2 and "came: elregC" in resets[0] and
                  "hosts left: elregB" in resets[1] and "now 2 ranks" in resets[1],
                  "a grow to elregC, then elregB lost: %s" % resets)
            check([s[1] for s in job.starts()] == [2, 3, 2], "sizes: %s" % job.starts())
            same_weights(job.weights()[0], ref)
        finally:
            for t in tasks:
                hvdtest.stop(t, 10, signal.SIGTERM)
            job.close()


def test_commit_too_large():
    """A state over HVD_ELASTIC_STATE_MAX (60 MiB) at every commit: no reset could cure it, so
    the ranks fail instead of ending for a reset (which reset the job for ever, --reset-limit
    being unlimited by default): the job ends at its first commit with one line that gives the
    size, the limit and what to do, nothing blacklisted, nothing left running."""
    with tempfile.TemporaryDirectory() as d:
        job = Job(d, ["-np", "4", "--min-np", "2", "--max-np", "4", "--local", "2"],
                  sgd_arg(os.path.join(d, "train.log"), epochs=2, sleep=0,
                          state_bytes=80 * 1024 * 1024))
        try:
            rc, err = job.finish()
            check(rc != 0, "the job must fail:\n%s" % err[-3000:])
            check(not hvdtest.reset_lines(err) and "blacklisted" not in err,
                  "no reset, no host blamed:\n%s" % err[-4000:])
            last = [l for l in err.splitlines() if l.startswith("hvd-driver:")][-1]
            check(re.search(r"job failed: rank \d .*commit 1 failed: the state to commit is 80\.0 "
                            r"MiB \(83886080 bytes\), over the 60 MiB a task service keeps "
                            r"\(HVD_ELASTIC_STATE_MAX, fixed at build time\): commit less", last),
                  "the last line says why and what to do: %s" % last)
            check([s[1] for s in job.starts()] == [4], "one launch: %s" % job.starts())
            check(time.time() - job.t0 < 30, "the job ended at its first commit")
        finally:
            job.close()


def test_cannot_start():
    """A job whose launches end before any rank reports (mpirun refuses an argument) fails
    after 3 of them with one line, instead of resetting forever."""
    mark = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as d:
        rc, so, se, _ = hvdtest.run(
            [os.path.join(ARGS.bin, "hvd-driver"), "run", "-np", "2", "--min-np", "2", "--local",
             "2", "--mpi-arg", "--no-such-mpirun-flag", "--", "true"],
            hvdtest.marked_env(mark, ARGS.bin), cwd=d, timeout=JOB_LIMIT)
        check(rc != 0, "the job must fail:\n%s" % se[-3000:])
        last = [l for l in se.splitlines() if l.startswith("hvd-driver:")][-1]
        check("3 launches in a row ended before any rank reported" in last,
              "the last line says why: %s" % last)
    hvdtest.assert_no_leftovers(mark)


def test_launch_stalls():
    """A launch whose ranks never start (orteds whose fork agent sleeps instead of starting the
    rank: how PRRTE 3.0 stalls now and then, docs/launcher.md) is ended once the start timeout
    has passed since mpirun began, and launched again; after 3 such launches the job fails with
    one line that says why, instead of waiting forever."""
    mark = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as d:
        rc, so, se, dt = hvdtest.run(
            [os.path.join(ARGS.bin, "hvd-driver"), "run", "-np", "2", "--min-np", "2", "--local",
             "2", "--start-timeout", "2", "--mpi-args", hvdtest.stalling_fork_agent_args(d),
             "--", "true"],
            hvdtest.marked_env(mark, ARGS.bin), cwd=d, timeout=JOB_LIMIT)
        check(rc != 0, "the job must fail:\n%s" % se[-3000:])
        last = [l for l in se.splitlines() if l.startswith("hvd-driver:")][-1]
        check(re.search(r"3 launches in a row ended before any rank reported.*the last: 0 of 2 "
                        r"ranks had started 2 s after mpirun began \(the start timeout\)", last),
              "the last line says why: %s" % last)
    hvdtest.assert_no_leftovers(mark)


def test_job_timeout():
    """An elastic job that runs past --timeout is stopped, and its last line says so (not "no
    part of the job failed on its own", nor what stopping it made fail). Nothing is left."""
    mark = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as d:
        rc, so, se, dt = hvdtest.run(
            [os.path.join(ARGS.bin, "hvd-driver"), "run", "-np", "2", "--min-np", "2", "--local",
             "2", "--timeout", "3", "--", "sleep", "60"],
            hvdtest.marked_env(mark, ARGS.bin), cwd=d, timeout=JOB_LIMIT)
        check(rc != 0, "the job must fail:\n%s" % se[-3000:])
        last = [l for l in se.splitlines() if l.startswith("hvd-driver:")][-1]
        check(re.match(r"hvd-driver: job failed: the job ran past --timeout 3 s\b", last),
              "the last line names the timeout: %s" % last)
        check("Forwarding signal" not in so + se, "a line about a forwarded signal:\n" + se)
        check(dt < 60, "the job ended %.1f s after its start, timeout 3 s" % dt)
    hvdtest.assert_no_leftovers(mark)


def test_discovery_localhost():
    """A discovery script that names this machine ("localhost:2", as Horovod's local examples
    do) with --local: the job runs on 2 local task services whose host hash is localhost, '-'
    and 32 hex digits (a name mpirun would take for this machine it would start orted on
    itself, outside every task service). Nothing is left."""
    mark = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "hosts.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\necho localhost:2\n")
        os.chmod(script, 0o755)
        rc, so, se, dt = hvdtest.run(
            [os.path.join(ARGS.bin, "hvd-driver"), "run", "-np", "2", "--min-np", "1", "--local",
             "1", "--host-discovery-script", script, "--", "true"],
            hvdtest.marked_env(mark, ARGS.bin), cwd=d, timeout=JOB_LIMIT)
        check(rc == 0, "the job failed (%d):\n%s" % (rc, se[-3000:]))
        hosts = re.findall(r"^hvd-driver: \d+\s+\d+\s+(\S+)\s+0\s*$", se, re.M)
        check(len(hosts) == 2 and all(re.fullmatch(r"localhost-[0-9a-f]{32}", h) for h in hosts),
              "2 ranks on localhost-<32 hex>: %s\n%s" % (hosts, se[-3000:]))
    hvdtest.assert_no_leftovers(mark)


def test_horovodrun_flags():
    """horovodrun's command line: -H localhost:N runs local task services, --output-filename
    writes one log per rank, the command may follow the options without --, a hostfile's
    slots= or $HOROVOD_ELASTIC_TIMEOUT that is no number is refused in one line, and --mpi
    without a value is horovodrun's flag."""
    mark = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logs")
        hostfile = os.path.join(d, "hostfile")
        with open(hostfile, "w") as f:
            f.write("# Horovod's format\nlocalhost slots=2\n")
        for hosts in (["-H", "localhost:2"], ["--hostfile", hostfile]):
            rc, so, se, _ = hvdtest.run(
                [os.path.join(ARGS.bin, "hvd-driver"), "run", "-np", "2"] + hosts +
                ["--output-filename", "logs", "--network-interfaces", "lo", "sh", "-c",
                 "echo out-$OMPI_COMM_WORLD_RANK; echo err-$OMPI_COMM_WORLD_RANK >&2"],
                hvdtest.marked_env(mark, ARGS.bin), cwd=d, timeout=JOB_LIMIT)
            check(rc == 0, "%s failed (%d):\n%s\n%s" % (hosts, rc, so, se))
            for r in (0, 1):
                path = os.path.join(out, "1", "rank.%d" % r, "stdout")
                check(os.path.exists(path), "%s exists (%s)" % (path, os.listdir(out)))
                with open(path) as f:
                    check("out-%d" % r in f.read(), "rank %d's stdout in %s" % (r, path))
        # Values that are no number are refused in one line, before anything starts.
        with open(hostfile, "w") as f:
            f.write("localhost slots=two\n")
        # More ranks than -H localhost:N's slots are refused too, as for ssh hosts.
        for hosts, env, says in ((["--hostfile", hostfile], {}, "line 1: 'localhost slots=two' is not '<host> slots=<n>'"),
                                 (["-H", "localhost:2"], {"HOROVOD_ELASTIC_TIMEOUT": "10x"},
                                  "HOROVOD_ELASTIC_TIMEOUT must be a whole number"),
                                 (["-H", "localhost:1"], {}, "-np 2 is more than the 1 slots of -H localhost:1"),
                                 (["-H", "localhost:2", "-o", "StrictHostKeyChecking=no"], {},
                                  "-o is ssh's (and hvd-rsh's) option")):
            rc, so, se, _ = hvdtest.run([os.path.join(ARGS.bin, "hvd-driver"), "run", "-np", "2"] + hosts +
                                        ["true"], dict(hvdtest.marked_env(mark, ARGS.bin), **env), cwd=d,
                                        timeout=JOB_LIMIT)
            check(rc == 2 and says in se and se.count("\n") == 1, "%s %s: %d\n%s" % (hosts, env, rc, se))
        # horovodrun's flag --mpi (no value): before an option and right before the command.
        rc, so, se, _ = hvdtest.run([os.path.join(ARGS.bin, "hvd-driver"), "run", "--mpi", "-np", "2",
                                     "-H", "localhost:2", "--mpi", "sh", "-c", "echo mpi-$OMPI_COMM_WORLD_RANK"],
                                    hvdtest.marked_env(mark, ARGS.bin), cwd=d, timeout=JOB_LIMIT)
        check(rc == 0 and "mpi-0" in so and "mpi-1" in so, "--mpi as a flag: %d\n%s\n%s" % (rc, so, se))
        for word in ("openmpi6", "mvapich", "OpenMPI5"):  # not the command after a bare --mpi
            rc, so, se, _ = hvdtest.run([os.path.join(ARGS.bin, "hvd-driver"), "run", "-np", "2", "-H",
                                         "localhost:2", "--mpi", word, "true"],
                                        hvdtest.marked_env(mark, ARGS.bin), cwd=d, timeout=JOB_LIMIT)
            check(rc == 2 and "--mpi must be openmpi4, openmpi5, mpich (also Intel MPI and MVAPICH, Hydra's) or auto" in se,
                  "an MPI --mpi does not know (%s) is refused: %d\n%s" % (word, rc, se))
        # An --mpi that is not the MPI of the mpirun that would run: refused before anything
        # starts (Open MPI 5's prterun given Open MPI 4's options falls back to ssh).
        version = subprocess.run(["mpirun", "--version"], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, universal_newlines=True).stdout
        if "(Open MPI) 4." in version:
            rc, so, se, _ = hvdtest.run([os.path.join(ARGS.bin, "hvd-driver"), "run", "-np", "2", "-H",
                                         "localhost:2", "--mpi", "mpich", "true"],
                                        hvdtest.marked_env(mark, ARGS.bin), cwd=d, timeout=JOB_LIMIT)
            check(rc != 0 and re.search(r"^hvd-driver: --mpi mpich, but mpirun is Open MPI 4\.\S+: "
                                        r"give --mpirun with mpich's launcher, or --mpi openmpi4", se,
                                        re.M) and "task" not in se,
                  "--mpi mpich with Open MPI's mpirun: %d\n%s" % (rc, se))
    hvdtest.assert_no_leftovers(mark)


def test_horovodrun_tunables():
    """horovodrun's other names and tunables: --num-proc, -p and -i (ignored for this machine),
    --mpi-args split into words as a shell does, --disable-cache accepted, the flags that ask
    for what hvd-bridge does anyway ignored with a line each; --fusion-threshold-mb,
    --cycle-time-ms, --no-stall-check and --timeline-filename reach every rank as the
    HOROVOD_* variables, and the runtime of a training job writes the timeline where the
    user's relative path says. A value that is no number is refused in one line, so are the
    flags hvd-bridge cannot honour (saying why), and --min-num-proc, --max-num-proc and
    --slots-per-host are the options they alias; -v is horovodrun's --version."""
    mark = uuid.uuid4().hex
    env = hvdtest.marked_env(mark, ARGS.bin)
    driver = os.path.join(ARGS.bin, "hvd-driver")
    with tempfile.TemporaryDirectory() as d:
        common = ["run", "--num-proc", "2", "-H", "localhost:2", "-p", "2222", "-i",
                  os.path.join(d, "no-such-key"), "--disable-cache", "--fusion-threshold-mb", "3",
                  "--cycle-time-ms", "2.5", "--no-stall-check", "--timeline-filename", "tl.json"]
        rc, so, se, _ = hvdtest.run(
            [driver] + common + ["--no-autotune", "--log-level", "INFO", "--stall-check",
                                 "--mpi-args", "-x HVD_T1=one -x 'HVD_T2=two  2'", "sh", "-c",
                                 "echo vars $HOROVOD_FUSION_THRESHOLD $HOROVOD_CYCLE_TIME "
                                 "$HOROVOD_STALL_CHECK_DISABLE $HOROVOD_TIMELINE $HVD_T1 \"$HVD_T2\""],
            env, cwd=d, timeout=JOB_LIMIT)
        check(rc == 0, "the command failed (%d):\n%s\n%s" % (rc, so, se))
        want = "vars 3145728 2.5 1 %s one two  2" % os.path.join(d, "tl.json")
        check(so.count(want) == 2, "both ranks print %r:\n%s" % (want, so))
        for flag in ("--no-autotune", "--log-level", "--stall-check"):
            check(se.count("horovodrun's %s is ignored: " % flag) == 1, "%s said ignored once:\n%s"
                  % (flag, se))
        rc, so, se, _ = hvdtest.run([driver, "run", "-v"], env, cwd=d, timeout=JOB_LIMIT)
        check(rc == 0 and so.startswith("hvd-driver (hvd-bridge) ") and not se,
              "-v prints the version (%d):\n%s%s" % (rc, so, se))
        rc, so, se, _ = hvdtest.run(
            [driver] + common + RANK_ASAN + ["--entry", ARGS.train_lib + ":hvd_example_train_sgd",
                                             "--entry-arg", "epochs=2"],
            env, cwd=d, timeout=JOB_LIMIT)
        check(rc == 0, "the training job failed (%d):\n%s\n%s" % (rc, so, se))
        with open(os.path.join(d, "tl.json"), encoding="utf-8") as f:
            events = json.load(f)
        names = {e.get("name") for e in events}
        check("ALLREDUCE" in names and "NEGOTIATE_ALLREDUCE" in names,
              "the timeline shows allreduces: %s" % sorted(map(str, names))[:20])
        for args, says in ((["--cycle-time-ms", "1x"], "--cycle-time-ms must be a number"),
                           (["--fusion-threshold-mb", "-1"], "--fusion-threshold-mb must be"),
                           (["--min-num-proc", "3", "--max-num-proc", "2"],
                            "--max-np must be at least --min-np"),
                           (["--slots-per-host", "2"], "--max-np, --slots and --reset-limit go"),
                           (["--gloo"], "horovodrun's --gloo is not supported: hvd-bridge runs"),
                           (["--timeline", "t"], "option --timeline is ambiguous: --timeline-filename, "
                                                 "--timeline-mark-cycles"),
                           (["-cb"], "horovodrun's -cb is not supported: hvd-bridge has one build"),
                           (["--mpi-args", "-x 'A=b"], "--mpi-args '-x 'A=b' has an unclosed ' quote")):
            rc, so, se, _ = hvdtest.run([driver, "run", "-np", "2", "--local", "1"] + args + ["true"],
                                        env, cwd=d, timeout=JOB_LIMIT)
            check(rc == 2 and says in se and se.count("\n") == 1, "%s: %d\n%s" % (args, rc, se))
    hvdtest.assert_no_leftovers(mark)


CASES = hvdtest.cases_in(globals())


def main():
    global ARGS
    ap = hvdtest.arg_parser("--bin", "--train-lib")
    ap.add_argument("cases", nargs="*")
    ARGS = ap.parse_args()
    return hvdtest.run_cases(CASES, ARGS.cases)


if __name__ == "__main__":
    sys.exit(main())
