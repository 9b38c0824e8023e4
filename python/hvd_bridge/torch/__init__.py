"""hvd_bridge.torch: horovod.torch's API on hvd-bridge's collective runtime (C, MPI for CPU
tensors, NCCL for CUDA tensors). A training script changes one line:

    import hvd_bridge.torch as hvd      # was: import horovod.torch as hvd

Differences from horovod.torch are listed in docs/torch.md (process sets: global only; no
Adasum; the timeline comes from HOROVOD_TIMELINE).
"""
import torch

from .compression import Compression
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                        broadcast_parameters)
from .mpi_ops import (Adasum, Average, HorovodInternalError, HostsUpdatedInterrupt, Max, Min,
                      ProcessSet, Product, Sum, add_process_set, allgather_async,
                      allreduce_async,
                      allreduce_async_, alltoall_async, barrier, broadcast_async,
                      broadcast_async_, ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                      gloo_built, gloo_enabled, global_process_set, grouped_allgather_async,
                      grouped_allreduce_async, grouped_allreduce_async_,
                      grouped_reducescatter_async, init, is_initialized, join, local_rank,
                      local_size, mpi_built, mpi_built_for, mpi_enabled, mpi_threads_supported,
                      nccl_built, poll, rank, reducescatter_async, remove_process_set,
                      rocm_built, shutdown, size,
                      start_timeline, stop_timeline, synchronize)
from .optimizer import DistributedOptimizer
from . import elastic  # noqa: E402 - hvd.elastic.TorchState, @hvd.elastic.run
from . import mpi_ops as _ops


# ---- differentiable collectives (torch.autograd.Function) -------------------------------------

class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor):
        ctx.op, ctx.pre, ctx.post = op, prescale_factor, postscale_factor
        return synchronize(allreduce_async(tensor, name=name, op=op,
                                           prescale_factor=prescale_factor,
                                           postscale_factor=postscale_factor))

    @staticmethod
    def backward(ctx, grad):
        # The gradient of a reduction, reduced the same way over the ranks.
        return allreduce(grad, op=ctx.op, prescale_factor=ctx.pre,
                         postscale_factor=ctx.post), None, None, None, None


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.pre, ctx.post = op, prescale_factor, postscale_factor
        return tuple(synchronize(grouped_allreduce_async(
            list(tensors), name=name, op=op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor)))

    @staticmethod
    def backward(ctx, *grads):
        out = grouped_allreduce(list(grads), op=ctx.op, prescale_factor=ctx.pre,
                                postscale_factor=ctx.post)
        return (None, None, None, None) + tuple(out)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        out = synchronize(allgather_async(tensor, name=name))  # a 0-dim tensor: its ValueError
        ctx.dim0 = tensor.shape[0]
        return out

    @staticmethod
    def backward(ctx, grad):
        # Every rank's gradient of the whole output, averaged; this rank keeps its rows.
        g = allreduce(grad, op=Average)
        dims = synchronize(allgather_async(torch.tensor([ctx.dim0], dtype=torch.int64)))
        offset = int(dims[:rank()].sum().item())
        return g.narrow(0, offset, ctx.dim0), None


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, *tensors):
        out = tuple(synchronize(grouped_allgather_async(list(tensors), name=name)))
        ctx.dims = [t.shape[0] for t in tensors]
        return out

    @staticmethod
    def backward(ctx, *grads):
        # As _Allgather's, for each tensor of the group.
        reduced = grouped_allreduce(list(grads), op=Average)
        dims = synchronize(allgather_async(torch.tensor(ctx.dims, dtype=torch.int64)))
        offsets = dims.view(size(), len(ctx.dims))[:rank()].sum(0).tolist()
        return (None,) + tuple(g.narrow(0, int(o), d)
                               for g, o, d in zip(reduced, offsets, ctx.dims))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root = root_rank
        return synchronize(broadcast_async(tensor, root_rank, name=name))

    @staticmethod
    def backward(ctx, grad):
        g = allreduce(grad, op=Average)
        if rank() != ctx.root:
            g = g * 0
        return g, None, None


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name):
        out, received = synchronize(alltoall_async(tensor, splits=splits, name=name))
        ctx.received = received
        ctx.rows = tensor.shape[0] if tensor.dim() else 0
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _):
        back = alltoall(grad, splits=ctx.received)[0]
        if back.shape[0] < ctx.rows:  # splits summed to less: the rows not sent get zeros
            back = torch.cat([back, back.new_zeros((ctx.rows - back.shape[0],) +
                                                   tuple(back.shape[1:]))])
        return back, None, None


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor):
        ctx.op, ctx.pre, ctx.post = op, prescale_factor, postscale_factor
        return synchronize(reducescatter_async(tensor, name=name, op=op,
                                               prescale_factor=prescale_factor,
                                               postscale_factor=postscale_factor))

    @staticmethod
    def backward(ctx, grad):
        g = grad.clone()
        if ctx.op == Sum:
            g *= size()
        if ctx.pre != 1.0:
            g *= ctx.pre
        if ctx.post != 1.0:
            g *= ctx.post
        return allgather(g), None, None, None, None


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.pre, ctx.post = op, prescale_factor, postscale_factor
        return tuple(synchronize(grouped_reducescatter_async(
            list(tensors), name, op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor)))

    @staticmethod
    def backward(ctx, *grads):
        scale = (size() if ctx.op == Sum else 1) * ctx.pre * ctx.post
        grads = [g * scale if scale != 1 else g for g in grads]
        return (None, None, None, None) + tuple(grouped_allgather(grads))


