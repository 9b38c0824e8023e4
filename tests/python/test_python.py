#!/usr/bin/env python3
"""The hvd_bridge Python package without Spark (label python): hvd_bridge.run on real task
services, mpirun, hvd-rsh and hvd-exec, each rank a Python interpreter running a pickled
function.

Cases:
  values       args and kwargs reach the ranks; the return values come back in rank order;
               each rank has Horovod's and torch.distributed's variables (RANK, WORLD_SIZE,
               LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
  exception    rank 2 raises: JobError names rank 2, its task and host, and carries the
               remote traceback; the other ranks are not blamed
  output       the ranks' output reaches the given io.StringIO, one line at a time with the
               rank prefix; prefix_output_with_timestamp adds mpirun's timestamps
  env          env= and mpi_args= reach the ranks
  torch_ddp    existing torch.distributed code (gloo, init_method env://) runs unchanged
  big_result   a return value over the limit of a rank's result fails with a message that says
               what to do
  cwd          the ranks run in the caller's working directory and import its modules
  localhost    hosts="localhost:2" (or such a hostfile) runs here without ssh
  init_in_caller  a caller that called hvd.init() itself (a notebook) still runs jobs
  terminated   SIGTERM to a program in hvd_bridge.run stops the job, removes its files and ends
               the program by SIGTERM
  unreadable_result  a return value the caller cannot unpickle names the rank and why
  bad_args     wrong arguments give clear errors before anything starts
and after every case: no process of the job is left, nothing left in TMPDIR or /dev/shm.

Runs with the Python of scripts/install-python.sh (torch, cloudpickle) and the package staged
by the build (--pythonpath). Exits 77 (skip) when that Python, cloudpickle or mpirun is
missing, or under a sanitizer build (the extension cannot load a sanitized runtime).
"""
import contextlib
import io
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import hvdtest  # noqa: E402
from hvdtest import Failure, Skip, check  # noqa: E402

ARGS = None


class Job:
    """A case's surroundings: a process mark every process of its jobs inherits, and a private
    TMPDIR; on exit, nothing of the job may be left in either."""

    def __enter__(self):
        self.mark = uuid.uuid4().hex
        self.tmp = tempfile.mkdtemp(prefix="hvd-pytest-")
        self.saved = {k: os.environ.get(k) for k in (hvdtest.MARK_VAR, "TMPDIR")}
        os.environ[hvdtest.MARK_VAR] = self.mark
        os.environ["TMPDIR"] = self.tmp
        self.shm = hvdtest.ShmWatch(self.mark)
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        left = hvdtest.leftovers(self.mark, 15)
        files = os.listdir(self.tmp)
        shutil.rmtree(self.tmp, ignore_errors=True)
        shm = self.shm.left()
        if exc[0] is None:
            check(not left, "processes of the job left behind:\n  " + "\n  ".join(left))
            check(not files, "files left in the job's TMPDIR: %s" % files)
            check(not shm, "left in /dev/shm: %s" % sorted(shm))
        return False


def rank_info(base, offset=0):
    import os as _os
    env = _os.environ
    return {"rank": int(env["RANK"]), "size": int(env["WORLD_SIZE"]),
            "local_rank": int(env["LOCAL_RANK"]), "local_size": int(env["LOCAL_WORLD_SIZE"]),
            "horovod_rank": int(env["HOROVOD_RANK"]), "master": (env.get("MASTER_ADDR"),
                                                                 env.get("MASTER_PORT")),
            "value": base * int(env["RANK"]) + offset}


