#!/usr/bin/env python3
"""hvd_bridge.run without Spark: 4 ranks in task services on this machine, and existing
torch.distributed code unchanged inside them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are
set for every rank).

    pip install . torch               # from the repository root (docs/python.md)
    python examples/python/run_hello.py
"""
import hvd_bridge


def allreduce_with_torch_distributed():
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


if __name__ == "__main__":
    print(hvd_bridge.run(allreduce_with_torch_distributed, np=4))  # [10.0, 10.0, 10.0, 10.0]
