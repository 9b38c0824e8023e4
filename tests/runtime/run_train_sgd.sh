#!/bin/sh
# train_sgd on 4 (and 3) ranks must end with the weights of a 1-rank run on the same data,
# up to floating-point summation order. The comparison is made after 4 epochs, before
# convergence, where a wrong gradient average would show; a 20-epoch run must converge.
# Usage: run_train_sgd.sh PROGRAM
set -u
prog=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Leak checking is left to the runtime's own tests (example programs do not carry
# keep_plugins.c, without which Open MPI's unloaded plugins cannot be told apart).
ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
export ASAN_OPTIONS
run() { np=$1; shift; "$HVD_MPIRUN" --oversubscribe -np "$np" "$prog" "$@" || exit 1; }
run 1 --epochs 4 --max-mse 0.01 --out "$dir/w1.txt"
run 4 --epochs 4 --max-mse 0.01 --check "$dir/w1.txt" --tol 1e-9
run 3 --epochs 4 --max-mse 0.01 --check "$dir/w1.txt" --tol 1e-9
run 4
echo "train_sgd: 3 and 4 ranks match 1 rank"
