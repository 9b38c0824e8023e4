#!/usr/bin/env python3
"""An elastic Horovod training script (horovod.torch.elastic's API): an MLP on scikit-learn's
bundled digits, data-parallel over however many ranks there are, resumed from its last commit
after every reset. Needs torch and scikit-learn (`pip install torch scikit-learn`).

    hvd-driver run -np 4 --min-np 2 --max-np 4 --local 2 -- python examples/python/train_elastic.py
    # the same script with Horovod (with `import horovod.torch as hvd`):
    #   horovodrun -np 4 --min-np 2 --max-np 4 --host-discovery-script ./hosts.sh python train_elastic.py

Every step takes the next global batch of --batch-size samples and each rank its equal slice
of it (the size divides it: 48 serves 1, 2, 3, 4, 6 and 8 ranks), so that the averaged
gradient, and so the trained model, are the same whatever the number of ranks and however
often the job was reset: tests/python/test_torch_elastic.py checks that. --log-file FILE gets rank
0's "start ..." and "commit ..." lines, --out FILE the final parameters.
"""
import argparse
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import hvd_bridge.torch as hvd  # was: import horovod.torch as hvd


def data():
    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    return x[order], y[order]


def log(path, line):
    if path and hvd.rank() == 0:
        with open(path, "a") as f:
            f.write("%.3f %s\n" % (time.time(), line))


def train_model(epochs=2, batch_size=48, lr=0.1, commit_every=4, sleep=0.0, log_path=None,
                out=None):
    """Trains the MLP as an elastic job; returns the final parameters (rank 0 also saves them
    to out). Also what hvd_bridge.spark.run_elastic runs in tests/python."""
    hvd.init()
    x, y = data()
    batches = len(x) // batch_size
    torch.manual_seed(1)  # the same initial model everywhere (rank 0's is broadcast anyway)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    # A warm-up over the first 100 steps, kept in the state like the model and the optimizer
    # (each rank's scheduler goes on stepping its own optimizer after a reset).
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 100.0))
    state = hvd.elastic.TorchState(model=model, optimizer=opt, lr_scheduler=sched, epoch=0,
                                   batch=0, commits=0)
    state.register_reset_callbacks([lambda: log(log_path, "reset size=%d" % hvd.size())])

    @hvd.elastic.run
    def train(state):
        log(log_path, "start size=%d commit=%d" % (hvd.size(), state.commits))
        for state.epoch in range(state.epoch, epochs):
            for state.batch in range(state.batch, batches):
                per = batch_size // hvd.size()
                lo = state.batch * batch_size + hvd.rank() * per
                opt.zero_grad()
                F.cross_entropy(model(x[lo:lo + per]), y[lo:lo + per]).backward()
                opt.step()
                sched.step()
                if sleep:
                    time.sleep(sleep)
                if (state.batch + 1) % commit_every == 0:
                    state.batch += 1  # the commit resumes after this step
                    state.commits += 1
                    log(log_path, "commit id=%d size=%d lr=%.6g" % (
                        state.commits, hvd.size(), opt.param_groups[0]["lr"]))
                    state.commit()
            state.batch = 0

    train(state)
    log(log_path, "done size=%d" % hvd.size())
    params = {k: v.clone() for k, v in model.state_dict().items()}
    if out and hvd.rank() == 0:
        torch.save(params, out)
    hvd.shutdown()
    return params


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=48)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--commit-every", type=int, default=4)
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds after each step")
    # not --log: horovodrun's parser takes that for an abbreviation of its --log-* options
    ap.add_argument("--log-file")
    ap.add_argument("--out")
    args = ap.parse_args()
    train_model(args.epochs, args.batch_size, args.lr, args.commit_every, args.sleep,
                args.log_file, args.out)


if __name__ == "__main__":
    main()
