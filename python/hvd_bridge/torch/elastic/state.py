"""hvd_bridge.torch.elastic.state (horovod.torch.elastic.state): what an elastic job keeps
across resets: State, ObjectState and TorchState, with the handlers that keep a model, an
optimizer, an LR scheduler or an ElasticSampler through its state_dict."""
import copy
import io
import pickle

import cloudpickle
import torch

from ... import _runtime as _rt
from ..functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from ..mpi_ops import HostsUpdatedInterrupt, rank
from .sampler import ElasticSampler

#: An elastic call failed in a way a reset cannot cure (hvd_elastic_resettable is 0: a state
#: over the limit, a rank not started by hvd-exec, ...). Not a HorovodInternalError: @run fails
#: the rank with it instead of resetting the job into the same error again.
ElasticError = _rt.ElasticError


class State:
    """State kept across resets (Horovod's horovod.common.elastic.State). bcast_object and
    get_rank are Horovod's arguments: how sync() broadcasts objects and this rank's number
    (default: hvd_bridge.torch's broadcast_object and rank)."""

    def __init__(self, bcast_object=None, get_rank=None):
        self._bcast_object = bcast_object or broadcast_object
        self._get_rank = get_rank or rank
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions to call after a reset (when ranks were added or removed), before the
        training function runs again: e.g. to scale the learning rate with the new size."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def reset(self):
        """Called after a reset, before the reset callbacks: for subclasses to override."""

    def commit(self):
        """Saves the state in memory and in this rank's task service (the same on every rank,
        at the same point), then checks for host changes: raises HostsUpdatedInterrupt when
        there were some. Commits cost a copy and a transfer: commit every few batches."""
        self.save()
        self._store()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt when the driver says hosts came or are leaving
        (collective: every rank raises at the same point)."""
        if _rt.elastic_check_host_updates():
            raise HostsUpdatedInterrupt(False)

    def save(self):
        """Saves the state in memory."""
        raise NotImplementedError()

    def restore(self):
        """Goes back to the last saved state, undoing what came after."""
        raise NotImplementedError()

    def sync(self):
        """Makes every rank's state rank 0's."""
        raise NotImplementedError()

    # ---- what travels to the task service ----

    def _state_dict(self):
        """The saved state, for torch.save."""
        raise NotImplementedError()

    def _load_state_dict(self, saved):
        raise NotImplementedError()

    def _parts(self):
        """(what, object, trainable) of the saved state, to say which part is large when it is
        too large; trainable: a model's or an optimizer's (the user cannot just leave it out)."""
        return []

    def _store(self):
        buf = io.BytesIO()
        # cloudpickle: the keyword attributes may hold what plain pickle refuses (a lambda,
        # a LambdaLR), as broadcast_object in sync() takes them.
        try:
            torch.save(self._state_dict(), buf, pickle_module=cloudpickle)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise ElasticError(_unpicklable(e)) from e
        blob = buf.getvalue()
        try:
            _rt.elastic_save(blob)
        except ElasticError as e:
            if len(blob) <= _rt.ELASTIC_STATE_MAX:
                raise
            raise ElasticError(self._too_large(len(blob))) from e

    def _too_large(self, nbytes):
        limit = _rt.ELASTIC_STATE_MAX
        sizes = [(what, _saved_size(obj), trainable) for what, obj, trainable in self._parts()]
        parts = ", ".join("%s %s" % (what, _mib(n)) for what, n, _ in sizes)
        if sum(n for _, n, trainable in sizes if trainable) > limit:
            what = ("the model's and the optimizer's state_dicts alone are over it, so they "
                    "cannot be kept across resets: train a smaller model, or use an optimizer "
                    "that keeps less state (SGD with momentum keeps one buffer per parameter, "
                    "Adam two)")
        else:
            what = ("commit less: keep data sets, caches and other large objects out of the "
                    "state's keyword attributes")
        return ("the state to commit is %s%s, over the %d MiB a task service keeps "
                "(HVD_ELASTIC_STATE_MAX, fixed at build time): %s" % (
                    _mib(nbytes), " (%s)" % parts if parts else "", limit >> 20, what))

    def _restore_committed(self):
        """Loads the newest commit that survives, on every rank (collective). Returns whether
        there was one."""
        blob = _rt.elastic_restore()
        if blob is None:
            return False
        self._load_state_dict(torch.load(io.BytesIO(blob), weights_only=False))
        self.save()
        return True


class ObjectState(State):
    """Plain Python attributes, given as keyword arguments (Horovod's ObjectState)."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            # Every rank, before rank 0's broadcast: a state that cannot be pickled fails every
            # rank at once (ElasticError), not rank 0 alone, whose host a reset would blame.
            _pickled(self._saved_state)
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)

    def _state_dict(self):
        return {"objects": self._saved_state}

    def _parts(self):
        return [("the keyword attributes", self._saved_state, False)]

    def _load_state_dict(self, saved):
        self._saved_state = saved["objects"]
        self._set_attrs()


