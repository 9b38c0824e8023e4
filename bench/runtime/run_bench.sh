#!/bin/sh
# Runs bench_runtime on 4 ranks of this machine (oversubscribed if it has fewer cores), with
# the same Open MPI settings as the tests. Usage: run_bench.sh BUILD_DIR [bench options]
set -eu
build=${1:?usage: run_bench.sh BUILD_DIR [options]}
shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_hwloc_base_binding_policy=none
export OMPI_MCA_btl_vader_single_copy_mechanism=none
exec mpirun --oversubscribe -np "${NP:-4}" "$build/bench/runtime/bench_runtime" "$@"
