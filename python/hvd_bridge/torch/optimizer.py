"""DistributedOptimizer (horovod.torch's): wraps an optimizer so that each gradient is averaged
over the ranks. A hook on every parameter submits its gradient's allreduce as soon as backward
has accumulated it, so communication overlaps the rest of the backward pass; step() (or
synchronize()) waits for them and then steps.
"""
import contextlib
import warnings

import torch

from . import mpi_ops
from .compression import Compression
from .mpi_ops import Adasum, Average, Sum, allreduce_async_, size, synchronize


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods mixed into the user's optimizer class (see DistributedOptimizer)."""

    def _hvd_setup(self, named_parameters, compression, backward_passes_per_step, op,
                   gradient_predivide_factor, groups, sparse_as_dense, process_set):
        self._compression = compression
        # Horovod's public attributes.
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.backward_passes_per_step = backward_passes_per_step
        self.process_set = process_set
        self._pre, self._post = (float(x) for x in self._scale())
        # Uncompressed gradients go to the runtime directly (_Direct).
        self._direct = compression is Compression.none
        params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(x, tuple) for x in named):
                raise ValueError("named_parameters should be a sequence of tuples (name, "
                                 "parameter), usually produced by model.named_parameters().")
            names = [n for n, _ in named]
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                raise ValueError("Parameter names in named_parameters must be unique. Found "
                                 "duplicates: %s" % ", ".join(dups))
            self._names = {id(p): n for n, p in named}
            missing = [id(p) for p in params if id(p) not in self._names]
            if missing:
                raise ValueError("named_parameters was specified, but one or more model "
                                 "parameters were not named. Python object ids: %s"
                                 % ", ".join(str(m) for m in missing))
        else:
            self._names = {id(p): "allreduce.noname.%d.%d" % (i, j)
                           for i, g in enumerate(self.param_groups)
                           for j, p in enumerate(g["params"])}
        self._rt_names = {k: mpi_ops._name("allreduce", n) for k, n in self._names.items()}
        self._groups = self._make_groups(groups, params)
        self._delay = {id(p): backward_passes_per_step for p in params}
        self._handles = {}  # id(p) or group index -> (handle, p or group, ctx)
        self._group_ready = {}
        self._synchronized = False
        self._should_synchronize = True
        self._hooks = []
        if size() > 1 or _elastic():
            for p in params:
                if p.requires_grad:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._hook))

    # ---- groups ----

    def _make_groups(self, groups, params):
        """{id(p): group index} for grouped allreduces, or None."""
        if groups is None or groups == 0:
            return None
        trainable = [p for p in params if p.requires_grad]
        mine = {id(p) for p in trainable}
        if isinstance(groups, int):
            if groups < 0:
                raise ValueError("groups should be a non-negative integer or a list of list of "
                                 "torch.Tensor.")
            n = min(groups, len(trainable)) or 1
            base, extra = divmod(len(trainable), n)
            lists, off = [], 0
            for i in range(n):
                k = base + (1 if i < extra else 0)
                lists.append(trainable[off:off + k])
                off += k
        elif isinstance(groups, list):
            seen = set()
            lists = []
            for g in groups:
                ids = [id(t) for t in g if torch.is_tensor(t)]
                if len(ids) != len(g) or seen & set(ids):
                    raise ValueError("groups should be a non-negative integer or a list of list "
                                     "of torch.Tensor, each tensor in one group.")
                seen |= set(ids)
                lists.append([t for t in g if id(t) in mine])  # as Horovod: others are left out
            lists += [[p] for p in trainable if id(p) not in seen]
        else:
            raise ValueError("groups should be a non-negative integer or a list of list of "
                             "torch.Tensor.")
        self._group_lists = [g for g in lists if g]
        return {id(p): i for i, g in enumerate(self._group_lists) for p in g}

    # ---- the hook ----

    def _hook(self, p):
        key = id(p)
        if self._delay[key] <= 0:  # submitted, or waiting for its group, since the last step
            raise AssertionError("Gradients were computed more than backward_passes_per_step "
                                 "times before call to step(). Increase backward_passes_per_step "
                                 "to accumulate gradients locally.")
        self._delay[key] -= 1
        if self._delay[key] > 0:
            self._handles[key] = (None, p, None)
            return
        try:
            self._submit_ready(key, p)
        except BaseException:
            self._abandon()
            raise

    def _submit_ready(self, key, p):
        """Submits p's gradient, or its group's once the group is complete."""
        if self._groups is None:
            self._handles[key] = self._submit(p)
            return
        gi = self._groups[key]
        ready = self._group_ready.setdefault(gi, set())
        ready.add(key)
        self._handles[key] = (None, p, None)
        if len(ready) == len(self._group_lists[gi]):
            self._submit_group(gi)

    def _scale(self):
        f = self.gradient_predivide_factor
        if self.op == Average and f != 1.0:
            return 1.0 / f, f
        return 1.0, 1.0

    def _grad(self, p):
        """The gradient to reduce: p.grad, or a dense copy of a sparse one (put back sparse by
        _put, so that optimizers that need sparse gradients, SparseAdam, still get them)."""
        if p.grad is None:  # unused in forward: zeros, so that every rank takes part
            p.grad = torch.zeros_like(p)
        if p.grad.is_sparse:
            if not self.sparse_as_dense:
                raise NotImplementedError("sparse gradients: use sparse_as_dense=True")
            return p.grad.to_dense()
        return p.grad

    def _submit(self, p):
        """The allreduce of p's gradient: (handle, p, (compressed, ctx)), where handle is
        mpi_ops' or, for an uncompressed contiguous gradient, _Direct's."""
        grad = self._grad(p)
        if self._direct and grad.is_contiguous():
            return _Direct(grad, self._rt_names[id(p)], self.op, self._pre, self._post), p, \
                (grad, None)
        compressed, ctx = self._compression.compress(grad)
        h = allreduce_async_(compressed, name=self._names[id(p)], op=self.op,
                             prescale_factor=self._pre, postscale_factor=self._post)
        return h, p, (compressed, ctx)

    def _submit_group(self, gi):
        members = self._group_lists[gi]
        comp = [self._compression.compress(self._grad(p)) for p in members]
        h = mpi_ops.grouped_allreduce_async_([c for c, _ in comp],
                                             name=self._names[id(members[0])], op=self.op,
                                             prescale_factor=self._pre,
                                             postscale_factor=self._post)
        for p in members:
            self._handles.pop(id(p), None)
        self._handles[("group", gi)] = (h, members, comp)
        self._group_ready[gi] = set()

    # ---- synchronize, step ----

    def synchronize(self):
        """Submits what the hooks have not (unused parameters, gradients still accumulating),
        waits for every allreduce and puts the averaged gradients in place. If one fails, it
        still waits for the others, then raises the first error, with nothing left pending.
        Without hooks (one rank) there is nothing to average: as in Horovod, it does nothing."""
        if not self._hooks and not self._handles:
            self._synchronized = True
            return
        try:
            self._submit_rest()
        except BaseException:
            self._abandon()
            raise
        error = None
        for key, (h, target, ctx) in list(self._handles.items()):
            try:  # every handle, even after a failure: each must be released
                _wait(h)
                if isinstance(key, tuple):
                    for p, (compressed, c) in zip(target, ctx):
                        self._put(p, compressed, c)
                else:
                    self._put(target, *ctx)
            except Exception as e:
                error = error or e
        self._handles.clear()
        self._reset_passes()
        if error is not None:
            raise error
        self._synchronized = True

    def _submit_rest(self):
        for i, group in enumerate(self.param_groups):
            for j, p in enumerate(group["params"]):
                if p.requires_grad:
                    self._submit_unsubmitted(p, i, j)

    def _submit_unsubmitted(self, p, i, j):
        key = id(p)
        if key not in self._delay:
            self._adopt(p, i, j)
        gi = self._groups.get(key) if self._groups is not None else None
        if gi is not None:
            if ("group", gi) not in self._handles:
                self._submit_group(gi)
            return
        entry = self._handles.get(key)
        if entry is None or entry[0] is None:
            self._handles[key] = self._submit(p)

    def _adopt(self, p, i, j):
        """A parameter added after wrapping (add_param_group): named by its place, as Horovod
        names parameters without named_parameters, and reduced at step() (it has no hook).
        Horovod leaves such parameters out; their gradients would then differ between ranks."""
        name = "allreduce.noname.%d.%d" % (i, j)
        self._names[id(p)] = name
        self._rt_names[id(p)] = mpi_ops._name("allreduce", name)
        self._delay[id(p)] = self.backward_passes_per_step

    def _abandon(self):
        """After a failed submission: waits for what was submitted (the runtime writes into
        those gradients) and forgets everything pending, so the next backward starts afresh."""
        for h, _, _ in self._handles.values():
            if h is not None:
                try:
                    _wait(h)
                except Exception:
                    pass
        self._handles.clear()
        self._reset_passes()

    def _reset_passes(self):
        """The next step accumulates backward_passes_per_step passes again."""
        self._group_ready.clear()
        for k in self._delay:
            self._delay[k] = self.backward_passes_per_step

    def _put(self, p, compressed, ctx):
        out = self._compression.decompress(compressed, ctx)
        if p.grad.is_sparse:
            p.grad.zero_().add_(out.to_sparse())
        elif out.data_ptr() != p.grad.data_ptr():
            p.grad.copy_(out)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside it does not synchronize (call synchronize() yourself before)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize and (self._hooks or self._handles):
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def _hvd_local_step(self, closure=None):
        """The wrapped optimizer's step, without allreduces (broadcast_optimizer_state)."""
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        self._reset_passes()

    def load_state_dict(self, *args, **kwargs):
        self._handles.clear()
        self._synchronized = False
        self._should_synchronize = True
        self.set_backward_passes_per_step(self.backward_passes_per_step)
        return super(self.__class__, self).load_state_dict(*args, **kwargs)


