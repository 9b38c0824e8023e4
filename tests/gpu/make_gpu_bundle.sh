#!/bin/sh
# Prepares what tests/gpu/run_gpu_tests.sh needs on a GPU machine that has CUDA and NCCL but
# no Open MPI: the test binary built here, and Open MPI's libraries, plugins and their
# dependencies (no glibc, no CUDA, no NCCL: those come from the GPU machine).
#
# Usage: tests/gpu/make_gpu_bundle.sh BUILD_DIR [OUT_DIR=.gpu-bundle]
# Then carry OUT_DIR to the GPU machine (it is ignored by git: add it to .git/info/exclude)
# and run: sh tests/gpu/run_gpu_tests.sh OUT_DIR
set -eu
build=${1:?usage: make_gpu_bundle.sh BUILD_DIR [OUT_DIR]}
out=${2:-.gpu-bundle}
bin="$build/tests/gpu/rt_test_gpu"
[ -x "$bin" ] || { echo "no $bin: configure with CUDA and NCCL found and build rt_test_gpu" >&2; exit 1; }
ompi_plugins=$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed -n 's/^path:pkglibdir://p')
[ -n "$ompi_plugins" ] || ompi_plugins=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
pmix_plugins=$(ls -d /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix 2>/dev/null || true)

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/openmpi" "$out/pmix"
cp "$bin" "$out/bin/"
cp "$ompi_plugins"/*.so "$out/openmpi/"
[ -z "$pmix_plugins" ] || cp "$pmix_plugins"/*.so "$out/pmix/"
# Shared libraries of the binary and of every plugin, minus what the GPU machine provides.
for f in "$bin" "$out"/openmpi/*.so "$out"/pmix/*.so; do ldd "$f" 2>/dev/null; done |
  awk '/=> \//{print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcudart|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
du -sh "$out"
