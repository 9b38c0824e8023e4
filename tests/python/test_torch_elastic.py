#!/usr/bin/env python3
"""hvd_bridge.torch.elastic on real elastic jobs (label python, torch, elastic):

  api        TorchState and @hvd.elastic.run outside an elastic job (one process): commit()
             saves, restore() goes back to the last commit, sync() and check_host_updates()
             work, the function runs once
  kill       examples/python/train_elastic.py under `hvd-driver run -np 4 --min-np 2
             --max-np 4 --local 2`: both task services of one fake host SIGKILLed mid-run;
             the job goes on with 2 ranks from the last commit (the reset callbacks run) and
             its final model equals an undisturbed 4-rank run's
  grow       the same with a discovery script that adds a host mid-run: 2 ranks, then 4 at
             the next commit, the same final model

The cases wait on the script's commit log, never on sleeps. Exits 77 when torch,
scikit-learn or mpirun is missing, or under a sanitizer.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import hvdtest  # noqa: E402
from hvdtest import Failure, check  # noqa: E402

ARGS = None
SCRIPT = os.path.join(REPO, "examples", "python", "train_elastic.py")
JOB_LIMIT = 240  # seconds: a Python rank imports torch at every launch


def driver_cmd(*args):
    return [os.path.join(ARGS.pythonpath, "hvd_bridge", "bin", "hvd-driver"), "run"] + list(args)


def script_args(d, name, sleep):
    return ["--", sys.executable, SCRIPT, "--epochs", "1", "--log", os.path.join(d, name + ".log"),
            "--out", os.path.join(d, name + ".pt"), "--sleep", str(sleep)]


def log_lines(path):
    try:
        with open(path) as f:
            return [l.split() for l in f if l.strip()]
    except OSError:
        return []


def wait_commits(path, n):
    hvdtest.wait_for(lambda: sum(1 for l in log_lines(path) if l[1] == "commit") >= n,
                     JOB_LIMIT, "%d commits in %s" % (n, path))


def load(path):
    import torch
    return torch.load(path, weights_only=True)


def same_model(a, b, tol=1e-5):
    import torch
    worst = max(float((a[k] - b[k]).abs().max() / max(1.0, float(b[k].abs().max())))
                for k in b)
    check(worst <= tol, "the model differs from the undisturbed run's by %.3g (tolerance %g)" % (
        worst, tol))


def reference(d):
    mark = uuid.uuid4().hex
    rc, out, err, _ = hvdtest.run(driver_cmd("-np", "4", "--min-np", "4", "--local", "2",
                                             "--quiet", *script_args(d, "ref", 0)),
                                  env=hvdtest.marked_env(mark), timeout=JOB_LIMIT)
    hvdtest.assert_no_leftovers(mark, 15)
    check(rc == 0, "the undisturbed run failed (%d):\n%s" % (rc, err[-3000:]))
    return load(os.path.join(d, "ref.pt"))


class Job:
    def __init__(self, d, name, args, sleep=0.05):
        self.mark = uuid.uuid4().hex
        self.log = os.path.join(d, name + ".log")
        self.out = os.path.join(d, name + ".pt")
        self.err = open(os.path.join(d, name + ".err"), "w+b")
        self.proc = subprocess.Popen(driver_cmd(*args, "--quiet", *script_args(d, name, sleep)),
                                     env=hvdtest.marked_env(self.mark), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.err)

    def finish(self):
        try:
            rc = self.proc.wait(timeout=JOB_LIMIT)
        except subprocess.TimeoutExpired:
            raise Failure("hvd-driver still ran after %d s" % JOB_LIMIT)
        self.err.seek(0)
        return rc, self.err.read().decode(errors="replace")

    def close(self):
        if self.proc.poll() is None:
            hvdtest.stop(self.proc, 10, signal.SIGTERM)
        self.err.close()
        hvdtest.assert_no_leftovers(self.mark, 15)


def test_api():
    """The state's methods in one process, outside an elastic job."""
    code = r"""
import torch, hvd_bridge.torch as hvd
hvd.init()
m = torch.nn.Linear(2, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                               named_parameters=m.named_parameters())
s = hvd.elastic.TorchState(model=m, optimizer=opt, epoch=3)
calls = []
s.register_reset_callbacks([lambda: calls.append(1)])
w0 = m.weight.detach().clone()
s.commit()
with torch.no_grad():
    m.weight.add_(1.0)
s.epoch = 7
s.restore()
assert torch.equal(m.weight, w0) and s.epoch == 3, "restore() goes back to the commit"
s.sync()
s.check_host_updates()
ran = []
@hvd.elastic.run
def train(state, k):
    ran.append(k)
    return state.epoch
assert train(s, 5) == 3 and ran == [5] and calls == [], (ran, calls)
print("api ok")
"""
    rc, out, err, _ = hvdtest.run([sys.executable, "-c", code], env=hvdtest.marked_env(None),
                                  timeout=120)
    check(rc == 0 and "api ok" in out, "(%d)\n%s\n%s" % (rc, out, err[-3000:]))