def test_values():
    import hvd_bridge
    with Job():
        out = hvd_bridge.run(rank_info, args=(10,), kwargs={"offset": 3}, np=3)
    check(isinstance(out, list) and len(out) == 3, "3 results: %r" % (out,))
    for r, info in enumerate(out):
        check(info["rank"] == r and info["horovod_rank"] == r, "rank order: %r" % (out,))
        check(info["size"] == 3 and info["local_size"] == 3 and info["local_rank"] == r,
              "sizes: %r" % info)
        check(info["value"] == 10 * r + 3, "args and kwargs: %r" % info)
    masters = {tuple(i["master"]) for i in out}
    check(len(masters) == 1, "every rank has the same MASTER_ADDR/PORT: %r" % masters)
    addr, port = masters.pop()
    check(addr and port and port.isdigit() and 0 < int(port) < 65536,
          "MASTER_ADDR and MASTER_PORT set: %r %r" % (addr, port))
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    check(int(port) < low, "MASTER_PORT %s is below the ephemeral ports (from %d), which the "
          "job's own connections take" % (port, low))


def fails_on_two():
    import os as _os
    if _os.environ["RANK"] == "2":
        raise ValueError("rank two fails on purpose")
    import time
    time.sleep(2)  # still running when rank 2 fails: stopped, not blamed
    return "ok"


def test_exception():
    import hvd_bridge
    err = io.StringIO()
    with Job():
        try:
            hvd_bridge.run(fails_on_two, np=4, stdout=io.StringIO(), stderr=err)
        except hvd_bridge.JobError as e:
            exc = e
        else:
            raise Failure("no JobError")
    check(exc.rank == 2 and exc.task == 2 and exc.host, "names rank 2: %r %r" % (exc, vars(exc)))
    text = str(exc)
    check(re.search(r"^rank 2 \(task 2 on \S+\) raised ValueError: rank two fails on purpose",
                    text), "the message names the rank, task, host and error: %s" % text)
    check("Traceback (most recent call last)" in exc.remote_traceback and
          "fails_on_two" in exc.remote_traceback, "remote traceback: %s" % exc.remote_traceback)
    check("[1,2]<stderr>:ValueError: rank two fails on purpose" in err.getvalue(),
          "the traceback reached stderr with the rank prefix: %s" % err.getvalue()[-2000:])
    # hvd-driver's last line blames rank 2 too, not rank 0 (stopped by mpirun's SIGTERM after).
    check(re.search(r"hvd-driver: job failed: rank 2 \(task 2 on \S+\) exited with status 1",
                    err.getvalue()), "hvd-driver names rank 2: %s" % err.getvalue()[-2000:])
    check(len(exc.results) == 4 and exc.results[2].exc_type == "ValueError",
          "every rank's outcome: %r" % exc.results)
    check(exc.results[2].error.startswith("%s exited with status 1: " % sys.executable),
          "rank 2's error names its program: %r" % exc.results[2].error)


def talk(lines):
    import os as _os
    import sys as _sys
    for i in range(lines):
        print("line %d of rank %s" % (i, _os.environ["RANK"]))
    print("to stderr from rank %s" % _os.environ["RANK"], file=_sys.stderr)
    return lines


def long_line(n):
    import sys as _sys
    _sys.stdout.write("x" * n)  # no end of line for a while, as a progress bar's \r updates
    _sys.stdout.flush()
    print("\nafter")


def test_output():
    import hvd_bridge
    # A line longer than the forwarder keeps whole (1 MiB): written on in pieces before its
    # end comes (it was kept, and joined again at every read: quadratic), nothing lost.
    class Writes(io.StringIO):
        def write(self, text):
            self.pieces = getattr(self, "pieces", 0) + ("x" in text and "\n" not in text)
            return super().write(text)

    out = Writes()
    with Job():
        hvd_bridge.run(long_line, args=(3 << 20,), np=1, stdout=out, stderr=io.StringIO())
    text = out.getvalue()
    check(text.count("x") == 3 << 20 and text.endswith("[1,0]<stdout>:after\n"),
          "a 3 MiB line and the next: %d x, ending %r" % (text.count("x"), text[-40:]))
    check(getattr(out, "pieces", 0) >= 2, "the 3 MiB line was written in pieces before its end")
    out, err = io.StringIO(), io.StringIO()
    with Job():
        hvd_bridge.run(talk, args=(50,), np=2, stdout=out, stderr=err)
    for r in range(2):
        mine = [l for l in out.getvalue().splitlines() if l.startswith("[1,%d]<stdout>:" % r)]
        want = ["[1,%d]<stdout>:line %d of rank %d" % (r, i, r) for i in range(50)]
        check(mine == want, "rank %d's stdout lines, whole and in order: %r" % (r, mine[:5]))
        check("[1,%d]<stderr>:to stderr from rank %d" % (r, r) in err.getvalue().splitlines(),
              "stderr: %s" % err.getvalue())
    stamped = io.StringIO()
    with Job():
        hvd_bridge.run(talk, args=(1,), np=1, stdout=stamped, stderr=io.StringIO(),
                       prefix_output_with_timestamp=True)
    line = [l for l in stamped.getvalue().splitlines() if "line 0 of rank 0" in l]
    # mpirun's --timestamp-output: asctime() before the tag, "Mon Nov 23 20:00:20 2026[1,0]..."
    check(line and re.match(r"^\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\[1,0\]<stdout>:line 0",
                            line[0]), "a timestamp before the prefix: %r" % line)


