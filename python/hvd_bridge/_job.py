"""What ``hvd_bridge.run`` and ``hvd_bridge.spark.run`` share: the entry point shipped to the
ranks, output forwarding, and turning the ranks' results into return values or an error."""
import codecs
import collections
import io
import json
import operator
import os
import pickle
import platform
import shlex
import sys
import threading

#: The module every rank runs (its argv after the interpreter).
RANK_MODULE = ["-m", "hvd_bridge._rank"]


class JobError(RuntimeError):
    """A job failed. ``rank``, ``task`` and ``host`` name the rank that failed first on its own
    (not one stopped because another failed); ``remote_traceback`` is its Python traceback when
    its function raised; ``results`` has every rank's outcome (``RankOutcome``)."""

    def __init__(self, message, rank=None, task=None, host=None, remote_traceback=None,
                 results=None):
        super().__init__(message)
        self.rank = rank
        self.task = task
        self.host = host
        self.remote_traceback = remote_traceback
        self.results = results or []


class RankOutcome:
    """One rank's outcome as the driver saw it."""

    __slots__ = ("rank", "task", "host", "present", "status", "error", "order", "stopped",
                 "value", "exc_type", "exc_message", "remote_traceback", "no_result",
                 "unreadable")

    def __init__(self, row):
        (self.rank, self.task, self.host, self.present, self.status, data, self.error,
         self.order, self.stopped) = row
        self.value = None
        self.exc_type = self.exc_message = self.remote_traceback = None
        self.unreadable = None  # why this process could not unpickle what the rank sent
        # Every rank of ours writes ("ok", value) or ("error", ...): nothing means the process
        # ended without getting there (os._exit(0), or exec of another program).
        self.no_result = bool(self.present and not data and self.status == 0)
        if self.present and data:
            try:
                kind, *rest = pickle.loads(data)
            except Exception as e:  # not ours, or a class the driver cannot import
                self.unreadable = "%s: %s" % (type(e).__name__, e)
                kind, rest = "error", ["UnpicklingError", str(e), ""]
            if kind == "ok":
                self.value = rest[0]
            else:
                self.exc_type, self.exc_message, self.remote_traceback = rest

    @property
    def ok(self):
        return (self.present and self.status == 0 and self.exc_type is None and
                not self.no_result)

    def __repr__(self):
        return "RankOutcome(rank=%d, task=%d, host=%r, status=%r, error=%r)" % (
            self.rank, self.task, self.host, self.status if self.present else None,
            self.error or self.exc_type)


def payload(fn, args, kwargs):
    """The pickled entry point every rank unpickles and calls; TypeError saying so when fn,
    args or kwargs cannot be pickled."""
    import cloudpickle

    if not callable(fn):
        raise TypeError("the function to run must be callable, got %s" % type(fn).__name__)
    if args is not None and not isinstance(args, (tuple, list)):
        raise TypeError("args must be a tuple or a list, got %s" % type(args).__name__)
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError("kwargs must be a dict, got %s" % type(kwargs).__name__)
    bad = [k for k in (kwargs or {}) if not isinstance(k, str)]
    if bad:
        raise TypeError("kwargs must be a dict of keyword names (str), got the key %r" % (bad[0],))
    try:
        pickled = cloudpickle.dumps((fn, tuple(args or ()), dict(kwargs or {})))
    except Exception as e:  # TypeError, PicklingError, AttributeError, ...: one message
        raise TypeError("the function and its args and kwargs must be picklable (cloudpickle) "
                        "to reach the ranks: %s" % e) from e
    return payload_header() + pickled


PAYLOAD_MAGIC = b"hvd-bridge payload 1\n"


def payload_header():
    """What pickled the payload (a JSON line after PAYLOAD_MAGIC), so that a rank that cannot
    unpickle it can say which Python and cloudpickle did."""
    import cloudpickle

    return PAYLOAD_MAGIC + json.dumps({
        "python": platform.python_version(), "cloudpickle": cloudpickle.__version__,
        "executable": sys.executable}).encode() + b"\n"


