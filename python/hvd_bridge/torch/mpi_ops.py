"""The collectives of hvd_bridge.torch over the C runtime (hvd_bridge._runtime): Horovod's names,
signatures and semantics (horovod.torch 0.28.1), tensors passed to the runtime by address.

A CPU tensor that is contiguous goes to the runtime as it is (no copy); others are made
contiguous first. A CUDA tensor goes through the NCCL backend once the current stream is
synchronized. Handles are this module's integers; synchronize() waits on the runtime's.
"""
import atexit
import operator
import os
import threading

import torch

from .. import _follower
from .. import _runtime as _rt
from ..common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401


def _wait(rt_handle):
    """The runtime's wait; a failure that only followed another rank's shutdown is raised a
    moment later (hvd_bridge._follower)."""
    try:
        _rt.wait(rt_handle)
    except HorovodInternalError as e:
        _follower.linger(e)
        raise


# Reduce ops: Horovod's numbers (an int, as in horovod.torch).
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
# ... and the runtime's (include/hvd/runtime.h: hvd_reduce_op).
_RT_OP = {Sum: 0, Average: 1, Min: 2, Max: 3, Product: 4}

# torch dtype -> the runtime's hvd_dtype.
_DTYPES = {torch.uint8: 0, torch.int8: 1, torch.int32: 2, torch.int64: 3, torch.float16: 4,
           torch.bfloat16: 5, torch.float32: 6, torch.float64: 7}


_ONLY_GLOBAL = ("hvd_bridge.torch supports only the global process set "
                "(hvd.global_process_set, every rank)")


class ProcessSet:
    """Horovod's process set of some ranks. hvd_bridge supports the global one only: a set made
    here is never registered (process_set_id, size() and rank() stay None, as in Horovod
    before registration), and a collective, init() or add_process_set() given it raises
    NotImplementedError."""
    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise NotImplementedError(_ONLY_GLOBAL + "; ProcessSet takes a list of ranks, not an "
                                      "MPI communicator") from None
        if any(not isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks")
        self.ranks = ranks

    def size(self):
        return None

    def rank(self):
        return None

    def included(self):
        return rank() in self.ranks

    def __str__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s, mpi_comm=None)" % (self.process_set_id,
                                                                        self.ranks)

    __repr__ = __str__


class _GlobalProcessSet(ProcessSet):
    """Every rank of the job: process_set_id 0, ranks [0, size()) once the runtime runs."""
    process_set_id = 0

    def __init__(self):
        pass

    @property
    def ranks(self):
        return list(range(size())) if is_initialized() else []

    def size(self):
        return size()

    def rank(self):
        return rank()

    def included(self):
        return True


global_process_set = _GlobalProcessSet()


def add_process_set(process_set):
    raise NotImplementedError(_ONLY_GLOBAL)


def remove_process_set(process_set):
    raise NotImplementedError(_ONLY_GLOBAL)


def _check_process_set(process_set):
    if process_set is not global_process_set and process_set is not None:
        raise NotImplementedError(_ONLY_GLOBAL)


# ---- lifecycle --------------------------------------------------------------------------------

def init(comm=None, process_sets=None):
    """Starts the runtime (MPI and its background thread). A second call does nothing. As in
    Horovod, the runtime is shut down when the process exits, so a program need not call
    shutdown() (a rank ending without MPI_Finalize would make mpirun fail the job)."""
    if comm is not None or process_sets not in (None, []):
        raise NotImplementedError("hvd_bridge.torch.init takes no communicator or process sets")
    if not _rt.is_running():
        _rt.init()
        _handles.clear()
    if _at_exit[0] != os.getpid():
        atexit.register(_shutdown_at_exit, os.getpid())
        _at_exit[0] = os.getpid()


_at_exit = [None]  # the process that registered _shutdown_at_exit


def _shutdown_at_exit(pid):
    """Unconditional (it joins the background thread even when another rank's shutdown ended
    the runtime, so MPI is finalized before the process ends), but never in a forked child,
    where that thread does not exist."""
    if os.getpid() == pid:
        shutdown()


def shutdown():
    """Stops the runtime on every rank. As with Horovod over MPI, init() cannot start it
    again in this process (MPI cannot be initialised twice)."""
    _rt.shutdown()
    _handles.clear()