def env_probe(name):
    import os as _os
    return _os.environ.get(name)


def test_env():
    import hvd_bridge
    with Job():
        out = hvd_bridge.run(env_probe, args=("HVD_PYTEST_VAR",), np=2,
                             env={"HVD_PYTEST_VAR": "a b=c"}, mpi_args="-x HVD_PYTEST_OTHER=1")
        other = hvd_bridge.run(env_probe, args=("HVD_PYTEST_OTHER",), np=1,
                               mpi_args=["-x", "HVD_PYTEST_OTHER=2"])
    check(out == ["a b=c", "a b=c"], "env reached both ranks: %r" % out)
    check(other == ["2"], "mpi_args reached mpirun: %r" % other)


def ddp_allreduce():
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")  # env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    world = dist.get_world_size()
    dist.destroy_process_group()
    return t.item(), world


def test_torch_ddp():
    try:
        import torch  # noqa: F401
    except ImportError:
        raise Skip("no torch in this Python")
    import hvd_bridge
    with Job():
        out = hvd_bridge.run(ddp_allreduce, np=3)
    check(out == [(6.0, 3)] * 3, "torch.distributed all_reduce over the job: %r" % out)


def elastic_rank():
    import os as _os
    import hvd_bridge.torch as hvd
    state = hvd.elastic.ObjectState(steps=0)

    @hvd.elastic.run
    def train(state):
        state.steps += 1
        state.commit()
        return int(_os.environ["HVD_ELASTIC_EPOCH"]), hvd.size(), state.steps

    out = train(state)
    hvd.shutdown()  # mpirun counts a rank that ends without MPI_Finalize as failed
    return out


