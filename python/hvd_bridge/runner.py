"""``hvd_bridge.run``: a Python function as an MPI job without Spark, like ``horovod.run``.
The job runs through ``hvd-driver run``: task services on this machine (the default), or on
ssh hosts (``hosts="h1:2,h2:2"``), mpirun through ``hvd-rsh``, and each rank calling the
function in a Python interpreter."""
import fcntl
import json
import math
import operator
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from . import _core, _job, bin_dir

_ELASTIC = ("min_num_proc", "max_num_proc", "slots", "reset_limit", "cooldown_range",
            "host_discovery_script", "min_np", "max_np", "elastic_timeout")


def _elastic_flags(elastic):
    """hvd-driver's elastic options from horovod.run's keyword arguments (docs/elastic.md)."""
    e = {k: v for k, v in elastic.items() if v is not None}
    flags = []
    for name, opt in (("min_np", "--min-np"), ("max_np", "--max-np"),
                      ("host_discovery_script", "--host-discovery-script"), ("slots", "--slots"),
                      ("reset_limit", "--reset-limit"), ("elastic_timeout", "--elastic-timeout")):
        if name in e:
            flags += [opt, str(e[name])]
    for name in ("min_np", "max_np", "slots"):
        if name in e:
            _job.rank_count(e[name], name)
    limit = e.get("reset_limit", 0)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= 1 << 30:
        raise ValueError("reset_limit must be a whole number from 0 to 2**30, got %r" % (limit,))
    if "elastic_timeout" in e:
        e["elastic_timeout"] = math.ceil(_job.timeout_s(e["elastic_timeout"], None, None,
                                                        "elastic_timeout"))
        flags[flags.index("--elastic-timeout") + 1] = str(e["elastic_timeout"])
    if e.get("min_np", 1) > e.get("max_np", e.get("min_np", 1)):
        raise ValueError("min_np (%d) must not exceed max_np (%d)" % (e["min_np"], e["max_np"]))
    if "cooldown_range" in e:
        c = e["cooldown_range"]
        if (not isinstance(c, (tuple, list)) or len(c) != 2 or
                not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in c) or
                c[0] > c[1]):
            raise ValueError("cooldown_range must be (min, max) seconds, whole numbers with "
                             "0 <= min <= max, got %r" % (c,))
        flags += ["--blacklist-cooldown-range", str(c[0]), str(c[1])]
    if flags and not any(f in flags for f in ("--min-np", "--host-discovery-script")):
        flags += ["--min-np", "1"]  # --max-np alone: elastic from one rank up
    return flags


def _slots(hosts):
    total = 0
    for entry in hosts.split(","):
        tail = entry.rsplit("]", 1)[-1]
        try:
            total += int(tail.split(":")[1]) if ":" in tail else 1
        except ValueError:
            raise ValueError("hosts: %r is no host:slots (e.g. 'node1:2')" % (entry,)) from None
    return total


def _host_list(hosts):
    """hosts ("h1:2, h2:2") without white space around its entries, or ValueError when it
    names no host."""
    entries = [e.strip() for e in hosts.split(",") if e.strip()]
    if not entries:
        raise ValueError("hosts names no host: %r" % (hosts,))
    return ",".join(entries)


def _ssh_port(port):
    """ssh_port as a number from 1 to 65535, or None for ssh's default (None or 0, as
    horovod.run takes a false port); a string of digits is taken as horovod.run does; else
    ValueError."""
    if port is None or (not isinstance(port, bool) and port == 0):
        return None
    value = None
    if isinstance(port, str) and port.strip().isdigit():
        value = int(port)
    elif not isinstance(port, bool):
        try:
            value = operator.index(port)
        except TypeError:
            pass
    if value is None or not 0 <= value <= 65535:
        raise ValueError("ssh_port must be a whole number from 1 to 65535, got %r" % (port,))
    return value or None


def _driver_command(np_, hosts, payload_file, results_file, start_timeout, ssh_port,
                    ssh_identity_file, nics, mpi_args, verbose, executable, elastic=(),
                    lifeline_fd=None, work_dir=None, output_filename=None):
    cmd = [os.path.join(bin_dir(), "hvd-driver"), "run", "-np", str(np_)]
    if lifeline_fd is not None:  # this process's end stops the job and removes work_dir
        cmd += ["--lifeline-fd", str(lifeline_fd), "--lifeline-dir", work_dir]
    if hosts:  # horovodrun's -H: this machine alone ("localhost:2") runs without ssh
        cmd += ["-H", hosts]
        if ssh_port is not None:
            cmd += ["--ssh-port", str(ssh_port)]
        if ssh_identity_file:
            cmd += ["--ssh-identity", ssh_identity_file]
    else:
        cmd += ["--local", "1"]
    cmd += ["--start-timeout", str(math.ceil(start_timeout)), "--results-json", results_file,
            "--payload", payload_file]
    if nics:
        cmd += ["--nics", ",".join(nics)]
    if output_filename:
        cmd += ["--output-filename", os.path.abspath(output_filename)]
    for a in mpi_args:
        cmd += ["--mpi-arg", a]
    cmd.append("--verbose" if verbose else "--quiet")
    return cmd + list(elastic) + ["--"] + _job.rank_argv(executable or sys.executable)


