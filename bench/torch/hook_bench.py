#!/usr/bin/env python3
"""hook_bench.py: what handing one gradient to the runtime costs the training thread, on one
rank (no mpirun needed: hvd.init() runs as a singleton).

DistributedOptimizer's hook runs once per parameter and step, in the thread running backward,
so its cost adds up over the parameter tensors. Each round hands the gradients of an MLP
(--tensors parameter tensors, 64 x 64 weights and biases) over, one at a time, timing only the
submissions, then waits for all of them (not timed). Three ways, the same tensors:

  hook              DistributedOptimizer's hook (what backward calls)
  allreduce_async_  hvd_bridge.torch.allreduce_async_, in place, named
  runtime           the runtime's own call (hvd_bridge._runtime.allreduce_async)

Prints the median over --rounds rounds of the mean µs per tensor. The first submission of a
round wakes the background thread, which sleeps between rounds; that is in every row.

  PYTHONPATH=build/python python3 bench/torch/hook_bench.py [--tensors 98] [--rounds 2000]
"""
import argparse
import statistics
import time


def rounds_of(submit, finish, tensors, rounds):
    """Median over rounds of the mean ns per submission; finish(handles) waits for a round."""
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        handles = [submit(i, t) for i, t in enumerate(tensors)]
        per.append((time.perf_counter_ns() - t0) / len(tensors))
        finish(handles)
    return statistics.median(per)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", type=int, default=98)
    ap.add_argument("--rounds", type=int, default=2000)
    a = ap.parse_args()

    import torch

    import hvd_bridge.torch as hvd
    from hvd_bridge import _runtime as rt
    torch.set_num_threads(1)
    hvd.init()
    layers = [torch.nn.Linear(64, 64) for _ in range((a.tensors + 1) // 2)]
    params = [p for m in layers for p in m.parameters()][:a.tensors]
    for p in params:
        p.grad = torch.ones_like(p)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.0),
                                   named_parameters=[("p%d" % i, p)
                                                     for i, p in enumerate(params)])
    grads = [p.grad for p in params]

    def synchronize(_):
        opt.synchronize()  # waits for what the hooks submitted
        opt._synchronized = False

    def wait_each(wait):
        return lambda handles: [wait(h) for h in handles]

    from hvd_bridge.torch import mpi_ops
    dtype, op = mpi_ops._DTYPES[grads[0].dtype], mpi_ops._RT_OP[hvd.Average]
    rows = [
        ("hook", rounds_of(lambda i, t: opt._hook(params[i]), synchronize, grads, a.rounds)),
        ("allreduce_async_", rounds_of(lambda i, t: hvd.allreduce_async_(t, name="b%d" % i),
                                       wait_each(hvd.synchronize), grads, a.rounds)),
        ("runtime", rounds_of(lambda i, t: rt.allreduce_async(
            "c%d" % i, t.data_ptr(), t.data_ptr(), t.numel(), dtype, op, 1.0, 1.0, rt.DEVICE_CPU),
            wait_each(rt.wait), grads, a.rounds)),
    ]
    hvd.shutdown()
    print("submission of one gradient, µs (median of %d rounds of %d tensors):"
          % (a.rounds, len(grads)))
    for name, ns in rows:
        print("  %-17s %6.2f" % (name, ns / 1e3))


if __name__ == "__main__":
    main()