def test_elastic_args():
    """Horovod's elastic keyword arguments run an elastic job (one launch here)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise Skip("no torch in this Python")
    import hvd_bridge
    with Job():
        out = hvd_bridge.run(elastic_rank, np=2, min_np=2, max_np=2, reset_limit=1,
                             elastic_timeout=60, cooldown_range=(5, 10))
    check(out == [(1, 2, 1)] * 2, "an elastic job of 2 ranks, one launch: %r" % out)


def test_next_job():
    """_core.Driver.next_job: two run_job calls over the same two task services (made with
    elastic=True, which run one command after another), each with its own results."""
    import base64
    import threading

    import hvd_bridge
    from hvd_bridge import _core
    with Job() as j:
        work = tempfile.mkdtemp(prefix="hvd-pytest-work-", dir=os.path.dirname(j.tmp))
        ran = os.path.join(work, "ran")
        drv = _core.Driver(2, ["sh", "-c", 'echo "$HOROVOD_RANK" >> %s' % ran])
        secret = base64.b64decode(drv.job_env()["HVD_SECRET"])
        tasks = [_core.Task(i, drv.addresses, secret, work_dir=work, elastic=True,
                            min_lifetime=0) for i in range(2)]
        threads = [threading.Thread(target=t.run, daemon=True) for t in tasks]
        try:
            for th in threads:
                th.start()
            drv.wait_registration(60)
            for job in range(2):
                if job:
                    drv.next_job()
                status, timed_out, stopped = drv.run_job(hvd_bridge.bin_dir(), start_timeout=60)
                check(status == 0 and not timed_out and not stopped,
                      "job %d: mpirun %s, timed out %s, stopped %s" % (job, status, timed_out,
                                                                        stopped))
                res = drv.results()
                check([r[0] for r in res] == [0, 1] and all(r[3] and r[4] == 0 for r in res),
                      "job %d: both ranks reported success: %s" % (job, res))
            with open(ran) as f:
                lines = sorted(f.read().split())
            check(lines == ["0", "0", "1", "1"], "each rank ran once per job: %s" % lines)
        finally:
            drv.shutdown_tasks()
            for th in threads:
                th.join(30)
            for t in tasks:
                t.stop()
            drv.stop()
            shutil.rmtree(work, ignore_errors=True)


def big_value():
    return b"x" * (65 << 20)


def test_big_result():
    import hvd_bridge
    with Job():
        try:
            hvd_bridge.run(big_value, np=1)
        except hvd_bridge.JobError as e:
            check("the result is larger than 67043328 bytes" in str(e) and
                  "write a larger one to a file and return its path" in str(e),
                  "a result over the limit: %s" % e)
        else:
            raise Failure("a 65 MiB result was taken")


BIG_ARG = bytes(range(256)) * (400 << 10)  # 100 MiB, more than one frame of the protocol


def big_arg_digest():
    import hashlib
    return hashlib.sha256(BIG_ARG).hexdigest()


def test_big_payload():
    """A function that carries 100 MiB (a module global pickled by value, as a notebook's
    are) reaches every rank whole: the ranks fetch it past the protocol's 64 MiB frame."""
    import hashlib
    import cloudpickle
    import hvd_bridge
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        with Job():
            got = hvd_bridge.run(big_arg_digest, np=2)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    want = hashlib.sha256(BIG_ARG).hexdigest()
    check(got == [want, want], "each rank saw the whole 100 MiB: %r" % got)


def exits_quietly(after_init=False):
    import os as _os
    import time as _time
    if after_init:  # MPI initialized: mpirun stops the other ranks once rank 1 is gone
        from hvd_bridge import _runtime
        _runtime.init()
    if _os.environ["RANK"] == "1":
        _os._exit(0)
    _time.sleep(1 if not after_init else 30)
    return "returned"


def test_no_result():
    """A rank whose process ends with status 0 before the function returns (os._exit(0)) is a
    failure naming it; its value was taken as None without a word. After the runtime's init,
    mpirun then stops the other ranks: still rank 1 is named (it was 'stopped by orted ... no
    part of the job failed on its own', naming no rank)."""
    import hvd_bridge
    for after_init in (False, True):
        with Job():
            try:
                got = hvd_bridge.run(exits_quietly, args=(after_init,), np=2,
                                     stderr=io.StringIO())
            except hvd_bridge.JobError as e:
                check(e.rank == 1 and "exited with status 0 without returning a result" in str(e),
                      "after init %s: the error names rank 1: %s" % (after_init, e))
            else:
                raise Failure("taken as a success: %r" % (got,))


def returns_rank_only_class():
    """Rank 1 returns an instance of a class from a module only the ranks have."""
    import importlib.machinery
    import os as _os
    import sys as _sys
    import types
    if _os.environ["RANK"] != "1":
        return "plain"
    m = types.ModuleType("rank_only_mod")
    m.__spec__ = importlib.machinery.ModuleSpec("rank_only_mod", None, origin="/x/rank_only_mod.py")
    exec("class Thing:\n    pass\n", m.__dict__)
    _sys.modules["rank_only_mod"] = m
    return m.Thing()


def test_unreadable_result():
    """A value the caller cannot unpickle (its class is in a module only the ranks import) is a
    failure naming the rank and the import error; it read "mpirun exited with status 0"."""
    import hvd_bridge
    with Job():
        try:
            got = hvd_bridge.run(returns_rank_only_class, np=2)
        except hvd_bridge.JobError as e:
            check(e.rank == 1 and re.match(
                r"rank 1 \(task 1 on \S+\) returned a value this process cannot unpickle: "
                r"ModuleNotFoundError: No module named 'rank_only_mod' \(", str(e)),
                "the error names rank 1 and the module: %s" % e)
        else:
            raise Failure("taken as a success: %r" % (got,))


