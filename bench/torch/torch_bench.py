#!/usr/bin/env python3
"""torch_bench.py: hvd_bridge.torch against torch.distributed (gloo), and Horovod's PyTorch
extension when one could be built, on this machine, in one run (bench/torch/run.sh sets up
and calls this; results in docs/performance.md, section "PyTorch").

Every job runs through hvd_bridge.run (task services, mpirun, one Python rank per process);
hvd_bridge.run gives each rank RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, so the gloo side
runs `torch.distributed.init_process_group("gloo")` in the same kind of job. Sides:

  hvd      hvd_bridge.torch: DistributedOptimizer, allreduce_ (MPI through the C runtime)
  ddp      torch.nn.parallel.DistributedDataParallel, torch.distributed.all_reduce, gloo
  horovod  horovod.torch 0.28.1 (DistributedOptimizer, allreduce_), MPI: only with --horovod-python,
           a Python where `import horovod.torch` works against the same torch

One job = one side at one np: each rank pins torch to one thread (torch.set_num_threads(1),
OMP_NUM_THREADS=1: 2 cores here), then
  steps      per model: --warmup untimed steps, then --steps timed ones; a step is
             zero_grad, forward, cross-entropy, backward, optimizer step (SGD) on a fixed
             random batch of --batch rows per rank; the step's time is the slowest rank's.
             Before the distributed wrapper, the same model runs --steps plain local steps on
             every rank at once ("compute": the step without communication, same CPU load).
  allreduce  per size (float32, 4 KiB to 64 MiB): 2 untimed, then enough timed in-place sum
             allreduces (at least 3, up to 200, about 64 MiB moved per size); each rank
             times each call to its return; the value is the slowest rank's median.
The driver runs --runs rounds; in each, for each np, every side once, the order rotating
every round, so that each side sees the same machine load. A job that fails is recorded
("retried") and run once more; a second failure leaves that cell without this run's sample
("failures", and exit status 1). Results (per run: the median step time, the median allreduce
time per size) go to --json.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

MODELS = {  # name: (layer widths, batch rows per rank)
    "mlp-5.8M": ([784, 2048, 2048, 10], 32),
    "mlp-26k": ([64, 128, 128, 10], 32),
    # not run by default: 98 parameter tensors of 4 KiB or less, for the cost per gradient
    "mlp-deep": ([64] * 49 + [10], 32),
}
DEFAULT_MODELS = ["mlp-5.8M", "mlp-26k"]
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def log(*a):
    print("torch_bench:", *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the ranks' side

def rank_main(side, cfg):
    """Runs in every rank of one job; returns this rank's raw timings."""
    import gc

    import torch
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    import torch.nn.functional as F

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    def mlp(widths):
        torch.manual_seed(0)
        layers = []
        for i in range(len(widths) - 1):
            layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
            if i < len(widths) - 2:
                layers.append(torch.nn.ReLU())
        return torch.nn.Sequential(*layers)

    def batch(widths, rows):
        g = torch.Generator().manual_seed(1000 + rank)
        return torch.randn(rows, widths[0], generator=g), torch.randint(0, widths[-1], (rows,), generator=g)

    def step_loop(model, opt, x, y, n, cpu=None):
        out = []
        c0 = time.process_time()
        for _ in range(n):
            t0 = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            out.append(time.perf_counter() - t0)
        if cpu is not None and n:
            cpu.append((time.process_time() - c0) / n)
        return out

    if side == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo")

        def barrier():
            dist.all_reduce(torch.zeros(1))

        def allreduce_(t, name):
            dist.all_reduce(t)

        def wrap(model, opt):
            return torch.nn.parallel.DistributedDataParallel(model), opt

        def finish():
            dist.destroy_process_group()
    else:
        if side == "hvd":
            import hvd_bridge.torch as hvd
        else:
            import horovod.torch as hvd
        hvd.init()
        assert hvd.size() == world and hvd.rank() == rank

        def barrier():
            hvd.allreduce(torch.zeros(1), name="barrier", op=hvd.Sum)

        def allreduce_(t, name):
            hvd.allreduce_(t, name=name, op=hvd.Sum)

        def wrap(model, opt):
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            return model, hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

        def finish():
            hvd.shutdown()

    # cpu: this process's CPU time (every thread: the runtime's background thread, gloo's, MPI's
    # progress polling) per step or call, to see where a slow side's time goes.
    res = {"steps": {}, "compute": {}, "allreduce": {}, "cpu": {}}
    model = opt = None
    for name in cfg["models"]:
        widths, rows = MODELS[name]
        x, y = batch(widths, rows)
        model = mlp(widths)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        barrier()
        step_loop(model, opt, x, y, cfg["warmup"])
        res["compute"][name] = step_loop(model, opt, x, y, cfg["steps"])
        model = mlp(widths)
        model, opt = wrap(model, torch.optim.SGD(model.parameters(), lr=0.01))
        barrier()
        step_loop(model, opt, x, y, cfg["warmup"])
        barrier()
        cpu = []
        res["steps"][name] = step_loop(model, opt, x, y, cfg["steps"], cpu)
        res["cpu"]["step/" + name] = cpu[0] if cpu else 0.0
        res.setdefault("params", {})[name] = sum(p.numel() for p in model.parameters())
    for size in cfg["sizes"]:
        t = torch.zeros(size // 4)  # zeros: summing in place again and again stays finite
        iters = max(3, min(200, (64 << 20) // size))
        for _ in range(2):
            allreduce_(t, "ar.%d" % size)
        barrier()
        times = []
        c0 = time.process_time()
        for _ in range(iters):
            t0 = time.perf_counter()
            allreduce_(t, "ar.%d" % size)
            times.append(time.perf_counter() - t0)
        res["cpu"]["allreduce/%d" % size] = (time.process_time() - c0) / iters
        res["allreduce"][str(size)] = times
    check = torch.full((4,), float(rank + 1))
    allreduce_(check, "check")
    res["check"] = check.tolist()
    # The DDP module (its reducer holds the process group) goes before the group does: with it
    # still alive, rank 0 aborted at interpreter exit ("terminate called without an active
    # exception") in 2 of 25 jobs of a DDP-then-destroy loop here, and in 0 of 30 without it.
    del model, opt
    gc.collect()
    finish()
    return res


# ---------------------------------------------------------------- the driver

def job(side, np_, cfg, a):
    import hvd_bridge
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if side == "hvd":
        env.update(a.hvd_env)
    exe = a.horovod_python if side == "horovod" else a.python
    t0 = time.time()
    out = hvd_bridge.run(rank_main, args=(side, cfg), np=np_, executable=exe, env=env,
                         start_timeout=120)
    return out, time.time() - t0


def combine(per_rank, key, name):
    """Per-step (or per-call) slowest rank, then the median over steps."""
    cols = [r[key][name] for r in per_rank]
    return statistics.median(max(v) for v in zip(*cols))


def sample_keys(side, np_, cfg):
    """The keys one job of side at np_ adds a sample to."""
    keys = []
    for m in cfg["models"]:
        keys += ["%s/%s/%d/%s" % (k, side, np_, m) for k in ("step", "compute")]
        keys.append("cpu/%s/%d/step/%s" % (side, np_, m))
    for z in cfg["sizes"]:
        keys += ["allreduce/%s/%d/%d" % (side, np_, z), "cpu/%s/%d/allreduce/%d" % (side, np_, z)]
    return keys


def versions(a):
    def out(cmd):
        try:
            return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=120).stdout.decode().strip().splitlines()[-1]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            return "?"
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": "%s, %d CPUs, %.0f GiB, kernel %s" % (
            cpu, os.cpu_count(), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
            platform.release()),
        "torch": out([a.python, "-c", "import torch; print(torch.__version__)"]),
        "python": out([a.python, "-c", "import sys; print(sys.version.split()[0])"]),
        "mpirun": out(["sh", "-c", "mpirun --version | head -1"]),
        "hvd_bridge": out(["git", "-C", REPO, "describe", "--always", "--dirty"]),
    }
    if a.horovod_python:
        info["horovod"] = out([a.horovod_python, "-c", "import horovod.torch as h; import horovod; "
                               "print(horovod.__version__, 'mpi' if h.mpi_built() else 'no-mpi')"])
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="the ranks' Python (torch, hvd_bridge)")
    ap.add_argument("--horovod-python", default="", help="a Python with horovod.torch (third side)")
    ap.add_argument("--horovod-note", default="", help="why there is no Horovod side (for the report)")
    ap.add_argument("--np", default="2,4")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    help="of %s (default: %%(default)s)" % ", ".join(MODELS))
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    ap.add_argument("--hvd-env", action="append", default=[], metavar="NAME=VALUE",
                    help="a variable for the hvd side's ranks only (e.g. HOROVOD_CYCLE_TIME=0.1), to find "
                         "where its time goes")
    ap.add_argument("--sides", default="", help="only these sides (default: hvd,ddp and horovod when given)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    a.hvd_env = dict(kv.split("=", 1) for kv in a.hvd_env)
    nps = [int(x) for x in a.np.split(",") if x]
    cfg = {"models": [m for m in a.models.split(",") if m], "warmup": a.warmup, "steps": a.steps,
           "sizes": [int(x) for x in a.sizes.split(",") if x]}
    unknown = [m for m in cfg["models"] if m not in MODELS]
    if unknown:
        ap.error("unknown model %s: the models are %s" % (", ".join(unknown), ", ".join(MODELS)))
    sides = ["hvd", "ddp"] + (["horovod"] if a.horovod_python else [])
    if a.sides:
        sides = [x for x in a.sides.split(",") if x]
    info = versions(a)
    info["load_start"] = [round(x, 2) for x in os.getloadavg()]
    info["loads"] = []
    info["horovod_note"] = a.horovod_note
    samples, failures, retried = {}, {}, {}
    t_start = time.time()
    for r in range(a.runs):
        for np_ in nps:
            k = r % len(sides)
            for side in sides[k:] + sides[:k]:
                per_rank = None
                for attempt in (1, 2):  # a job that fails is recorded, and run once more
                    try:
                        per_rank, secs = job(side, np_, cfg, a)
                        break
                    except Exception as e:  # noqa: BLE001
                        key = "%s/%d" % (side, np_)
                        (failures if attempt == 2 else retried).setdefault(key, []).append(str(e)[-600:])
                        log("FAIL %s np=%d (attempt %d): %s" % (side, np_, attempt, str(e)[-600:]))
                want = [float(np_ * (np_ + 1) // 2)] * 4
                if per_rank is not None and any(p["check"] != want for p in per_rank):
                    failures.setdefault("%s/%d" % (side, np_), []).append(
                        "wrong allreduce result: %r, want %r" % ([p["check"] for p in per_rank], want))
                    per_rank = None
                if per_rank is None:  # None in this run's place keeps the runs of the sides paired
                    for key in sample_keys(side, np_, cfg):
                        samples.setdefault(key, []).append(None)
                    continue
                for what, v in per_rank[0]["cpu"].items():  # median rank's CPU ms per step or call
                    samples.setdefault("cpu/%s/%d/%s" % (side, np_, what), []).append(
                        statistics.median(p["cpu"][what] for p in per_rank) * 1000)
                for m in cfg["models"]:
                    samples.setdefault("step/%s/%d/%s" % (side, np_, m), []).append(
                        combine(per_rank, "steps", m) * 1000)
                    samples.setdefault("compute/%s/%d/%s" % (side, np_, m), []).append(
                        combine(per_rank, "compute", m) * 1000)
                for size in cfg["sizes"]:
                    samples.setdefault("allreduce/%s/%d/%d" % (side, np_, size), []).append(
                        combine(per_rank, "allreduce", str(size)) * 1000)
                info["params"] = per_rank[0].get("params", {})
                log("%s np=%d: job %.1f s, %s" % (side, np_, secs, ", ".join(
                    "%s %.1f ms" % (m, samples["step/%s/%d/%s" % (side, np_, m)][-1]) for m in cfg["models"])))
        info["loads"].append([round(x, 2) for x in os.getloadavg()])
        log("round %d/%d done, load %s" % (r + 1, a.runs, info["loads"][-1]))
    info["load_end"] = [round(x, 2) for x in os.getloadavg()]
    info["seconds"] = round(time.time() - t_start)
    res = {"info": info, "args": vars(a), "cfg": cfg, "sides": sides, "samples": samples, "failures": failures,
           "retried": retried,
           "models": {m: {"widths": MODELS[m][0], "batch": MODELS[m][1]} for m in cfg["models"]}}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    log("%d s, %d failures, %d jobs run again after a failure" % (
        info["seconds"], sum(len(v) for v in failures.values()), sum(len(v) for v in retried.values())))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