def payload_load(data):
    """A rank's side of payload(): (fn, args, kwargs); an error saying which Python and
    cloudpickle pickled it and which this rank has when they differ and it cannot be loaded
    (a Spark worker's Python that is not the driver's, say)."""
    import cloudpickle

    view, made_by = memoryview(data), {}
    if data.startswith(PAYLOAD_MAGIC):
        end = data.index(b"\n", len(PAYLOAD_MAGIC))
        made_by = json.loads(data[len(PAYLOAD_MAGIC):end])
        view = view[end + 1:]
    try:
        return cloudpickle.loads(view)
    except Exception as e:
        here = {"python": platform.python_version(), "cloudpickle": cloudpickle.__version__,
                "executable": sys.executable}
        if not made_by or all(made_by.get(k) == here[k] for k in ("python", "cloudpickle")):
            raise
        raise RuntimeError(
            "cannot unpickle the function (%s: %s): it was pickled by cloudpickle %s under "
            "Python %s (%s), this rank has cloudpickle %s under Python %s (%s): run the ranks "
            "in the driver's Python environment (Spark: PYSPARK_PYTHON or "
            "spark.pyspark.python; hvd_bridge.run: executable=)" % (
                type(e).__name__, e, made_by.get("cloudpickle"), made_by.get("python"),
                made_by.get("executable"), here["cloudpickle"], here["python"],
                here["executable"])) from e


def rank_count(n, what):
    """n (a number of ranks given as argument what), checked: a whole number of at least 1
    (an int, or an integer type that says it is one, such as numpy's int64)."""
    try:
        count = None if isinstance(n, bool) else operator.index(n)
    except TypeError:
        count = None
    if count is None or count < 1:
        raise ValueError("%s must be a whole number of at least 1, got %r" % (what, n))
    return count


def either(value, name, alias_value, alias_name):
    """The value of an argument that has two names (np and num_proc, ...): whichever was
    given; ValueError when both were given with different values."""
    if value is not None and alias_value is not None and value != alias_value:
        raise ValueError("%s=%r and %s=%r name the same thing: give one of them" % (
            name, value, alias_name, alias_value))
    return value if value is not None else alias_value


def text_stream(stream, default, what):
    """stream (argument what), or default when it is None; TypeError when it has no write
    method or is a binary stream (a file opened with 'b', io.BytesIO): the ranks' output
    would otherwise be dropped without a word."""
    if stream is None:
        return default
    if not callable(getattr(stream, "write", None)):
        raise TypeError("%s must be a text stream with a write method (e.g. sys.stdout or a "
                        "file opened for writing), got %s" % (what, type(stream).__name__))
    if isinstance(stream, (io.RawIOBase, io.BufferedIOBase)):
        raise TypeError("%s must be a text stream, got the binary %s: open the file without "
                        "'b' (or use io.StringIO)" % (what, type(stream).__name__))
    return stream


def rank_argv(executable):
    """The program each rank runs. Without an executable, the interpreter is the one the task
    service names in $HVD_PYTHON (the Python of the process it runs in), else python3."""
    if executable:
        return [executable] + RANK_MODULE
    # "python": the shell's $0, the name hvd-exec gives the program in a rank's failure
    return ["/bin/sh", "-c", 'exec "${HVD_PYTHON:-python3}" ' + " ".join(RANK_MODULE), "python"]


def only_mpi(use_gloo, use_mpi):
    """ValueError when the caller asks for Gloo: hvd-bridge runs every job with MPI. As in
    Horovod, use_mpi=False alone does not ask for Gloo (MPI still runs where it is built);
    use_gloo=True does, and both True is Horovod's error."""
    if use_gloo and use_mpi:
        raise ValueError("use_gloo and use_mpi are both True: ask for one of them")
    if use_gloo:
        raise ValueError("hvd-bridge runs jobs with MPI; use_gloo is not supported")


def nic_list(nics, what="nics"):
    """The interfaces a job is told to use, or None (nothing given, or empty: the tasks find
    them); a string names one or several (comma-separated: "eth0" or "eth0, ib0"), else an
    iterable of names."""
    if not nics:
        return None
    try:
        raw = nics.split(",") if isinstance(nics, str) else list(nics)
    except TypeError:  # not iterable
        raw = [nics]
    names = [n.strip() if isinstance(n, str) else n for n in raw]
    if not all(isinstance(n, str) and n and "," not in n for n in names):
        raise ValueError("%s must name network interfaces (e.g. ['eth0'] or 'eth0,ib0'), got %r"
                         % (what, nics))
    return names