class _Direct:
    """An in-place allreduce of a contiguous gradient submitted to the runtime as it is, without
    the checks and the handle table of allreduce_async_: the hook runs once per parameter and
    step, and this saves about 5 µs of each (docs/torch.md, "How DistributedOptimizer overlaps
    communication with backward")."""

    __slots__ = ("rt_handle", "grad")

    def __init__(self, grad, name, op, pre, post):
        self.grad = grad  # alive until waited for
        self.rt_handle = mpi_ops._allreduce_in_place(grad, name, op, pre, post)


def _wait(h):
    if isinstance(h, _Direct):
        mpi_ops._wait(h.rt_handle)
    else:
        synchronize(h)


def _elastic():
    import os
    return os.environ.get("HOROVOD_ELASTIC") == "1"


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=mpi_ops.global_process_set):
    """An optimizer of the same class as `optimizer` (isinstance holds) over the same parameter
    groups, whose step() averages each gradient over the ranks first (op: Average, Sum, ...).
    backward_passes_per_step: backward passes accumulated locally per allreduce.
    gradient_predivide_factor f: gradients are scaled by 1/f before the sum and f/size after.
    groups: an int (that many grouped allreduces) or lists of parameters allreduced together.
    compression: Compression.none or Compression.fp16."""
    mpi_ops._check_process_set(process_set)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if op == Adasum:
        raise NotImplementedError("Adasum is not supported by hvd_bridge.torch: use op=Average "
                                  "(the default) or Sum")
    if op not in (Average, Sum):
        raise ValueError("DistributedOptimizer averages or sums gradients: op must be Average or "
                         "Sum")
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v1.0", DeprecationWarning)
        groups = groups if groups is not None else num_groups
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    opt = cls.__new__(cls)
    # The same param groups, defaults and state, but not instance attributes that would hide
    # this class's methods: an LR scheduler made before wrapping sets optimizer.step, which
    # would step without the allreduces.
    opt.__dict__.update({k: v for k, v in optimizer.__dict__.items()
                         if k not in _DistributedOptimizer.__dict__})
    opt._hvd_setup(named_parameters, compression, backward_passes_per_step, op,
                   gradient_predivide_factor, groups, sparse_as_dense, process_set)
    return opt


__all__ = ["DistributedOptimizer", "Average", "Sum"]