def is_initialized():
    return bool(_rt.is_running())


def _topology(fn):
    v = fn()
    if v < 0:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return v


def size():
    return _topology(_rt.size)


def _collective_topology(fn):
    """rank() or size() for a collective that needs it before its submission: while the runtime
    does not run, the error the submission itself gives (HorovodInternalError once it stopped,
    as Horovod's collectives raise after a shutdown), not size()'s ValueError."""
    v = fn()
    if v < 0:
        _rt.barrier_async()  # refused, so it raises the runtime's reason and submits nothing
        return _topology(fn)
    return v


def rank():
    return _topology(_rt.rank)


def local_size():
    return _topology(_rt.local_size)


def local_rank():
    return _topology(_rt.local_rank)


def cross_size():
    return _topology(_rt.cross_size)


def cross_rank():
    return _topology(_rt.cross_rank)


def mpi_built():
    return True


def mpi_built_for():
    """The MPI the runtime was built against ("Open MPI 4.1.4", "MPICH 5.0.2"): the one whose
    launcher must start the ranks (hvd.init() refuses another's, naming both)."""
    return _rt.mpi_built_for()


def mpi_enabled():
    return is_initialized()


def mpi_threads_supported():
    _topology(_rt.size)
    return True


def gloo_built():
    return False


def gloo_enabled():
    return False


def nccl_built():
    """1 when the runtime has its NCCL backend (Horovod returns NCCL's version code), else 0."""
    return int(_rt.nccl_built())


def cuda_built():
    return bool(_rt.nccl_built())


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    raise NotImplementedError("set HOROVOD_TIMELINE=<file> before hvd.init() for a timeline")


def stop_timeline():
    raise NotImplementedError("the timeline runs from hvd.init() to hvd.shutdown() "
                              "(HOROVOD_TIMELINE)")


# ---- tensors and handles ----------------------------------------------------------------------

def _dtype(t):
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        raise ValueError("Tensor type %s is not supported." % t.type()) from None


def _device(t):
    if t.is_cpu:
        return _rt.DEVICE_CPU
    if t.is_cuda:
        torch.cuda.current_stream(t.device).synchronize()  # the data must be ready
        return t.device.index
    raise ValueError("tensors on %s are not supported" % t.device)


def _check_tensor(t):
    if not isinstance(t, torch.Tensor):
        raise TypeError("expected a torch.Tensor, got %s" % type(t).__name__)
    if t.layout != torch.strided:
        raise TypeError("expected a dense torch.Tensor, got one of layout %s: reduce "
                        "tensor.to_dense(), or give DistributedOptimizer sparse_as_dense=True"
                        % t.layout)
    return t


def _contiguous(t):
    return t if _check_tensor(t).is_contiguous() else t.contiguous()


def _check_group(tensors, rows=False):
    """Checks every tensor of a grouped call before the first is submitted: a bad one later in
    the list would leave the earlier ones submitted, with no handle to wait for them."""
    for t in tensors:
        _dtype(_check_tensor(t))
        if not (t.is_cpu or t.is_cuda):
            raise ValueError("tensors on %s are not supported" % t.device)
        if rows:
            _rows(t)


def _rows(t):
    """(first_dim, elements per row) of a tensor with at least one dimension."""
    if t.dim() == 0:
        raise ValueError("a tensor with no dimension cannot be gathered, scattered or split; "
                         "use t.reshape(1)")
    first = t.shape[0]
    row = 1
    for d in t.shape[1:]:
        row *= d
    return first, row


class _Pending:
    """A submitted collective: its runtime handles, what keeps its buffers alive, and how to
    build its result once they completed."""

    __slots__ = ("rt_handles", "keep", "finish")

    def __init__(self, rt_handles, keep, finish):
        self.rt_handles, self.keep, self.finish = rt_handles, keep, finish


_handles = {}
_handles_lock = threading.Lock()
_next_handle = [0]


def _register(rt_handles, keep, finish):
    with _handles_lock:
        _next_handle[0] += 1
        h = _next_handle[0]
        _handles[h] = _Pending(rt_handles, keep, finish)
    return h


