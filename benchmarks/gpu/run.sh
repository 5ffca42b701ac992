#!/usr/bin/env bash
# The GPU harness in one command, on a machine with a GPU, nvcc and PyTorch or CuPy (no TensorFlow):
#   benchmarks/gpu/run.sh
# 1. builds build/gpu_harness/gpu_harness for this GPU (TFCOMP_CUDA_ARCHS=native unless set);
# 2. --self-check, then --check: every kernel against the CPU reference, d up to 2^MAX_LOG2 (27);
#    stops here if any check fails;
# 3. --bench and framework_baselines.py for d = 2^MIN_LOG2 (20) ... 2^MAX_LOG2, RUNS (21) runs each;
# 4. report.py: the table to benchmarks/results/gpu_benchmark.md, appended to BENCHMARKS.md.
# Raw output: benchmarks/results/gpu_{self_check,check,benchmark_raw}.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
min_log2=${MIN_LOG2:-20}
max_log2=${MAX_LOG2:-27}
runs=${RUNS:-21}
results=benchmarks/results
harness=build/gpu_harness/gpu_harness

TFCOMP_CUDA_ARCHS=${TFCOMP_CUDA_ARCHS:-native} benchmarks/gpu/build.sh build/gpu_harness
"$harness" --self-check > "$results/gpu_self_check.txt"
tail -1 "$results/gpu_self_check.txt"
"$harness" --check --max-log2 "$max_log2" | tee "$results/gpu_check.txt"
"$harness" --bench --min-log2 "$min_log2" --max-log2 "$max_log2" --runs "$runs" | tee "$results/gpu_benchmark_raw.txt"
python3 benchmarks/gpu/framework_baselines.py --min-log2 "$min_log2" --max-log2 "$max_log2" --runs "$runs" |
  tee -a "$results/gpu_benchmark_raw.txt"
python3 benchmarks/gpu/report.py "$results/gpu_benchmark_raw.txt" --out "$results/gpu_benchmark.md" --append BENCHMARKS.md
