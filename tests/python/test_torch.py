#!/usr/bin/env python3
"""hvd_bridge.torch with real torch, on real jobs (hvd_bridge.run: task services, mpirun,
hvd-rsh, hvd-exec; label python, torch):

  collectives_1/2/4  every collective and every dtype against references computed here, on
                     1, 2 and 4 ranks; async handles, poll and synchronize; grouped ops;
                     in place and non-contiguous tensors; prescale/postscale; objects;
                     barrier and join (all at once); gradients of allreduce and allgather;
                     a collective before init(), a list for a tensor and a name that is no
                     str: errors that say so
  mismatch           rank 1 sends another shape under the same name: every rank gets a
                     HorovodInternalError saying so, from allreduce and from
                     DistributedOptimizer.step(), and the runtime keeps working
  failure_blame      rank 1 raises while rank 0 waits in an allreduce (which then fails because
                     rank 1's runtime shut down): the JobError names rank 1, three times
  failure_blame_program  the same for a program under hvd-driver (horovodrun's way): the
                     driver's last line names rank 1
  training_parity    an MLP on scikit-learn's bundled digits with DistributedOptimizer on 1,
                     2 and 4 ranks at the same global batch: the final parameters are equal
                     within float tolerance, and the test accuracy is at least 0.95
  optimizer_backward_passes, optimizer_fp16, optimizer_sum, optimizer_predivide
                     DistributedOptimizer with backward_passes_per_step=2, Compression.fp16,
                     op=Sum and gradient_predivide_factor=2.0 on 2 ranks: the weights of a
                     Linear(4, 1) after 2 steps equal plain SGD on the reduced gradients
                     computed here (fp16: within its tolerance)
  horovod_parity_1/2 behaviours of horovod.torch that are easy to miss, on 1 and 2 ranks: an LR
                     scheduler made before DistributedOptimizer, a param group added after it,
                     synchronize() on one rank, groups holding a foreign tensor, a second
                     backward with groups (AssertionError), sparse_as_dense with SparseAdam,
                     grouped results as tuples, grouped allgather/reducescatter gradients,
                     TorchState with a GAN's two models and optimizers and a LambdaLR, and a
                     State subclass with Horovod's constructor and reset()
  timeline           HOROVOD_TIMELINE given through hvd_bridge.run(env=...): rank 0 writes a
                     timeline with each named tensor's collective
  horovod_script     examples/python/train_digits.py, a Horovod training script but for
                     its import line, runs as a program under hvd-driver (as under
                     horovodrun) and learns
  join_uneven        ranks with 1, 3 and 5 batches train with DistributedOptimizer and join:
                     the joined ranks stand in with zeros, join returns the last rank, and the
                     weights equal SGD on the averages computed here
  no_shutdown        a function that calls init() and never shutdown(), as Horovod programs
                     do: the job succeeds (the runtime shuts down at the rank's exit)
  no_shutdown_warm   the same in ranks forked from a warm interpreter (HVD_WARM_PYTHON)
  gpu                the CUDA tensor path (NCCL): skipped without a GPU

Exits 77 when torch, scikit-learn, cloudpickle or mpirun is missing, or under a sanitizer.
"""
import os
import re
import sys
import tempfile
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, HERE)
import hvdtest  # noqa: E402
from hvdtest import Failure, Skip, check  # noqa: E402

ARGS = None


def job(fn, np_, *args, _env=None, **kwargs):
    """Runs fn on np_ ranks (with _env for them) and a process mark; nothing of the job may be
    left."""
    import hvd_bridge
    mark = uuid.uuid4().hex
    os.environ[hvdtest.MARK_VAR] = mark
    try:
        return hvd_bridge.run(fn, args=args, kwargs=kwargs, np=np_, env=_env, stdout=sys.stdout,
                              stderr=sys.stderr)
    except hvd_bridge.JobError as e:
        raise Failure("the job failed: %s" % e) from e
    finally:
        os.environ.pop(hvdtest.MARK_VAR, None)
        hvdtest.assert_no_leftovers(mark, 15)


def collectives_on(n, device="cpu"):
    import torch_cases
    failures = job(torch_cases.collectives, n, device)
    bad = [f for per_rank in failures for f in per_rank]
    check(not bad, "%d ranks:\n  %s" % (n, "\n  ".join(bad[:30])))


def test_collectives_1():
    collectives_on(1)


def test_collectives_2():
    collectives_on(2)


def test_collectives_4():
    collectives_on(4)