def _check_name(name):
    """name itself: None or a str; anything else is refused here, not turned into a string
    that may match another rank's different object."""
    if name is not None and not isinstance(name, str):
        raise TypeError("name must be a str or None, got %s" % type(name).__name__)
    return name


def _name(op, name):
    return None if _check_name(name) is None else "%s.%s" % (op, name)


def _resolve_op(op, average):
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        import warnings
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning)
        return Average if average else Sum
    return Average if op is None else op


def _rt_op(op):
    if op == Adasum:
        raise NotImplementedError("Adasum is not supported by hvd_bridge.torch")
    try:
        return _RT_OP[op]
    except KeyError:
        raise ValueError("unknown reduce op %r" % (op,)) from None


def poll(handle):
    """True once the collective behind handle has completed (synchronize will not block)."""
    p = _handles.get(handle)
    if p is None:
        raise ValueError("Handle %s was not created or has been cleared." % handle)
    return all(_rt.poll(h) for h in p.rt_handles)


def synchronize(handle):
    """Waits for the collective and returns its output (a tensor, or a tuple for grouped ops and
    alltoall); raises HorovodInternalError if it failed. An unknown handle gives None."""
    with _handles_lock:
        p = _handles.pop(handle, None)
    if p is None:
        return None
    error = None
    for h in p.rt_handles:  # every one, even after a failure: each must be released
        try:
            _wait(h)
        except HorovodInternalError as e:
            error = error or e
    if error is not None:
        raise error
    return p.finish()


# ---- allreduce --------------------------------------------------------------------------------

def _allreduce_submit(tensor, output, name, op, prescale_factor, postscale_factor):
    t = _contiguous(tensor)
    out = output if output is not None and output.is_contiguous() else None
    if out is None:
        out = torch.empty_like(t, memory_format=torch.contiguous_format)
    if op not in (Sum, Average) and (prescale_factor != 1.0 or postscale_factor != 1.0):
        raise ValueError("prescale_factor and postscale_factor go with Sum and Average only")
    h = _rt.allreduce_async(name, t.data_ptr(), out.data_ptr(), t.numel(), _dtype(t), _rt_op(op),
                            float(prescale_factor), float(postscale_factor), _device(t))
    return h, t, out


def _allreduce_in_place(t, name, op, prescale_factor, postscale_factor):
    """The runtime's handle of an in-place allreduce of contiguous t (name complete, op and
    factors checked by the caller): DistributedOptimizer's path for its gradients."""
    return _rt.allreduce_async(name, t.data_ptr(), t.data_ptr(), t.numel(), _dtype(t), _rt_op(op),
                               prescale_factor, postscale_factor, _device(t))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Reduces tensor over every rank into a new tensor; returns a handle."""
    _check_process_set(process_set)
    op = _resolve_op(op, average)
    h, t, out = _allreduce_submit(tensor, None, _name("allreduce", name), op, prescale_factor,
                                  postscale_factor)
    return _register([h], (t, out), lambda: out)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Reduces tensor over every rank, in place; returns a handle."""
    _check_process_set(process_set)
    op = _resolve_op(op, average)
    target = tensor if _check_tensor(tensor).is_contiguous() else None
    h, t, out = _allreduce_submit(tensor, target if target is not None else None,
                                  _name("allreduce", name), op, prescale_factor, postscale_factor)
    if target is not None:
        return _register([h], (t,), lambda: tensor)

    def finish():
        tensor.copy_(out)
        return tensor
    return _register([h], (t, out), finish)


def _grouped_names(base, n):
    return [None if _check_name(base) is None else "%s_%dof%d" % (base, i + 1, n) for i in range(n)]


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    _check_process_set(process_set)
    op = _resolve_op(op, average)
    _check_group(tensors)
    subs = [_allreduce_submit(t, None, _name("grouped_allreduce", n), op, prescale_factor,
                              postscale_factor)
            for t, n in zip(tensors, _grouped_names(name, len(tensors)))]
    outs = [o for _, _, o in subs]
    return _register([h for h, _, _ in subs], subs, lambda: tuple(outs))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    _check_process_set(process_set)
    op = _resolve_op(op, average)
    _check_group(tensors)
    subs = []
    for t, n in zip(tensors, _grouped_names(name, len(tensors))):
        subs.append(_allreduce_submit(t, t if _check_tensor(t).is_contiguous() else None,
                                      _name("grouped_allreduce", n), op, prescale_factor,
                                      postscale_factor))

    def finish():
        for t, (_, _, out) in zip(tensors, subs):
            if out.data_ptr() != t.data_ptr():
                t.copy_(out)
        return tuple(tensors)
    return _register([h for h, _, _ in subs], subs, finish)


