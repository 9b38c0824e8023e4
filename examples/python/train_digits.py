#!/usr/bin/env python3
"""A Horovod training script, unchanged but for its import line: an MLP on scikit-learn's
bundled digits (no download), data-parallel over the ranks. Needs torch and scikit-learn
(`pip install torch scikit-learn`) in the ranks' interpreter.

    # with hvd-bridge (one line differs from the Horovod script):
    hvd-driver run -np 2 --local 1 -- python examples/python/train_digits.py
    # or from Python, with the package's run() or spark.run()
    # the same script with Horovod:
    #   horovodrun -np 2 python train_digits.py   (with `import horovod.torch as hvd`)
"""
import argparse

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import hvd_bridge.torch as hvd  # was: import horovod.torch as hvd


def data():
    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=g)
    return x[order], y[order]


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(42)
    torch.set_num_threads(1)
    x, y = data()
    xtr, ytr, xte, yte = x[:1500], y[:1500], x[1500:], y[1500:]
    # Each rank trains on its shard (what DistributedSampler does).
    xtr, ytr = xtr[hvd.rank()::hvd.size()], ytr[hvd.rank()::hvd.size()]

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    # Horovod's rule: scale the learning rate by the number of workers.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.none)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    for epoch in range(args.epochs):
        model.train()
        for i in range(0, len(xtr), args.batch_size):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xtr[i:i + args.batch_size]),
                                   ytr[i:i + args.batch_size])
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            test_loss = F.cross_entropy(model(xte), yte).item()
            accuracy = (model(xte).argmax(1) == yte).float().mean().item()
        test_loss = metric_average(test_loss, "avg_loss")
        accuracy = metric_average(accuracy, "avg_accuracy")
        if hvd.rank() == 0:
            print("epoch %d: test loss %.4f, accuracy %.3f" % (epoch, test_loss, accuracy),
                  flush=True)
    global RESULT
    RESULT = {"accuracy": accuracy, "size": hvd.size()}
    hvd.shutdown()


if __name__ == "__main__":
    main()