def _rows(results_file):
    with open(results_file) as f:
        doc = json.load(f)
    rows = [(r["rank"], -1 if r["task"] is None else r["task"], r["host_hash"], r["reported"],
             r["status"], bytes.fromhex(r["result_hex"]), r["error"], r["order"], r["stopped"])
            for r in doc["ranks"]]
    first = doc["first_failed_rank"]
    return rows, doc["mpirun_status"], doc.get("failure"), -1 if first is None else first


class _Terminated(BaseException):
    """SIGTERM reached this process while run() waited: the job is stopped and its files
    removed, then the process ends by SIGTERM as it would have."""


class _TerminateStopsJob:
    """While run() runs (in the main thread), SIGTERM raises _Terminated instead of ending the
    process at once, which would leave the job's directory (the pickled function) behind."""

    def __enter__(self):
        self.prev = None
        if threading.current_thread() is threading.main_thread():
            self.prev = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise _Terminated()

    def __exit__(self, kind, value, tb):
        if self.prev is not None:
            signal.signal(signal.SIGTERM, self.prev)
        if kind is _Terminated:
            os.kill(os.getpid(), signal.SIGTERM)  # as the sender meant, once cleaned up
        return False


class _Lifeline:
    """A pipe for hvd-driver --lifeline-fd: only this process holds its write end, so the end
    closes however the process ends (SIGKILL, the OOM killer, a notebook kernel restarted), and
    hvd-driver then stops the job and removes its work directory (--lifeline-dir)."""

    _write_ends = set()  # of the runs in progress: closed in a child forked meanwhile

    def __init__(self):
        r, w = os.pipe()
        if r < 3:  # a process started with 0-2 closed: hvd-driver takes 3 and up
            r2 = fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, 3)
            os.close(r)
            r = r2
        self.read_fd, self._w = r, w
        _Lifeline._write_ends.add(w)

    def close_read(self):
        fd, self.read_fd = self.read_fd, -1
        if fd >= 0:
            os.close(fd)

    def close(self):
        self.close_read()
        fd, self._w = self._w, -1
        if fd >= 0:
            _Lifeline._write_ends.discard(fd)
            os.close(fd)

    @staticmethod
    def _close_in_child():
        """A child forked without exec (multiprocessing's fork) would keep the write ends
        open, and hvd-driver would never see this process go."""
        for fd in _Lifeline._write_ends:
            try:
                os.close(fd)
            except OSError:
                pass
        _Lifeline._write_ends = set()


os.register_at_fork(after_in_child=_Lifeline._close_in_child)


def _wait(proc):
    """Waits for hvd-driver; Ctrl-C (or SIGTERM) stops the job (hvd-driver takes everything
    down)."""
    try:
        return proc.wait()
    except (KeyboardInterrupt, _Terminated) as e:
        proc.send_signal(signal.SIGINT if isinstance(e, KeyboardInterrupt) else signal.SIGTERM)
        terminated = isinstance(e, _Terminated)
        while True:  # until the job is down, also through another Ctrl-C
            try:
                proc.wait()
                break
            except KeyboardInterrupt:
                pass
            except _Terminated:
                terminated = True
        if terminated and not isinstance(e, _Terminated):
            raise _Terminated() from None  # SIGTERM came too: the process ends by it
        raise


