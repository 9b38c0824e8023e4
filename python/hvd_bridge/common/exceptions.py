"""hvd_bridge.common.exceptions (horovod.common.exceptions): the exceptions of collectives and
elastic jobs, the same classes hvd_bridge.torch raises, so that ``from
horovod.common.exceptions import HorovodInternalError`` ports by changing the package name."""
from .. import _runtime

#: A collective failed (a mismatch between ranks, a rank gone, the runtime shut down); in an
#: elastic job, @hvd.elastic.run resets the job.
HorovodInternalError = _runtime.HorovodInternalError


class HostsUpdatedInterrupt(RuntimeError):
    """Raised (by elastic code) when hosts were added or removed; ``skip_sync`` tells whether the
    state can be kept without a sync."""

    def __init__(self, skip_sync):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync
