#!/bin/sh
# Runs the runtime's GPU test on a machine with a CUDA GPU and NCCL (the device machine),
# from the repository root:
#
#   sh tests/gpu/run_gpu_tests.sh [BUNDLE_DIR=.gpu-bundle]
#
# BUNDLE_DIR comes from tests/gpu/make_gpu_bundle.sh, run on a machine where the project
# builds (it holds rt_test_gpu and the Open MPI it needs; the GPU machine has no MPI packages).
# The test runs as one rank in Open MPI's singleton mode (no mpirun, no orted): the NCCL
# backend on one GPU, device buffers of every type, fusion on device, device outputs.
# Exits 0 when the test passed, 77 when it was skipped (no GPU), 1 otherwise.
set -u
bundle=${1:-.gpu-bundle}
[ -x "$bundle/bin/rt_test_gpu" ] || {
  echo "no $bundle/bin/rt_test_gpu: run tests/gpu/make_gpu_bundle.sh BUILD_DIR $bundle first" >&2
  exit 1
}
bundle=$(cd "$bundle" && pwd)

# CUDA runtime and NCCL from this machine: the toolkit, then pip's nvidia-* wheels.
extra=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
         /usr/lib/x86_64-linux-gnu; do
  [ -e "$d/libcudart.so.13" ] && { extra="$extra:$d"; break; }
done
nccl=$(ls /usr/local/cuda/lib*/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so.2 2>/dev/null | head -1)
if [ -z "$nccl" ] && command -v python3 >/dev/null; then
  nccl=$(python3 -c 'import nvidia.nccl, os; p = os.path.join(list(nvidia.nccl.__path__)[0], "lib"); print(os.path.join(p, "libnccl.so.2"))' 2>/dev/null || true)
fi
[ -z "$nccl" ] && nccl=$(find / -name libnccl.so.2 -not -path '*/proc/*' 2>/dev/null | head -1)
[ -n "$nccl" ] && [ -e "$nccl" ] || { echo "libnccl.so.2 not found on this machine" >&2; exit 1; }
if [ -z "$extra" ] && command -v python3 >/dev/null; then
  d=$(python3 -c 'import nvidia.cuda_runtime, os; print(os.path.join(list(nvidia.cuda_runtime.__path__)[0], "lib"))' 2>/dev/null || true)
  [ -n "$d" ] && extra=":$d"
fi
echo "NCCL: $nccl; CUDA runtime from:${extra:- (default search path)}"

export LD_LIBRARY_PATH="$bundle/lib:$(dirname "$nccl")$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Open MPI from the bundle, as a singleton that starts no daemon, over shared memory only.
export OMPI_MCA_mca_base_component_path="$bundle/openmpi"
export PMIX_MCA_mca_base_component_path="$bundle/pmix"
export OMPI_MCA_ess_singleton_isolated=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self OMPI_MCA_osc=pt2pt,sm OMPI_MCA_coll=^hcoll
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv

echo "== MPI check (no CUDA)"
"$bundle/bin/rt_test_gpu" --mpi-only || { echo "FAIL: the carried Open MPI does not start here"; exit 1; }
echo "== GPU test"
"$bundle/bin/rt_test_gpu"
rc=$?
case $rc in
  0) echo "GPU test passed" ;;
  77) echo "GPU test skipped" ;;
  *) echo "GPU test FAILED (exit $rc)"; rc=1 ;;
esac
exit $rc
