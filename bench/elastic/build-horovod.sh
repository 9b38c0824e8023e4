#!/usr/bin/env bash
# Builds the Horovod elastic reference for bench/elastic/elastic_bench.py --horovod:
# horovod==0.28.1 from PyPI's source with its Gloo controller (Horovod's elastic mode needs it)
# and its PyTorch extension, against the torch of scripts/install-python.sh's Python, in a venv
# of its own that sees that torch (a .pth file naming its site-packages).
#
#   bash bench/elastic/build-horovod.sh      # 10-20 minutes on 2 cores; prints the venv's python
#
# The compiler is bench/torch/gxx-std20 (g++ with -std=c++20 last): horovod 0.28.1 asks for
# C++14 and torch 2.15's headers refuse anything before C++20 (see that file). MPI is left out:
# the elastic reference runs horovodrun --gloo. HVD_BUILD (default build) holds the venv
# (elastic-horovod-venv) and the log (elastic-horovod-build.log).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$(realpath -m "${HVD_BUILD:-build}")
venv=$build/elastic-horovod-venv
log=$build/elastic-horovod-build.log
py=$(bash scripts/install-python.sh | tail -n 1)
mkdir -p "$build"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import horovod.torch as h; assert h.gloo_built()' 2>/dev/null; then
  echo "$venv/bin/python"
  exit 0
fi
rm -rf "$venv"
"$py" -m venv "$venv"  # the Python whose torch it sees: the same ABI
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/hvd-torch-venv.pth"
echo "build-horovod: building horovod==0.28.1 (Gloo, PyTorch) in $venv (log: $log)" >&2
# --no-build-isolation: horovod's setup.py finds torch by importing it.
if ! { "$venv/bin/pip" install --disable-pip-version-check wheel &&
       env CXX="$(pwd)/bench/torch/gxx-std20" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 \
         HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
         MAKEFLAGS=-j"$(nproc)" "$venv/bin/pip" install --disable-pip-version-check \
         --no-cache-dir --no-build-isolation -v "horovod==0.28.1" &&
       "$venv/bin/python" -c 'import horovod.torch as h; assert h.gloo_built()'; } >"$log" 2>&1; then
  echo "build-horovod: the build failed: $(grep -m1 -E 'error: |Error: ' "$log" || tail -n 1 "$log")" >&2
  exit 1
fi
echo "$venv/bin/python"