class FailingStream:
    """A text stream whose writes fail (a closed notebook cell, a full disk)."""
    def write(self, text):
        raise OSError("no space left on this stream")


def test_output_write_fails():
    """A stream that cannot be written: the job still succeeds, and one line on this process's
    stderr says the ranks' output is dropped (it was dropped without a word)."""
    import hvd_bridge
    saved = os.dup(2)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            with Job():
                got = hvd_bridge.run(talk, args=(3,), np=1, stdout=FailingStream())
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        err = f.read().decode(errors="replace")
    check(got == [3], "the job ran: %r" % (got,))
    lines = [ln for ln in err.splitlines() if "cannot write the ranks' output" in ln]
    check(len(lines) == 1 and "no space left on this stream" in lines[0] and
          "the rest of it is dropped" in lines[0], "one line says so: %r" % err[-2000:])


def test_cwd():
    """The ranks run in the caller's working directory, with it on their import path (as
    horovodrun's and horovod.run's do): a function from a module there, and a relative path."""
    import hvd_bridge
    with Job() as job:
        here = os.getcwd()
        d = os.path.join(job.tmp, "caller")
        os.mkdir(d)
        module = "cwd_probe_" + job.mark
        with open(os.path.join(d, module + ".py"), "w") as f:
            f.write("import os\n\ndef probe():\n    with open('data.txt') as f:\n"
                    "        return os.getcwd(), f.read()\n")
        with open(os.path.join(d, "data.txt"), "w") as f:
            f.write("relative")
        os.chdir(d)
        sys.path.insert(0, d)
        try:
            probe = __import__(module).probe  # pickled by reference: imported on the ranks
            out = hvd_bridge.run(probe, np=2)
        finally:
            sys.path.remove(d)
            sys.modules.pop(module, None)
            os.chdir(here)
        shutil.rmtree(d)
    check(out == [(d, "relative")] * 2, "each rank in %s, reading data.txt: %r" % (d, out))


def test_localhost():
    """hosts="localhost:2" and a hostfile naming localhost, as Horovod's local examples give
    them: local task services, no ssh (there is no sshd on port 22 here: it tried ssh and
    failed with "connection refused"); white space around the entry; horovod.run's
    output_filename and disable_cache."""
    import hvd_bridge
    with Job() as job:
        hostfile = os.path.join(job.tmp, "hostfile")
        with open(hostfile, "w") as f:
            f.write("# Horovod's format\nlocalhost slots=2\n")
        logs = os.path.join(job.tmp, "logs")
        by_hosts = hvd_bridge.run(rank_info, args=(1,), hosts=" localhost:2 ",
                                  output_filename=logs, disable_cache=True)
        by_file = hvd_bridge.run(rank_info, args=(1,), hostfile=hostfile)
        os.unlink(hostfile)
        # horovod.run's output_filename: each rank's output in a file of its own as well
        ranks = sorted(os.listdir(os.path.join(logs, "1")))
        shutil.rmtree(logs)
    check(ranks == ["rank.0", "rank.1"], "output_filename holds the 2 ranks' logs: %s" % ranks)
    for out in (by_hosts, by_file):
        check([r["value"] for r in out] == [0, 1] and all(r["size"] == 2 for r in out),
              "2 ranks on this machine: %r" % out)


INIT_IN_CALLER_SCRIPT = r"""
import hvd_bridge
from hvd_bridge import _runtime
_runtime.init()  # what hvd.init() does in a notebook: a singleton MPI_Init in the caller
print(hvd_bridge.run(lambda: 7, np=2))
_runtime.shutdown()
"""