# ---- the synchronous collectives ---------------------------------------------------------------

def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """A new tensor holding the reduction of tensor over every rank (op: Average by default,
    Sum, Min, Max, Product). Differentiable."""
    _ops._check_process_set(process_set)
    _ops._check_tensor(tensor)
    op = _ops._resolve_op(op, average)
    compressed, ctx = compression.compress(tensor)
    out = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """allreduce in place; returns tensor."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """allreduce of a list of tensors (negotiated and fused together). Differentiable."""
    _ops._check_process_set(process_set)
    for t in tensors:
        _ops._check_tensor(t)
    op = _ops._resolve_op(op, average)
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor,
                                   *[c for c, _ in pairs])
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's tensor concatenated along dimension 0, in rank order. Differentiable."""
    _ops._check_process_set(process_set)
    _ops._check_tensor(tensor)
    return _Allgather.apply(tensor, name)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather of a list of tensors; a tuple of the results. Differentiable."""
    _ops._check_process_set(process_set)
    for t in tensors:
        _ops._check_tensor(t)
    return _GroupedAllgather.apply(name, *tensors)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """A new tensor holding root_rank's tensor on every rank. Differentiable."""
    _ops._check_process_set(process_set)
    _ops._check_tensor(tensor)
    return _Broadcast.apply(tensor, root_rank, name)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """broadcast in place; returns tensor."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[r] rows of tensor to rank r and returns what every rank sent here, in rank
    order; with splits given, (output, received_splits). Differentiable."""
    _ops._check_process_set(process_set)
    _ops._check_tensor(tensor)
    out, received = _Alltoall.apply(tensor, splits, name)
    return out if splits is None else (out, received)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """The reduction over every rank, scattered along dimension 0: the first (rows % size)
    ranks get one row more. Differentiable."""
    _ops._check_process_set(process_set)
    _ops._check_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, name, op, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of a list of tensors. Differentiable."""
    _ops._check_process_set(process_set)
    for t in tensors:
        _ops._check_tensor(t)
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedReducescatter.apply(name, op, prescale_factor, postscale_factor,
                                       *[c for c, _ in pairs])
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


__all__ = [n for n in dir() if not n.startswith("_") and n != "torch"]

# horovod.torch's names that hvd_bridge.torch lacks, with what to use instead.
_NOT_PROVIDED = {
    "SyncBatchNorm": "use torch.nn.SyncBatchNorm with torch.distributed (its env:// variables are "
                     "set in every rank), or plain BatchNorm",
    "sparse_allreduce_async": "give DistributedOptimizer sparse_as_dense=True, or allreduce "
                              "tensor.to_dense()",
}


def __getattr__(name):
    if name in _NOT_PROVIDED:
        raise AttributeError("hvd_bridge.torch has no %s (docs/torch.md): %s" % (
            name, _NOT_PROVIDED[name]))
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
