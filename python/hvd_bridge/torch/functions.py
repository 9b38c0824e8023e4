"""Broadcasting model parameters, optimizer state and Python objects (horovod.torch's
functions), over the collectives of mpi_ops."""
import io

import cloudpickle
import torch

from . import mpi_ops
from .mpi_ops import (allgather_async, broadcast_async_, global_process_set, rank,
                      synchronize)


def broadcast_parameters(params, root_rank):
    """Copies root's parameters (a state_dict, or a list of (name, tensor) or tensors) to every
    rank, in place. A generator (model.named_parameters()) is refused: pass a list."""
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, list):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    handles = []
    for name, p in params:
        if p is None:
            continue
        handles.append(broadcast_async_(p.data if isinstance(p, torch.nn.Parameter) else p,
                                        root_rank, name))
    for h in handles:
        synchronize(h)


def _scalar_key(option, index):
    return "%s.%d" % (option, index)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Copies root's optimizer state (its hyper-parameters and per-parameter state) to every
    rank. A fresh optimizer takes one step with zero gradients first, so that its state exists
    everywhere: sparse ones for SparseAdam, and for SGD on the parameters of model's sparse
    Embeddings (model: optional, as in Horovod). The parameters of groups with weight decay are
    put back after that step: weight decay moves them even with zero gradients (Horovod leaves them moved, so a fresh
    rank drifted from a resumed root for good)."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        sparse = set()
        if model is not None:
            sparse = {id(p) for m in model.modules()
                      if isinstance(m, torch.nn.Embedding) and m.sparse for p in m.parameters()}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = p.data.new_zeros(p.shape)
                    if isinstance(optimizer, torch.optim.SparseAdam) or (
                            isinstance(optimizer, torch.optim.SGD) and id(p) in sparse):
                        p.grad = p.grad.to_sparse()
        # With zero gradients only weight decay moves them: those of other groups stay put.
        kept = [(p, p.detach().clone()) for group in optimizer.param_groups
                if group.get("weight_decay") for p in group["params"] if p.requires_grad]
        # A DistributedOptimizer steps without its allreduces: ranks may not all get here.
        step = getattr(optimizer, "_hvd_local_step", None)
        (step or optimizer.step)()
        with torch.no_grad():
            for p, value in kept:
                p.copy_(value)
        state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        return  # a stateless optimizer: nothing to send
    tensors, scalars, callbacks = [], {}, {}

    def setter(holder, key):
        def set_value(value):
            holder[key] = value
        return set_value

    for index, group in enumerate(state_dict["param_groups"]):
        for option, value in group.items():
            if option == "params":
                continue
            key = _scalar_key(option, index)
            scalars[key] = value
            callbacks[key] = setter(optimizer.param_groups[index], option)
        for pid in group["params"]:
            if pid not in state_dict["state"]:
                continue
            occurrences = {}
            for name, value in sorted(state_dict["state"][pid].items()):
                occurrences[name] = occurrences.get(name, 0) + 1
                key = "%s.%d.%d" % (name, pid, occurrences[name])
                if torch.is_tensor(value):
                    tensors.append((key, value))
                else:
                    scalars[key] = value
                    callbacks[key] = setter(state_dict["state"][pid], name)
    broadcast_parameters(tensors, root_rank)
    scalars = broadcast_object(scalars, root_rank, name="optimizer_scalars")
    for key, value in scalars.items():
        callbacks[key](value)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Root's object (pickled with cloudpickle), returned on every rank. The other ranks' obj
    is not used: None will do. Without a name the call is named "broadcast_object" on every
    rank (Horovod names it after type(obj), so a dict on the root and None elsewhere waited
    for ever on two different names)."""
    mpi_ops._check_process_set(process_set)
    name = mpi_ops._check_name(name) or "broadcast_object"
    if rank() == root_rank:
        buf = io.BytesIO()
        cloudpickle.dump(obj, buf)
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        sz = torch.tensor([data.numel()], dtype=torch.int64)
        synchronize(broadcast_async_(sz, root_rank, name + ".sz"))
        if data.numel():
            synchronize(broadcast_async_(data, root_rank, name + ".t"))
        return obj
    sz = torch.zeros(1, dtype=torch.int64)
    synchronize(broadcast_async_(sz, root_rank, name + ".sz"))
    data = torch.empty(int(sz.item()), dtype=torch.uint8)
    if data.numel():
        synchronize(broadcast_async_(data, root_rank, name + ".t"))
    return cloudpickle.loads(data.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's object, as a list in rank order (objects of different types too: without
    a name the call is "allgather_object" on every rank, not named after type(obj))."""
    mpi_ops._check_process_set(process_set)
    name = mpi_ops._check_name(name) or "allgather_object"
    payload = cloudpickle.dumps(obj)
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else \
        torch.empty(0, dtype=torch.uint8)
    sizes = synchronize(allgather_async(torch.tensor([len(payload)], dtype=torch.int64),
                                        name + ".sz"))
    gathered = synchronize(allgather_async(data, name + ".t"))
    out, off = [], 0
    for n in sizes.tolist():
        out.append(cloudpickle.loads(gathered[off:off + n].numpy().tobytes()))
        off += n
    return out