class _Handler:
    """How TorchState keeps a model or an optimizer (each argument that is a torch.nn.Module
    or a torch.optim.Optimizer, as Horovod's state handlers): by its state_dict, loaded back
    into the same object, never replaced by a copy."""

    def __init__(self, value):
        self.value = value
        self.save()

    def set_value(self, value):
        self.value = value
        self.save()

    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.saved)


class _ModelHandler(_Handler):
    def sync(self, state):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self, state):
        # The models of the state tell broadcast_optimizer_state which parameters are sparse.
        models = [h.value for h in state._handlers.values() if isinstance(h, _ModelHandler)]
        broadcast_optimizer_state(self.value, root_rank=0,
                                  model=torch.nn.ModuleList(models) if models else None)


class _StateDictHandler(_Handler):
    """An ElasticSampler or an LR scheduler: rank 0's state_dict, loaded into each rank's own
    object (a broadcast copy of a scheduler would step a copy of the optimizer)."""

    def sync(self, state):
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))


def _scheduler_types():
    from torch.optim import lr_scheduler
    return tuple(t for t in (getattr(lr_scheduler, "LRScheduler", None),
                             getattr(lr_scheduler, "_LRScheduler", None),
                             lr_scheduler.ReduceLROnPlateau) if t is not None)


def _handler(value):
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, (ElasticSampler,) + _scheduler_types()):
        return _StateDictHandler(value)
    return None


class TorchState(ObjectState):
    """Models, optimizers and keyword attributes (Horovod's TorchState): every argument that is
    a torch.nn.Module, a torch.optim.Optimizer, an LR scheduler or an ElasticSampler (model,
    optimizer, or any keyword: a GAN's two models and two optimizers, lr_scheduler=sched) is
    saved, restored and synced through its state_dict, so each rank keeps its own object (a
    scheduler keeps stepping the optimizer it was made for); the other keyword arguments as
    ObjectState's attributes."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers = {}
        for name in list(kwargs):
            h = _handler(kwargs[name])
            if h is not None:
                handlers[name] = h
                object.__setattr__(self, name, kwargs.pop(name))
        object.__setattr__(self, "_handlers", handlers)
        super().__init__(**kwargs)

    def __setattr__(self, name, value):
        # state.model = another_model: that one is kept from now on.
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)

    def save(self):
        for h in self._handlers.values():
            h.save()
        super().save()

    def restore(self):
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def sync(self):
        for h in self._handlers.values():
            h.sync(self)
        super().sync()

    def _state_dict(self):
        out = super()._state_dict()
        out["state_dicts"] = {name: h.saved for name, h in self._handlers.items()}
        return out

    def _parts(self):
        return [(_part_name(name), h.saved, True)
                for name, h in self._handlers.items()] + super()._parts()

    def _load_state_dict(self, saved):
        for name, state_dict in saved.get("state_dicts", {}).items():
            h = self._handlers.get(name)
            if h is not None:
                h.saved = state_dict
                h.restore()
        super()._load_state_dict(saved)


def _unpicklable(e):
    return ("the state cannot be pickled (%s: %s): keep locks, sockets, open files, generators "
            "and the like out of its keyword attributes" % (type(e).__name__, e))


def _pickled(objects):
    """objects pickled as broadcast_object and a commit pickle them, or ElasticError."""
    try:
        return cloudpickle.dumps(objects)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise ElasticError(_unpicklable(e)) from e


def _part_name(name):
    return {"model": "the model's state_dict", "optimizer": "the optimizer's"}.get(
        name, "%s's state_dict" % name)


def _mib(n):
    return "%.1f MiB" % (n / float(1 << 20))


def _saved_size(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.tell()
