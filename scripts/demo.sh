#!/usr/bin/env bash
# The README's "run the main job" command. Installs what is missing, builds, and runs the
# RPC layer demo (bench/rpc_bench --demo) until the end-to-end launcher lands.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DHVD_WERROR=ON >/dev/null
cmake --build build -j"$(nproc)" --target rpc_bench >/dev/null
exec build/bench/rpc_bench --demo