def test_mismatch():
    import torch_cases
    out = job(torch_cases.mismatch, 3)
    for r, (err, opt_err, ok) in enumerate(out):
        check(err.startswith("HorovodInternalError") and "mismatched" in err and
              ("shape" in err or "count" in err or "element" in err),
              "rank %d: %s" % (r, err))
        want = ["bias gradient %s" % float(len(out) + 1)]
        for step in range(2):
            got = opt_err[2 * step:2 * step + 2]
            check(len(got) == 2 and got[0].startswith("HorovodInternalError") and
                  "allreduce.weight" in got[0] and got[1:] == want,
                  "rank %d, DistributedOptimizer.step() %d: %s (want the error on the weight, "
                  "then %s)" % (r, step + 1, got, want[0]))
        check(ok, "rank %d: the runtime works after the failed collective" % r)


def test_failure_blame():
    import hvd_bridge
    import torch_cases
    for attempt in range(3):  # the order of the two ranks' reports is a race: try it again
        mark = uuid.uuid4().hex
        os.environ[hvdtest.MARK_VAR] = mark
        try:
            hvd_bridge.run(torch_cases.raises_in_collectives, np=2, stdout=sys.stdout,
                           stderr=sys.stderr)
            raise Failure("the job succeeded although rank 1 raised")
        except hvd_bridge.JobError as e:
            check(e.rank == 1 and "ValueError: rank 1 gives up at step 3" in str(e),
                  "attempt %d: the job's error names rank 1, whose failure stopped rank 0's "
                  "allreduce: %s" % (attempt + 1, e))
        finally:
            os.environ.pop(hvdtest.MARK_VAR, None)
            hvdtest.assert_no_leftovers(mark, 15)


def test_training_parity():
    import torch
    import torch_cases
    runs = {n: job(torch_cases.train_digits, n) for n in (1, 2, 4)}
    base_params, base_acc = runs[1][0]
    check(base_acc >= 0.95, "1 rank: test accuracy %.3f < 0.95" % base_acc)
    for n in (2, 4):
        for r, (params, acc) in enumerate(runs[n]):
            check(acc >= 0.95, "%d ranks, rank %d: accuracy %.3f" % (n, r, acc))
            for i, (p, q) in enumerate(zip(params, base_params)):
                a, b = torch.tensor(p), torch.tensor(q)
                check(torch.allclose(a, b, rtol=1e-7, atol=1e-9),
                      "%d ranks, rank %d: parameter %d differs from 1 rank by %.3g" %
                      (n, r, i, (a - b).abs().max().item()))


def test_join_uneven():
    import torch_cases
    out = job(torch_cases.uneven_join, 3)
    for r, (bad, last) in enumerate(out):
        check(not bad, "\n  ".join(bad))
        check(last == 2, "rank %d: join returned %r, want 2 (the rank with the most batches)" %
              (r, last))


def optimizer_option_on_2(option):
    import torch_cases
    bad = [f for per_rank in job(torch_cases.optimizer_option, 2, option) for f in per_rank]
    check(not bad, "\n  ".join(bad))


def test_optimizer_backward_passes():
    optimizer_option_on_2("backward_passes")


def test_optimizer_fp16():
    optimizer_option_on_2("fp16")


def test_optimizer_sum():
    optimizer_option_on_2("sum")


def test_optimizer_predivide():
    optimizer_option_on_2("predivide")


def parity_on(n):
    import torch_cases
    bad = [f for per_rank in job(torch_cases.horovod_parity, n) for f in per_rank]
    check(not bad, "%d ranks:\n  %s" % (n, "\n  ".join(bad)))


def test_horovod_parity_1():
    parity_on(1)


def test_horovod_parity_2():
    parity_on(2)