def verbosity(verbose):
    """verbose as a number (0, 1, 2; True is 1); ValueError when it is not one."""
    try:
        return 0 if verbose is None else operator.index(verbose)
    except TypeError:
        raise ValueError("verbose must be 0, 1 or 2, got %r" % (verbose,)) from None


def mpi_args(extra_mpi_args, env, prefix_output_with_timestamp, what="extra_mpi_args"):
    """mpirun arguments: the user's (a string, split like a shell), the variables of env for
    the ranks (-x NAME=VALUE), and mpirun's timestamps when asked."""
    try:
        args = shlex.split(extra_mpi_args) if isinstance(extra_mpi_args, str) else list(
            extra_mpi_args or [])
    except ValueError as e:  # shlex: "No closing quotation"
        raise ValueError("%s %r cannot be split like a shell command line: %s" % (
            what, extra_mpi_args, e)) from None
    except TypeError:  # not iterable
        args = [extra_mpi_args]
    if not all(isinstance(a, str) for a in args):
        raise TypeError("%s must be a string or a list of strings, got %r" % (
            what, extra_mpi_args))
    if env is not None and not isinstance(env, dict):
        raise ValueError("env must be a dict, not %s" % type(env).__name__)
    for k, v in (env or {}).items():
        if not isinstance(k, str) or not k or "=" in k or any(c.isspace() for c in k):
            raise ValueError("env: %r is no environment variable name" % (k,))
        if not isinstance(v, str):
            raise TypeError("env[%r] must be a str, got %s" % (k, type(v).__name__))
        args += ["-x", "%s=%s" % (k, v)]
    if prefix_output_with_timestamp and _timestamps_known():
        args.append("--timestamp-output")
    return args


def _timestamps_known():
    """Whether the launcher takes Open MPI's --timestamp-output: not MPICH's mpiexec (Horovod
    leaves it out there too), said once as a warning."""
    from . import _core
    try:
        impl = _core.mpi_detect()[0]
    except Exception:  # noqa: BLE001 - no launcher to ask: the launch says why
        return True
    if impl == "mpich":
        import warnings
        warnings.warn("prefix_output_with_timestamp is ignored: MPICH's mpiexec has no "
                      "timestamps", stacklevel=3)
        return False
    return True


#: hvd-driver's failure sentence when ranks were stopped and it saw no part of the job fail on
#: its own (driver_service/launcher_report.c): a rank that ended with status 0 without its
#: result is what failed then.
NOTHING_FAILED = "no part of the job failed on its own"


def values_or_raise(rows, mpirun_status, stop_reason=None, failure=None, first_failed=-1):
    """The ranks' return values in rank order, or a JobError naming what failed first: why the
    job was stopped; else ``failure`` (the driver's sentence for the part of the job that
    failed first on its own: a rank, a task service, an agent, orted), with the Python
    traceback when that part is a rank whose function raised; a rank that ended with status 0
    without its result (os._exit(0)) before a failure blamed on no part, where mpirun then
    stopped the others; else mpirun's status.
    ``first_failed`` is the rank that failed first on its own (-1: none)."""
    outcomes = [RankOutcome(r) for r in sorted(rows, key=lambda r: r[0])]
    if mpirun_status == 0 and not stop_reason and all(o.ok for o in outcomes):
        return [o.value for o in outcomes]
    bad = outcomes[first_failed] if 0 <= first_failed < len(outcomes) else None
    if bad is not None and failure and not failure.startswith("rank %d " % bad.rank):
        bad = None  # something else failed first: the rank only followed
    if stop_reason:
        msg = "the job was stopped: %s" % stop_reason
    elif bad is not None and bad.exc_type is not None:
        msg = "rank %d (task %d on %s) raised %s: %s\n\nRemote traceback:\n%s" % (
            bad.rank, bad.task, bad.host or "?", bad.exc_type, bad.exc_message,
            bad.remote_traceback)
    elif failure and not (NOTHING_FAILED in failure and any(o.no_result for o in outcomes)):
        msg = failure  # else a rank that ended with status 0 without its result came first
    elif any(o.unreadable for o in outcomes):
        bad = next(o for o in outcomes if o.unreadable)
        msg = ("rank %d (task %d on %s) returned a value this process cannot unpickle: %s "
               "(return values of types this process can import: plain Python values, tensors, "
               "or classes of modules installed here)" % (bad.rank, bad.task, bad.host or "?",
                                                          bad.unreadable))
    elif any(o.no_result for o in outcomes):
        bad = next(o for o in outcomes if o.no_result)
        msg = ("rank %d (task %d on %s) exited with status 0 without returning a result "
               "(os._exit, or exec of another program, before the function returned?)" % (
                   bad.rank, bad.task, bad.host or "?"))
    else:
        msg = "mpirun exited with status %d" % mpirun_status
    kw = {}
    if bad is not None:
        kw = dict(rank=bad.rank, task=bad.task, host=bad.host,
                  remote_traceback=bad.remote_traceback)
    raise JobError(msg, results=outcomes, **kw)


