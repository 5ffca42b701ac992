#!/usr/bin/env bash
# Builds the GPU harness with nvcc from the op library's CUDA sources, no TensorFlow:
#   benchmarks/gpu/build.sh [OUT_DIR]        (default build/gpu_harness; writes OUT_DIR/gpu_harness)
# TFCOMP_CUDA_ARCHS picks the GPU architectures: "80;90" by default (A100, H100), "native" for the
# GPU of this machine. NVCC overrides the compiler.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build/gpu_harness}
nvcc=${NVCC:-nvcc}
archs=${TFCOMP_CUDA_ARCHS:-80;90}
mkdir -p "$out"
if [ "$archs" = native ]; then
  gencode=(-arch=native)
else
  gencode=()
  IFS=';' read -ra list <<< "$archs"
  for a in "${list[@]}"; do gencode+=(-gencode "arch=compute_$a,code=sm_$a"); done
  gencode+=(-gencode "arch=compute_${list[-1]},code=compute_${list[-1]}")  # PTX for newer GPUs
fi
flags=(-std=c++17 -O3 -I. -Xcompiler -Wall "${gencode[@]}")
# One compiler per source, all at once; any failure fails the build.
objects=() pids=()
for src in ops/cc/cuda/*.cu.cc benchmarks/gpu/harness.cu.cc; do
  obj="$out/$(basename "$src" .cu.cc).o"
  echo "nvcc $src" >&2
  "$nvcc" "${flags[@]}" -x cu -c "$src" -o "$obj" &
  pids+=($!)
  objects+=("$obj")
done
echo "nvcc benchmarks/gpu/reference.cc (host code)" >&2
"$nvcc" "${flags[@]}" -c benchmarks/gpu/reference.cc -o "$out/reference.o" &
pids+=($!)
for pid in "${pids[@]}"; do wait "$pid"; done
"$nvcc" "${gencode[@]}" "${objects[@]}" "$out/reference.o" -o "$out/gpu_harness"
echo "$out/gpu_harness" >&2