def test_init_in_caller():
    """A caller that initialised the runtime itself (hvd.init() in a notebook, then a job): its
    singleton MPI_Init put OMPI_MCA_ess=singleton in its environment, and mpirun ended at once
    ("mpirun exited with status 1 before the ranks ran", with no message from mpirun)."""
    import subprocess
    with Job():
        p = subprocess.run([sys.executable, "-c", INIT_IN_CALLER_SCRIPT], capture_output=True,
                           text=True, timeout=120)
    check(p.returncode == 0 and p.stdout.strip() == "[7, 7]",
          "the job ran from a caller with the runtime up (rc %d): %s\n%s"
          % (p.returncode, p.stdout, p.stderr[-3000:]))


TERMINATED_SCRIPT = r"""
import os, sys, time
import hvd_bridge

def hang(d):
    open(os.path.join(d, "started.%s" % os.environ["RANK"]), "w").close()
    time.sleep(600)

hvd_bridge.run(hang, args=(sys.argv[1],), np=2)
"""


def signal_waiting_caller(sig):
    """Starts a program waiting in hvd_bridge.run (TERMINATED_SCRIPT) inside a Job, sends it
    sig once its 2 ranks run, and returns how it ended (Job checks that nothing of the job is
    left)."""
    import subprocess
    with Job() as job:
        d = os.path.join(job.tmp, "started")
        os.mkdir(d)
        p = subprocess.Popen([sys.executable, "-c", TERMINATED_SCRIPT, d])
        try:
            deadline = time.time() + 60
            while len(os.listdir(d)) < 2 and time.time() < deadline and p.poll() is None:
                time.sleep(0.1)
            check(len(os.listdir(d)) == 2, "the 2 ranks started: %s" % os.listdir(d))
            p.send_signal(sig)
            rc = p.wait(60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(d)
    return rc


def test_terminated():
    """SIGTERM to a program waiting in hvd_bridge.run: the job is stopped, its directory (the
    pickled function) removed, and the program ends by SIGTERM."""
    rc = signal_waiting_caller(signal.SIGTERM)
    check(rc == -signal.SIGTERM, "the program ended by SIGTERM, not with %s" % rc)


def test_killed_caller():
    """SIGKILL to a program waiting in hvd_bridge.run (a notebook kernel restarted, the OOM
    killer): hvd-driver, its lifeline cut, stops the job and removes the pickled function and
    the results file; Job checks that no process or file of the job is left. Before, the whole
    job ran on for good, and the files stayed."""
    rc = signal_waiting_caller(signal.SIGKILL)
    check(rc == -signal.SIGKILL, "the program was killed: %s" % rc)


def test_payload_versions():
    """A payload carries which Python and cloudpickle pickled it; a rank that cannot unpickle
    it with others says both (a Spark worker's Python that is not the driver's gave only
    "Can't get attribute '_function_setstate'")."""
    import json
    import platform
    import cloudpickle
    from hvd_bridge import _job
    fn, args, kwargs = _job.payload_load(_job.payload(rank_info, (1,), {}))
    check(fn.__name__ == "rank_info" and args == (1,) and kwargs == {},
          "a payload loads back: %r %r" % (args, kwargs))
    other = _job.PAYLOAD_MAGIC + json.dumps({"python": "3.8.10", "cloudpickle": "1.6.0",
                                             "executable": "/opt/py38/bin/python"}).encode()
    try:
        _job.payload_load(other + b"\nnot a pickle")
    except RuntimeError as e:
        check("pickled by cloudpickle 1.6.0 under Python 3.8.10 (/opt/py38/bin/python), this "
              "rank has cloudpickle %s under Python %s" % (cloudpickle.__version__,
                                                          platform.python_version()) in str(e)
              and "PYSPARK_PYTHON" in str(e), "the versions are named: %s" % e)
    else:
        raise Failure("garbage was loaded")
    try:  # the same versions: the unpickling error itself
        _job.payload_load(_job.payload_header() + b"not a pickle")
    except RuntimeError:
        raise Failure("blamed the versions when they are the same")
    except Exception:  # noqa: BLE001 - whatever pickle raises
        pass


@contextlib.contextmanager
def mock_env(**values):
    """os.environ with values set, as it was afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_bad_args():
    import hvd_bridge
    for kw, exc, text in ((dict(use_gloo=True), ValueError, "MPI"),
                          (dict(hosts="a:1", hostfile="/x"), ValueError, "hostfile"),
                          (dict(min_num_proc=1, hosts="a:1", host_discovery_script="x"),
                           NotImplementedError, "discovery script with ssh hosts"),
                          (dict(bogus=1), TypeError, "bogus"),
                          (dict(env=["A=1"]), ValueError, "env must be a dict"),
                          (dict(np=0), ValueError, "np must be a whole number of at least 1"),
                          (dict(np=None, num_proc=-2), ValueError, "num_proc must be a whole"),
                          (dict(np="2"), ValueError, "got '2'"),
                          (dict(np=2, num_proc=3), ValueError,
                           "np=2 and num_proc=3 name the same thing: give one of them"),
                          (dict(min_np=1, min_num_proc=2, max_np=2), ValueError,
                           "min_np=1 and min_num_proc=2 name the same thing"),
                          (dict(min_np=3, max_np=2), ValueError,
                           "min_np (3) must not exceed max_np (2)"),
                          (dict(max_np=0), ValueError, "max_np must be a whole number"),
                          (dict(min_np=1, cooldown_range=(5,)), ValueError,
                           "cooldown_range must be (min, max) seconds"),
                          (dict(stdout=5), TypeError,
                           "stdout must be a text stream with a write method"),
                          (dict(stderr="err.txt"), TypeError, "got str"),
                          (dict(use_gloo=True, use_mpi=True), ValueError,
                           "use_gloo and use_mpi are both True"),
                          (dict(mpi_args="-x 'A=1"), ValueError,
                           "mpi_args \"-x 'A=1\" cannot be split like a shell command line: "
                           "No closing quotation"),
                          (dict(verbose="2"), ValueError, "verbose must be 0, 1 or 2, got '2'"),
                          (dict(network_interfaces=["eth0", ""]), ValueError,
                           "network_interfaces must name network interfaces"),
                          (dict(stdout=io.BytesIO()), TypeError,
                           "stdout must be a text stream, got the binary BytesIO"),
                          (dict(args=(threading.Lock(),)), TypeError,
                           "must be picklable (cloudpickle) to reach the ranks: cannot pickle"),
                          (dict(args=5), TypeError, "args must be a tuple or a list, got int"),
                          (dict(kwargs=[1]), TypeError, "kwargs must be a dict, got list"),
                          (dict(start_timeout="x"), ValueError,
                           "start_timeout must be a number of seconds above 0, got 'x'"),
                          (dict(hosts="a:1", ssh_port=70000), ValueError,
                           "ssh_port must be a whole number from 1 to 65535, got 70000"),
                          (dict(hosts="a:1", ssh_port="22x"), ValueError, "got '22x'"),
                          (dict(hosts="a:1", ssh_port=True), ValueError, "got True"),
                          (dict(hosts=" , "), ValueError, "hosts names no host"),
                          (dict(np=None, hosts="a:x"), ValueError, "'a:x' is no host:slots"),
                          (dict(env={1: "x"}), ValueError, "env: 1 is no environment variable"),
                          (dict(env={"A B": "x"}), ValueError, "'A B' is no environment"),
                          (dict(env={"A": None}), TypeError, "env['A'] must be a str, got NoneType"),
                          (dict(mpi_args=5), TypeError, "mpi_args must be a string or a list of"),
                          (dict(network_interface=5), ValueError,
                           "network_interface must name network interfaces"),
                          (dict(kwargs={1: 2}), TypeError, "keyword names (str), got the key 1"),
                          (dict(start_timeout=1e30), ValueError, "at most 1073741824 seconds, got 1e+30"),
                          (dict(min_np=1, reset_limit=-1), ValueError,
                           "reset_limit must be a whole number from 0 to 2**30, got -1"),
                          (dict(min_np=1, elastic_timeout=0), ValueError,
                           "elastic_timeout must be a number of seconds above 0")):
        try:
            hvd_bridge.run(rank_info, **dict(dict(args=(1,), np=1), **kw))
        except exc as e:
            check(text in str(e), "%r: %s" % (kw, e))
        else:
            raise Failure("%r accepted" % kw)
    # Inside a rank (hvd-exec's HOROVOD_RANK and HVD_TASK_INDEX): refused before mpirun.
    with mock_env(HOROVOD_RANK="0", HVD_TASK_INDEX="0"):
        try:
            hvd_bridge.run(rank_info, args=(1,), np=1)
        except RuntimeError as e:
            check("called inside a rank of another job" in str(e), "inside a rank: %s" % e)
        else:
            raise Failure("run inside a rank was accepted")
    # Hostfiles that are not Horovod's format, or name no host (one ran on this machine).
    with tempfile.TemporaryDirectory() as d:
        for text, says in (("\n# none\n", "names no host"),
                           ("h1:1\n", "write 'h1:1' as '<host> slots=<n>'"),
                           ("h1 slots=two\n", "line 1: 'h1 slots=two' is not '<host> slots=<n>'"),
                           ("h1 slots=0\n", "with n from 1 to 4096"),
                           ("::1 slots=2\n", "write the IPv6 address ::1 in brackets"),
                           ("h1 slots=2\nh2:1,h3:1\n", "line 2: 'h2:1,h3:1' holds a comma")):
            path = os.path.join(d, "hostfile")
            with open(path, "w") as f:
                f.write(text)
            try:
                hvd_bridge.run(rank_info, args=(1,), hostfile=path)
            except ValueError as e:
                check(says in str(e), "hostfile %r: %s" % (text, e))
            else:
                raise Failure("hostfile %r accepted" % text)
    try:  # the OSError open() raises, as Horovod's reader gives it
        hvd_bridge.run(rank_info, args=(1,), hostfile="/nonexistent/hostfile")
    except FileNotFoundError as e:
        check(e.filename == "/nonexistent/hostfile" and "cannot read hostfile" in str(e), str(e))
    else:
        raise Failure("a missing hostfile accepted")
    try:
        hvd_bridge.run(42, np=1)
    except TypeError as e:
        check("the function to run must be callable, got int" in str(e), "run(42): %s" % e)
    else:
        raise Failure("run(42) accepted")
    # A count of numpy's integer type is a whole number (a count computed with numpy).
    try:
        import numpy
    except ImportError:
        numpy = None
    if numpy is not None:
        got = hvd_bridge.run(rank_info, args=(1,), np=numpy.int64(1))
        check(len(got) == 1, "np=numpy.int64(1): %r" % got)
    # One interface as a string is that interface (it was taken letter by letter: "l,o");
    # an empty list asks for nothing, and use_mpi=False alone still runs MPI (as in Horovod).
    for kw in (dict(network_interfaces="lo"), dict(network_interfaces=[]), dict(use_mpi=False)):
        got = hvd_bridge.run(rank_info, args=(1,), np=1, **kw)
        check(len(got) == 1, "%r: %r" % (kw, got))
    # The C door refuses a relative bin dir before it waits for anything (mpirun's agent and
    # the ranks start in other directories).
    from hvd_bridge import _core
    d = _core.Driver(1, ["true"])
    try:
        d.run_job("relative/bin")
    except RuntimeError as e:
        check("not an absolute path" in str(e), "relative bin dir: %s" % e)
    else:
        raise Failure("a relative bin dir was accepted")
    finally:
        d.stop()


def main():
    global ARGS
    ARGS = hvdtest.package_test_args()
    return hvdtest.run_cases({k: guarded(f) for k, f in hvdtest.cases_in(globals()).items()},
                             ARGS.cases)


def guarded(case):
    """A case whose unexpected JobError (or HvdError) counts as its failure."""
    def run():
        try:
            case()
        except RuntimeError as e:
            raise Failure("%s: %s" % (type(e).__name__, e)) from e
    return run

if __name__ == "__main__":
    sys.exit(main())
