#!/usr/bin/env bash
# The README's "run a real job" command: installs what is missing, builds, and runs the
# allreduce example as a real mpirun job inside 4 local task services on 2 fake hosts:
#   hvd-driver run -np 4 --local 2 --entry libhvd_example_allreduce.so:hvd_example_allreduce
# Extra arguments go to hvd-driver (e.g. --verbose).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DHVD_WERROR=ON >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 # mpirun refuses root otherwise
exec build/bin/hvd-driver run -np 4 --local 2 "$@" \
  --entry build/examples/allreduce/libhvd_example_allreduce.so:hvd_example_allreduce