def test_timeline():
    """HOROVOD_TIMELINE given to hvd_bridge.run(env=...) for a job of hvd_bridge.torch
    collectives: rank 0 writes a Chrome-trace JSON array with a row per named tensor and the
    collective each one ran (the knob reaches the runtime from Python, as horovod.torch's)."""
    import json
    import torch_cases
    path = os.path.join(tempfile.mkdtemp(prefix="hvd-torch-timeline."), "timeline.json")
    job(torch_cases.timeline_steps, 2, _env={"HOROVOD_TIMELINE": path})
    check(os.path.exists(path), "rank 0 wrote no timeline at %s" % path)
    with open(path, encoding="utf-8") as f:
        events = json.load(f)
    rows = {e["pid"]: e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name"}
    seen = {(rows.get(e.get("pid")), e.get("name")) for e in events if e.get("ph") == "B"}
    # Rows are named as in Horovod: the collective, a dot, the user's name.
    for row, activity in (("allreduce.tl.ar", "ALLREDUCE"), ("allgather.tl.ag", "ALLGATHER"),
                          ("broadcast.tl.bc", "BROADCAST")):
        check((row, activity) in seen, "no %s span on row %s: %s" % (activity, row,
                                                                     sorted(map(str, seen))))


def test_horovod_script():
    """examples/python/train_digits.py, a Horovod script but for its import line, run as a
    program the way horovodrun runs one: every rank runs it, rank 0 prints the accuracy."""
    script = os.path.join(REPO, "examples", "python", "train_digits.py")
    with open(script) as f:
        src = f.read()
    # Nothing of hvd_bridge but the import: every other call is horovod.torch's API.
    check(src.count("import hvd_bridge.torch as hvd  # was: import horovod.torch as hvd") == 1
          and src.count("hvd_bridge") == 1, "the script differs from Horovod's by its import")
    mark = uuid.uuid4().hex
    env = hvdtest.marked_env(mark)
    cmd = [os.path.join(ARGS.pythonpath, "hvd_bridge", "bin", "hvd-driver"), "run", "-np", "2",
           "--local", "1", "--", sys.executable, script, "--epochs", "4"]
    rc, out, err, _ = hvdtest.run(cmd, env=env, timeout=300)
    hvdtest.assert_no_leftovers(mark, 15)
    check(rc == 0, "the script failed (%d):\n%s\n%s" % (rc, out[-3000:], err[-3000:]))
    acc = [float(m) for m in re.findall(r"epoch 3: test loss \S+, accuracy (\d\.\d+)", out)]
    check(acc and acc[0] >= 0.9, "rank 0's accuracy after 4 epochs: %s\n%s" % (acc, out))


RAISES_SCRIPT = r"""
import torch, hvd_bridge.torch as hvd
hvd.init()
for step in range(100):
    if hvd.rank() == 1 and step == 3:
        raise ValueError("rank 1 gives up at step 3")
    hvd.allreduce(torch.ones(10), name="x")
"""


def test_failure_blame_program():
    """failure_blame for a program under hvd-driver (as horovodrun runs one): the driver's
    last line names rank 1, whose exception stopped rank 0's allreduce, three times (it named
    rank 0 in 3 of 6 runs before rank 0 waited a moment before raising)."""
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "raises.py")
        with open(script, "w") as f:
            f.write(RAISES_SCRIPT)
        for attempt in range(3):
            mark = uuid.uuid4().hex
            cmd = [os.path.join(ARGS.pythonpath, "hvd_bridge", "bin", "hvd-driver"), "run",
                   "-np", "2", "--local", "1", "--", sys.executable, script]
            rc, out, err, _ = hvdtest.run(cmd, env=hvdtest.marked_env(mark), timeout=120)
            hvdtest.assert_no_leftovers(mark, 15)
            last = [l for l in err.splitlines() if l.startswith("hvd-driver:")][-1:]
            check(rc != 0 and last and re.search(
                r"job failed: rank 1 .*ValueError: rank 1 gives up at step 3", last[0]),
                "attempt %d: the last line names rank 1 (%d): %s" % (attempt + 1, rc, last))


def test_no_shutdown():
    import torch_cases
    out = job(torch_cases.without_shutdown, 2)
    check(out == [3.0, 3.0], "every rank's sum should be 3.0: %s" % out)


def test_no_shutdown_warm():
    """no_shutdown in warm ranks (HVD_WARM_PYTHON), whose interpreter runs the atexit handlers
    itself (hvd_bridge._warm) before os._exit."""
    import torch_cases
    os.environ["HVD_WARM_PYTHON"] = sys.executable
    os.environ["HVD_WARM_IMPORTS"] = "torch"
    try:
        out = job(torch_cases.without_shutdown_warm, 2)
    finally:
        os.environ.pop("HVD_WARM_PYTHON", None)
        os.environ.pop("HVD_WARM_IMPORTS", None)
    check([o[0] for o in out] == [3.0, 3.0], "every rank's sum should be 3.0: %s" % out)
    check(all(o[1] == ["-m", "hvd_bridge._warm"] for o in out), "forked warm: %r" % out)


def test_gpu():
    import torch
    if not torch.cuda.is_available():
        raise Skip("no GPU here (run tests/gpu/run_gpu_tests.sh on a machine with one)")
    collectives_on(1, "cuda")


def main():
    global ARGS
    ARGS = hvdtest.package_test_args(modules=("cloudpickle", "sklearn", "torch"))
    import cloudpickle
    import torch_cases
    cloudpickle.register_pickle_by_value(torch_cases)  # the ranks need not import it
    return hvdtest.run_cases_in_tmpdir(globals(), ARGS.cases, "hvd-torch-test.")

if __name__ == "__main__":
    sys.exit(main())
