#!/usr/bin/env bash
# hvd_bridge.torch against torch.distributed on gloo (and horovod.torch 0.28.1 when it builds),
# on this machine, in one run (issue: PyTorch benchmarks). One command:
#
#   bash bench/torch/run.sh             full run (np 2 and 4, 5 runs each side, ~15 min on 2
#                                       cores), then writes docs/performance.md's "PyTorch"
#                                       section, docs/torch-results.json, docs/img/torch-*.png
#   bash bench/torch/run.sh --smoke     np 2, one run, a few steps and three sizes: checks that
#                                       every side still runs; writes nothing in docs/ (CI)
#   bash bench/torch/run.sh --setup     only the set-up below (the Horovod build included)
#   extra arguments go to torch_bench.py (e.g. --runs 7 --np 2,4)
#
# The ranks run in the Python of scripts/install-python.sh (torch for CPU), with the package
# the build stages in build/python. The Horovod column: a virtual environment
# ($HVD_BUILD/torch-horovod-venv) that sees that torch (a .pth file naming its site-packages)
# gets `HOROVOD_WITH_PYTORCH=1 pip install horovod==0.28.1`, built from PyPI's source against
# that torch (and, if that fails, once more with the C++ standard forced to C++20). The outcome
# is kept in the environment (.hvd-outcome, .hvd-torch: the torch version it was built
# against) so that the build, 10-20 minutes on 2 cores, is tried once per torch version; the
# full run tries it, --smoke only uses what an earlier full run left. The report says how it
# went (the build log stays in $HVD_BUILD/torch-horovod-build.log).
set -euo pipefail
cd "$(dirname "$0")/../.."
smoke=0
setup_only=0
case "${1:-}" in
  --smoke) smoke=1; shift ;;
  --setup) setup_only=1; shift ;;
esac
build=$(realpath -m "${HVD_BUILD:-build}")
hvenv=$build/torch-horovod-venv
py=$(bash scripts/install-python.sh | tail -n 1)
command -v mpirun >/dev/null || { echo "torch bench: mpirun is missing: run scripts/install-deps.sh" >&2; exit 2; }
if ! ls "$build"/python/hvd_bridge/_runtime.*.so >/dev/null 2>&1; then
  echo "torch bench: building hvd-bridge in $build" >&2
  cmake -S . -B "$build" -DHVD_TEST_PYTHON="$py" >/dev/null
  cmake --build "$build" -j"$(nproc)" >/dev/null
fi
export PYTHONPATH="$build/python"
"$py" -c 'import torch, hvd_bridge.torch' ||
  { echo "torch bench: hvd_bridge.torch does not import with $py" >&2; exit 1; }

