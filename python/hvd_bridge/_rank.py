"""The rank side of a Python entry point: ``hvd-exec`` starts ``python -m hvd_bridge._rank``
with the pickled ``(fn, args, kwargs)`` on descriptor ``$HVD_PAYLOAD_FD`` (after a line saying
which Python and cloudpickle pickled it: ``_job.payload``) and collects what it
writes on ``$HVD_RESULT_FD``: ``("ok", value)`` or ``("error", type name, message,
traceback)``, pickled with cloudpickle. An exception also goes to stderr as usual, and the
process exits 1.
"""
import os
import sys
import traceback


def _read_all(fd):
    chunks = []
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def main():
    import cloudpickle

    # One write per line: mpirun tags what it reads ("[1,rank]<stdout>:"), and a line must
    # reach the driver whole and soon, not when a block buffer fills.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=False)
        except (AttributeError, ValueError):
            pass
    payload_fd = int(os.environ["HVD_PAYLOAD_FD"])
    result_fd = int(os.environ["HVD_RESULT_FD"])
    status = 0
    try:
        from ._job import payload_load
        fn, args, kwargs = payload_load(_read_all(payload_fd))
        os.close(payload_fd)
        value = fn(*args, **(kwargs or {}))
        try:
            out = cloudpickle.dumps(("ok", value))
        except Exception as e:  # the value cannot travel
            raise TypeError("the function's return value cannot be pickled: %s" % e) from e
    except BaseException as e:  # SystemExit and KeyboardInterrupt included: the rank failed
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        sys.stderr.flush()
        out = cloudpickle.dumps(("error", type(e).__name__, str(e), tb))
        status = e.code if isinstance(e, SystemExit) and isinstance(e.code, int) and e.code else 1
        from . import _follower
        _follower.linger(e)  # a follower of another rank's failure reports after it
    sys.stdout.flush()
    _write_all(result_fd, out)
    os.close(result_fd)
    sys.exit(status)


if __name__ == "__main__":
    main()