# ---- allgather --------------------------------------------------------------------------------

class _DeviceBuffer:
    """Runtime-owned CUDA memory shown to torch (__cuda_array_interface__), to copy it out."""

    def __init__(self, address, nbytes):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (address, False), "version": 3}


def _take(rt_handle, like, shape_tail):
    """The runtime's output of an allgather or alltoall as a new tensor like `like`, and the
    rows each rank contributed."""
    owner, address, nbytes, first_dim, rows, _ = _rt.take_output(rt_handle)
    out = torch.empty((first_dim,) + tuple(shape_tail), dtype=like.dtype, device=like.device)
    if nbytes:
        if out.is_cuda:
            src = torch.as_tensor(_DeviceBuffer(address, nbytes), device=out.device)
            out.view(-1).view(torch.uint8).copy_(src)
        else:
            _rt.copy_host(address, out.data_ptr(), nbytes)
    del owner  # the runtime's memory is freed here
    return out, rows


def _allgather_submit(tensor, name):
    t = _contiguous(tensor)
    first, row = _rows(t)
    h = _rt.allgather_async(name, t.data_ptr(), first, row, _dtype(t), _device(t))
    return h, t


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's tensor along dimension 0 (first dimensions may differ)."""
    _check_process_set(process_set)
    h, t = _allgather_submit(tensor, _name("allgather", name))
    return _register([h], (t,), lambda: _take(h, t, t.shape[1:])[0])


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    _check_process_set(process_set)
    _check_group(tensors, rows=True)
    subs = [_allgather_submit(t, _name("grouped_allgather", n))
            for t, n in zip(tensors, _grouped_names(name, len(tensors)))]
    return _register([h for h, _ in subs], subs,
                     lambda: tuple(_take(h, t, t.shape[1:])[0] for h, t in subs))


# ---- broadcast --------------------------------------------------------------------------------

def _root(root_rank):
    try:
        return operator.index(root_rank) if not isinstance(root_rank, bool) else None
    except TypeError:
        return None


def _broadcast_submit(buf, root_rank, name):
    root = _root(root_rank)
    if root is None:
        raise TypeError("root_rank must be an int, got %r" % (root_rank,))
    return _rt.broadcast_async(name, buf.data_ptr(), buf.numel(), _dtype(buf), root,
                               _device(buf))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Root's tensor, copied into a new tensor on every rank."""
    _check_process_set(process_set)
    out = _check_tensor(tensor).detach().clone(memory_format=torch.contiguous_format)
    h = _broadcast_submit(out, root_rank, _name("broadcast", name))
    return _register([h], (out,), lambda: out)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Root's tensor, copied into tensor on every rank (in place)."""
    _check_process_set(process_set)
    if _check_tensor(tensor).is_contiguous():
        h = _broadcast_submit(tensor, root_rank, _name("broadcast", name))
        return _register([h], (tensor,), lambda: tensor)
    buf = tensor.contiguous()
    h = _broadcast_submit(buf, root_rank, _name("broadcast", name))

    def finish():
        with torch.no_grad():
            tensor.copy_(buf)
        return tensor
    return _register([h], (buf,), finish)


# ---- alltoall ---------------------------------------------------------------------------------

