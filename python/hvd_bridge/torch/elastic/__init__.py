"""hvd_bridge.torch.elastic: horovod.torch.elastic's API on hvd-bridge's elastic jobs
(docs/elastic.md). With ``import hvd_bridge.torch as hvd``::

    state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch in range(state.batch, batches):
                step(...)
                if state.batch % 10 == 0:
                    state.commit()          # raises HostsUpdatedInterrupt when hosts changed
            state.batch = 0

    train(state)

Open MPI cannot grow or shrink a job, so a reset restarts the ranks: ``commit()`` sends the
state (model, optimizer, and the keyword attributes) to this rank's task service, which
outlives the ranks, and ``@run`` starts by restoring the newest commit that survives (in sync
on every rank) before calling the function. When the hosts change, or a collective fails
because a rank went away, the rank ends at once with status 75 and the driver resets the job.
An error a reset cannot cure (ElasticError: e.g. a state over the 60 MiB a task service keeps)
fails the rank instead, with one line saying what to do. Outside an elastic job nothing is
committed anywhere and the function runs once, as with a plain ``hvd.init()``.
"""
import functools
import os
import sys

from ... import _follower
from ... import _runtime as _rt
from ..mpi_ops import (HorovodInternalError, HostsUpdatedInterrupt, init, is_initialized, rank,
                       shutdown)
from .sampler import ElasticSampler
from .state import ElasticError, ObjectState, State, TorchState

#: The status a rank ends with for a reset (HVD_ELASTIC_EXIT_RESET of include/hvd/defaults.h).
RESET_STATUS = 75
#: The status a rank ends with for an ElasticError (a failure of its own: no reset).
FAILURE_STATUS = 1


def _epoch():
    try:
        return int(os.environ.get("HVD_ELASTIC_EPOCH", "0"))
    except ValueError:
        return 0


def _end_for_reset(why, together):
    """Ends this rank for a reset: the driver starts the job again over the hosts it has. When
    every rank ends at the same point (together: the hosts changed), the runtime is shut down
    first, so that mpirun sees a clean end instead of aborting the job."""
    sys.stderr.write("hvd_bridge.torch.elastic: rank %d ends for a reset (%s)\n" % (rank(), why))
    if together:
        shutdown()
    _exit_flushed(RESET_STATUS)


def _end_for_failure(e):
    """Ends this rank for an error a reset cannot cure, with status 1 and one line saying why
    (hvd-exec passes a rank's last line on stderr to the driver). When every rank fails so (a
    state over the limit is the same everywhere), the driver ends the job with the error; when
    only this one does, its host is blamed and the job goes on without it."""
    sys.stderr.write("hvd_bridge.torch.elastic: rank %d fails (a reset would not help): %s\n" % (
        rank(), str(e).replace("\n", " ")))
    _exit_flushed(FAILURE_STATUS)


def _exit_flushed(status):
    """Ends the process at once with status, after flushing what it wrote."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed stream must not keep the rank alive
            pass
    os._exit(status)


def run(func):
    """Decorator of the training function ``func(state, *args, **kwargs)``: starts the runtime
    if needed, restores the newest commit that survives (or, on a fresh start, syncs the state
    from rank 0), calls the reset callbacks after a reset, and runs the function. When the
    hosts change (HostsUpdatedInterrupt at a commit) or a collective fails because a rank went
    away (HorovodInternalError), the rank ends with status 75 and the job is reset: Horovod
    retries in the same process, hvd-bridge restarts the ranks (Open MPI cannot resize a job).
    An ElasticError (a commit, restore or host check that no reset would cure, e.g. a state
    over the limit) ends the rank with status 1 and one line saying why: a failure, not a reset.
    """

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not is_initialized():
            init()
        elastic = bool(_rt.elastic_enabled())
        try:
            if not state._restore_committed():
                state.sync()
                state.save()
            if _epoch() > 1:
                state.on_reset()
            return func(state, *args, **kwargs)
        except HostsUpdatedInterrupt:
            if not elastic:
                raise
            _end_for_reset("the hosts changed", True)
        except HorovodInternalError as e:
            if not elastic:
                raise
            _follower.linger(e)  # the rank that failed on its own is heard first, and blamed
            _end_for_reset("a collective failed: %s" % e, False)
        except ElasticError as e:
            if not elastic:
                raise
            _end_for_failure(e)

    return wrapper


__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler", "ElasticError",
           "RESET_STATUS", "FAILURE_STATUS"]
