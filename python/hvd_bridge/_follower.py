"""A rank whose collective failed only because another rank shut the runtime down (that rank's
own code raised, and its exit shut the runtime down) is a follower: it waits a moment before it
raises, reports or ends, so that the rank whose failure started it all ends and reports first.
The job's error (hvd_bridge.run, hvd-driver's last line) and an elastic job's blame then name
that rank, and mpirun stops the follower meanwhile."""
import time

# The runtime's words for such a failure (runtime/controller.c, runtime/cycle.c): a pending
# collective ("the runtime was shut down (hvd_shutdown on rank 1) while tensor ..."), one in
# flight or submitted afterwards ("... another rank called hvd_shutdown").
_WORDS = ("(hvd_shutdown on ", "another rank called hvd_shutdown")
LINGER_S = 1.0
_lingered = [False]


def follows_a_peer(e):
    return type(e).__name__ == "HorovodInternalError" and any(w in str(e) for w in _WORDS)


def linger(e):
    """Waits LINGER_S when e follows a peer's shutdown, once per process."""
    if follows_a_peer(e) and not _lingered[0]:
        _lingered[0] = True
        time.sleep(LINGER_S)