def run(func, args=(), kwargs=None, num_proc=None, hosts=None, hostfile=None,
        start_timeout=None, ssh_port=None, ssh_identity_file=None, verbose=None, use_gloo=None,
        use_mpi=None, mpi_args=None, network_interface=None, network_interfaces=None,
        executable=None, np=None, env=None, stdout=None, stderr=None,
        prefix_output_with_timestamp=False, disable_cache=None, output_filename=None,
        **elastic):
    """Runs ``func(*args, **kwargs)`` on ``np`` ranks and returns their return values in rank
    order. Raises ``hvd_bridge.JobError`` naming the rank that failed first (with its
    traceback) when a rank fails.

    np (or num_proc): number of ranks (default 1, or the slots of ``hosts``).
    hosts: "host1:2,host2:2" ssh hosts and slots (default: this machine; "localhost:2" alone
    runs here without ssh, as horovodrun's -H); hostfile: Horovod's
    "<host> slots=<n>" file instead. ssh_port, ssh_identity_file: for the ssh hosts.
    start_timeout: seconds for the tasks to start (default $HOROVOD_START_TIMEOUT, else 120).
    mpi_args: extra mpirun arguments (a string or a list); env: variables for the ranks;
    network_interfaces (or network_interface, comma-separated): the interfaces to use.
    executable: the Python of the ranks (default: this one). stdout, stderr: text streams for
    the ranks' output (default sys.stdout, sys.stderr), one line at a time, prefixed with
    "[1,rank]<stdout>:"; prefix_output_with_timestamp adds mpirun's timestamps (Open MPI;
    MPICH has none: a warning).
    output_filename: horovodrun's --output-filename (Open MPI 4: each rank's output also in
    DIR/1/rank.R/stdout; docs/launcher.md for the others); disable_cache: accepted.
    Elastic jobs (docs/elastic.md; func uses hvd_bridge.torch.elastic): min_np (min_num_proc),
    max_np (max_num_proc), host_discovery_script (its hosts are fake hosts on this machine),
    slots, reset_limit, elastic_timeout, cooldown_range=(min, max); the return values are
    those of the last launch's ranks.
    """
    unknown = [k for k in elastic if k not in _ELASTIC]
    if unknown:
        raise TypeError("run() got unexpected keyword arguments %s" % ", ".join(unknown))
    if "HOROVOD_RANK" in os.environ and "HVD_TASK_INDEX" in os.environ:
        raise RuntimeError("hvd_bridge.run was called inside a rank of another job (HOROVOD_RANK "
                           "is set): mpirun does not start a job from its own ranks; call it "
                           "from the driver program")
    for name, alias in (("min_np", "min_num_proc"), ("max_np", "max_num_proc")):
        elastic[name] = _job.either(elastic.pop(name, None), name, elastic.pop(alias, None),
                                    alias)
    elastic_flags = _elastic_flags(elastic)
    if hosts and elastic.get("host_discovery_script"):
        raise NotImplementedError("a host discovery script with ssh hosts is not supported by "
                                  "hvd_bridge.run (its script names fake hosts on this "
                                  "machine): use hvd-driver run --host-discovery-script S --ssh")
    _job.only_mpi(use_gloo, use_mpi)
    if hosts and hostfile:
        raise ValueError("Argument hosts and hostfile only allow one provided.")
    if hostfile:
        hosts = _core.read_hostfile(hostfile)  # hvd-driver --hostfile's reader
    elif hosts:
        hosts = _host_list(hosts)
    ssh_port = _ssh_port(ssh_port)
    np_ = _job.either(np, "np", num_proc, "num_proc")
    np_ = _job.rank_count(np_ if np_ is not None else _slots(hosts) if hosts else 1,
                          "np" if np is not None else "num_proc")
    stdout = _job.text_stream(stdout, sys.stdout, "stdout")
    stderr = _job.text_stream(stderr, sys.stderr, "stderr")
    nics = _job.nic_list(network_interfaces, "network_interfaces") or _job.nic_list(
        network_interface, "network_interface")
    verbose = _job.verbosity(verbose)
    extra = _job.mpi_args(mpi_args, env, prefix_output_with_timestamp, "mpi_args")
    start = _job.timeout_s(start_timeout, "HOROVOD_START_TIMEOUT", 120, "start_timeout")
    payload = _job.payload(func, args, kwargs)
    with _TerminateStopsJob():
        work = life = out = err = None
        try:
            work = tempfile.mkdtemp(prefix="hvd-bridge-run-")  # private (0700)
            payload_file = os.path.join(work, "payload")
            results_file = os.path.join(work, "results.json")
            fd = os.open(payload_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(fd, "wb") as f:
                f.write(payload)
            life = _Lifeline()
            out = _job.OutputForwarder(stdout)
            err = _job.OutputForwarder(stderr)
            cmd = _driver_command(np_, hosts, payload_file, results_file, start, ssh_port,
                                  ssh_identity_file, nics, extra, verbose, executable,
                                  elastic_flags, life.read_fd, work, output_filename)
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out.fd, stderr=err.fd,
                                    pass_fds=(life.read_fd,))
            life.close_read()
            out.close_writer()
            err.close_writer()
            status = _wait(proc)
            out.join()
            err.join()
            if not os.path.exists(results_file):
                lines = [l for l in err.last_lines if l.startswith("hvd-driver")]
                raise _job.JobError("the job ended without results (hvd-driver exited with "
                                    "status %d)%s" % (status, ": " + lines[-1] if lines else ""))
            rows, mpirun_status, failure, first_failed = _rows(results_file)
            return _job.values_or_raise(rows, mpirun_status, failure=failure,
                                        first_failed=first_failed)
        finally:
            for fwd in (out, err):
                if fwd is not None:
                    fwd.join(1)
            if life is not None:
                life.close()  # hvd-driver has ended (or, if not, is told to end the job)
            if work is not None:
                shutil.rmtree(work, ignore_errors=True)