# The Horovod side. $hvenv/.hvd-outcome holds two lines: "shipped: ok" or "shipped: failed:
# <first compiler error>" for horovod==0.28.1 built as it comes, and, when that failed, the same
# for "cxx20:", a second build whose C++ compiler is bench/torch/gxx-std20 (g++ with -std=c++20
# last on every command line). Both from PyPI's source, --no-cache-dir: a wheel cached from
# one build must not stand in for the other, or for another torch.
torch_version=$("$py" -c 'import torch; print(torch.__version__)')
outcome=$hvenv/.hvd-outcome
hlog=$build/torch-horovod-build.log
build_horovod() {  # $1: shipped | cxx20; extra environment for pip in the rest
  local kind=$1
  shift
  rm -rf "$hvenv"
  python3 -m venv "$hvenv"
  local site
  site=$("$hvenv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/hvd-torch-venv.pth"
  echo "=== $kind build" >>"$hlog"
  # --no-build-isolation: horovod's setup.py finds torch by importing it; MPI only, as
  # hvd_bridge runs (Gloo would be a second controller to build and choose between).
  if "$hvenv/bin/pip" install --disable-pip-version-check wheel >>"$hlog" 2>&1 &&
     env "$@" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
       HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 MAKEFLAGS=-j"$(nproc)" \
       "$hvenv/bin/pip" install --disable-pip-version-check --no-cache-dir --no-build-isolation -v \
       "horovod==0.28.1" >>"$hlog" 2>&1 &&
     "$hvenv/bin/python" -c 'import horovod.torch as h; assert h.mpi_built()' >>"$hlog" 2>&1; then
    echo "$kind: ok"
  else
    local why  # an #error says why in words; else the first compiler or pip error
    why=$(sed -n "/^=== $kind build/,\$p" "$hlog" | { grep -m1 -E ': error: #error' || true; })
    [ -n "$why" ] || why=$(sed -n "/^=== $kind build/,\$p" "$hlog" | { grep -m1 -E 'error: |Error: ' || true; })
    why=$(echo "$why" | sed -E 's/^ +//; s#/[^ :]*/site-packages/#.../#g; s#/tmp/pip-[^ :]*/##g' | cut -c1-300)
    echo "$kind: failed: ${why:-$(tail -n 1 "$hlog" | cut -c1-300)}"
  fi
}
if [ $smoke = 0 ] && ! grep -qx "torch $torch_version" "$hvenv/.hvd-torch" 2>/dev/null; then
  echo "torch bench: building horovod==0.28.1 with its PyTorch extension against torch $torch_version" \
       "(log: $hlog; 10-20 minutes on 2 cores)" >&2
: >"$hlog"
  shipped=$(build_horovod shipped)
  echo "torch bench: $shipped" >&2
  if [ "$shipped" != "shipped: ok" ]; then
    cxx20=$(build_horovod cxx20 CXX="$(pwd)/bench/torch/gxx-std20")
    echo "torch bench: $cxx20" >&2
  fi
  printf '%s\n' "$shipped" ${cxx20:+"$cxx20"} >"$outcome"
  echo "torch $torch_version" >"$hvenv/.hvd-torch"
fi
[ $setup_only = 1 ] && { echo "torch bench: set up; horovod.torch: $(tr '\n' ' ' <"$outcome" 2>/dev/null)"; exit 0; }
hargs=()
if grep -qx "torch $torch_version" "$hvenv/.hvd-torch" 2>/dev/null; then
  shipped=$(grep '^shipped: ' "$outcome" || true)
  cxx20=$(grep '^cxx20: ' "$outcome" || true)
  if [ "$shipped" = "shipped: ok" ]; then
    hargs=(--horovod-python "$hvenv/bin/python")
  else
    note="horovod==0.28.1 with HOROVOD_WITH_PYTORCH=1, as it comes from PyPI, does not build against torch $torch_version: ${shipped#shipped: failed: }"
    if [ "$cxx20" = "cxx20: ok" ]; then
      hargs=(--horovod-python "$hvenv/bin/python" --horovod-note "$note. The horovod.torch column is the same source built with -std=c++20 forced (bench/torch/gxx-std20 as CXX): it compiles and runs unchanged otherwise.")
    else
      hargs=(--horovod-note "$note. Forced to -std=c++20 it does not build either: ${cxx20#cxx20: failed: }")
    fi
  fi
else
  hargs=(--horovod-note "horovod==0.28.1's PyTorch extension was not built here (a full run of bench/torch/run.sh builds it).")
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ $smoke = 1 ]; then
  "$py" bench/torch/torch_bench.py --python "$py" "${hargs[@]}" --np 2 --runs 1 --warmup 2 --steps 3 \
    --sizes 4096,1048576,16777216 --json "$out/smoke.json" "$@"
  "$py" bench/torch/report.py "$out/smoke.json"
  echo "torch bench: smoke run passed"
else
  rc=0  # failed jobs are listed in the report too; the exit status says so afterwards
  "$py" bench/torch/torch_bench.py --python "$py" "${hargs[@]}" --json "$out/torch.json" "$@" || rc=$?
  [ -s "$out/torch.json" ] || exit "${rc/#0/1}"
  cp "$out/torch.json" docs/torch-results.json
  "$py" bench/torch/report.py docs/torch-results.json --doc docs/performance.md --plots docs/img
  exit $rc
fi