def test_kill():
    with tempfile.TemporaryDirectory() as d:
        ref = reference(d)
        job = Job(d, "kill", ["-np", "4", "--min-np", "2", "--max-np", "4", "--local", "2"])
        try:
            wait_commits(job.log, 2)
            victims = [pid for pid, p in hvdtest.processes_with(job.mark).items()
                       if os.path.basename(p.argv[0]) == "hvd-task" and
                       p.argv[p.argv.index("--index") + 1] in ("2", "3")]
            victims = [p for p in victims if hvdtest.parent_of(p) not in victims]
            check(len(victims) == 2, "the second host's two task services: %s" % victims)
            hvdtest.kill(victims)
            rc, err = job.finish()
            check(rc == 0, "the job failed (%d):\n%s" % (rc, err[-4000:]))
            check("reset 1:" in err and "now 2 ranks" in err, "one reset to 2 ranks:\n%s" %
                  err[-3000:])
            lines = log_lines(job.log)
            starts = [l for l in lines if l[1] == "start"]
            check([l[2] for l in starts] == ["size=4", "size=2"] and starts[1][3] != "commit=0",
                  "4 ranks, then 2 from a commit: %s" % starts)
            check(any(l[1] == "reset" for l in lines), "the reset callbacks ran: %s" % lines)
            same_model(load(job.out), ref)
        finally:
            job.close()


def test_grow():
    with tempfile.TemporaryDirectory() as d:
        ref = reference(d)
        hosts = os.path.join(d, "hosts")
        with open(hosts, "w") as f:
            f.write("elpyA:2\n")
        job = Job(d, "grow", ["--min-np", "2", "--max-np", "4", "--local", "1",
                              "--host-discovery-script", "cat " + hosts])
        try:
            wait_commits(job.log, 2)
            with open(hosts + ".new", "w") as f:
                f.write("elpyA:2\nelpyB:2\n")
            os.rename(hosts + ".new", hosts)
            rc, err = job.finish()
            check(rc == 0, "the job failed (%d):\n%s" % (rc, err[-4000:]))
            check("came: elpyB" in err and "now 4 ranks" in err, "one reset adding elpyB:\n%s" %
                  err[-3000:])
            starts = [l[2] for l in log_lines(job.log) if l[1] == "start"]
            check(starts == ["size=2", "size=4"], "2 ranks, then 4: %s" % starts)
            same_model(load(job.out), ref)
        finally:
            job.close()


def main():
    global ARGS
    ARGS = hvdtest.package_test_args(modules=("sklearn", "torch"))
    os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="hvd-torch-elastic.")
    try:
        return hvdtest.run_cases(hvdtest.cases_in(globals()), ARGS.cases)
    finally:
        import shutil
        shutil.rmtree(os.environ["TMPDIR"], ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