def _split_list(splits, n):
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1 or splits.is_floating_point() or splits.is_complex() or \
                splits.dtype == torch.bool:
            raise ValueError("splits must be a 1-D tensor of integers, or a list; got a %d-D "
                             "%s tensor" % (splits.dim(), splits.dtype))
        splits = splits.tolist()
    splits = [int(s) for s in splits]
    if len(splits) != n:
        raise ValueError("splits has %d entries, not one per rank (%d)" % (len(splits), n))
    return splits


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[r] rows (dimension 0) to rank r, receives from every rank in rank order.
    synchronize() returns (output, received_splits)."""
    _check_process_set(process_set)
    t = _contiguous(tensor)
    first, row = _rows(t)
    n = _collective_topology(_rt.size)
    sp = _split_list(splits, n)
    if sp is None and first % n:
        raise ValueError("splits not provided, but first dimension of tensor is not an even "
                         "multiple of the number of workers.")
    h = _rt.alltoall_async(_name("alltoall", name), t.data_ptr(), first, row, sp, _dtype(t),
                           _device(t))

    def finish():
        out, rows = _take(h, t, t.shape[1:])
        received = torch.tensor(rows, dtype=torch.int32)
        if isinstance(splits, torch.Tensor):
            received = received.to(splits.device)
        return out, received
    return _register([h], (t,), finish)


# ---- reducescatter ----------------------------------------------------------------------------

def _scaled(t, factor):
    """t * factor in t's dtype, as the runtime scales an allreduce (runtime/types.c,
    rt_scale): an integer tensor's values truncated toward zero, held to the dtype's range
    (for int64 the largest double below 2^63) and NaN made 0 (t * 2.5 would be a float
    tensor)."""
    if t.is_floating_point():
        return t * factor
    info = torch.iinfo(t.dtype)
    hi = 9223372036854774784.0 if t.dtype == torch.int64 else float(info.max)
    wide = torch.nan_to_num(torch.trunc(t.double() * factor), nan=0.0)
    return wide.clamp_(float(info.min), hi).to(t.dtype)


def _reducescatter_submit(tensor, name, op, prescale_factor, postscale_factor):
    if op not in (Sum, Average):
        raise HorovodInternalError("Reducescatter currently only supports AVERAGE and SUM.")
    t = _contiguous(tensor)
    _dtype(t)  # a dtype the runtime has, before scaling it
    if prescale_factor != 1.0:
        t = _scaled(t, prescale_factor)
    first, row = _rows(t)
    mine = _rt.reducescatter_rows(first, _collective_topology(_rt.rank),
                                  _collective_topology(_rt.size))
    out = torch.empty((mine,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    h = _rt.reducescatter_async(name, t.data_ptr(), out.data_ptr(), first, row, _dtype(t),
                                _rt_op(op), _device(t))

    def finish():
        if postscale_factor != 1.0 and out.is_floating_point():
            out.mul_(postscale_factor)
        elif postscale_factor != 1.0:
            out.copy_(_scaled(out, postscale_factor))
        return out
    return h, t, out, finish


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Reduces over every rank and leaves each rank its slice of dimension 0: the first
    (rows % size) ranks get one row more."""
    _check_process_set(process_set)
    h, t, out, finish = _reducescatter_submit(tensor, _name("reducescatter", name), op,
                                              prescale_factor, postscale_factor)
    return _register([h], (t, out), finish)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    _check_process_set(process_set)
    _check_group(tensors, rows=True)
    subs = [_reducescatter_submit(t, _name("grouped_reducescatter", n), op, prescale_factor,
                                  postscale_factor)
            for t, n in zip(tensors, _grouped_names(name, len(tensors)))]
    return _register([s[0] for s in subs], subs, lambda: tuple(s[3]() for s in subs))


# ---- barrier and join -------------------------------------------------------------------------

def barrier(process_set=global_process_set):
    """Returns once every rank has called barrier()."""
    _check_process_set(process_set)
    _wait(_rt.barrier_async())


def join(device=-1):
    """Horovod's join: this rank has no more data. Until every rank has joined, it takes part
    with zeros in the allreduces the other ranks still run (DistributedOptimizer's gradients
    among them), so ranks with unequal numbers of batches do not wait for each other; zeros for
    CUDA tensors live on ``device`` (-1: host zeros only, and a CUDA allreduce then fails on
    every rank saying so). Average still divides by size(). Any other collective submitted while
    a rank is joined fails on the ranks that submitted it. Returns the rank that joined last."""
    last = torch.full((1,), -1, dtype=torch.int32)
    _wait(_rt.join_async(-1 if device is None else int(device), last.data_ptr()))
    return int(last.item())