class OutputForwarder:
    """Copies what a pipe carries to a text stream, one line at a time (incremental UTF-8),
    flushing after each line, on a thread of its own. ``fd`` is the write end to hand on."""

    def __init__(self, stream):
        self.stream = stream
        self._failed = False  # a write failed (said once)
        self.last_lines = collections.deque(maxlen=8)  # for error messages
        r, w = os.pipe()
        self._r = r
        self.fd = w
        self._thread = threading.Thread(target=self._pump, name="hvd-bridge output",
                                        daemon=True)
        self._thread.start()

    def _write(self, text):
        if self._failed:
            return
        try:
            self.stream.write(text)
            flush = getattr(self.stream, "flush", None)
            if flush:
                flush()
        except Exception as e:  # noqa: BLE001 - a closed stream must not kill the job
            self._failed = True  # the pump goes on reading, so that no rank blocks on the pipe
            self._say_failed(e)

    def _say_failed(self, e):
        try:
            where = sys.__stderr__ if sys.__stderr__ is not None else None
            if where is not None and where is not self.stream:
                print("hvd_bridge: cannot write the ranks' output to %s (%s: %s); the rest of "
                      "it is dropped" % (type(self.stream).__name__, type(e).__name__, e),
                      file=where, flush=True)
        except Exception:  # noqa: BLE001 - nowhere to say it: dropping is all that is left
            pass

    LONG_LINE = 1 << 20  # a line without its end this long is written on in pieces

    def _pump(self):
        """Linear in the output, however long its lines: the unfinished line is kept in pieces
        (joining it at every read made a 40 MB line take 37 s), and one longer than LONG_LINE
        (a progress bar's \\r updates) is written as it comes."""
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        parts, size = [], 0  # the unfinished line
        while True:
            chunk = os.read(self._r, 65536)
            text = dec.decode(chunk, final=not chunk)
            if "\n" in text:
                first, *lines, rest = text.split("\n")
                parts.append(first)
                lines.insert(0, "".join(parts))
                for line in lines:
                    self.last_lines.append(line)
                    self._write(line + "\n")
                parts, size = [rest], len(rest)
            elif text:
                parts.append(text)
                size += len(text)
                if size >= self.LONG_LINE:
                    self._write("".join(parts))
                    parts, size = [], 0
            if not chunk:
                break
        if size or any(parts):
            self._write("".join(parts))
        os.close(self._r)

    def close_writer(self):
        """Closes our copy of the write end: the thread ends once every writer has."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def join(self, timeout=None):
        self.close_writer()
        self._thread.join(timeout)


def timeout_s(value, env_name, default, what):
    """A timeout in seconds: the argument what, else the environment variable, else the
    default; ValueError naming the one that is not a number of seconds above 0."""
    source, raw = (what, value) if value is not None else (env_name, os.environ.get(env_name))
    if raw is None:
        return float(default)
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        seconds = None
    if isinstance(raw, bool) or seconds is None or not seconds > 0:
        raise ValueError("%s must be a number of seconds above 0, got %r" % (source, raw))
    if seconds > TIMEOUT_MAX_S:
        raise ValueError("%s must be at most %d seconds, got %r" % (source, TIMEOUT_MAX_S, raw))
    return seconds


TIMEOUT_MAX_S = 1 << 30  # hvd-driver's bound of its timeouts


