#!/usr/bin/env bash
# The GPU harness in one command, on a machine with a GPU, nvcc and PyTorch or CuPy (no TensorFlow):
#   benchmarks/gpu/run.sh
# 1. builds build/gpu_harness/gpu_harness for this GPU (TFCOMP_CUDA_ARCHS=native unless set), unless
#    HARNESS names a harness built already (benchmarks/gpu/build.sh elsewhere, for this GPU's arch);
# 2. --self-check, then --check: every kernel against the CPU reference, each dtype up to
#    d = 2^MAX_LOG2 (27); then the checks again under compute-sanitizer's memcheck up to
#    d = 2^MEMCHECK_LOG2 (22; skipped when compute-sanitizer is missing); stops if any check fails;
# 3. --bench and framework_baselines.py for d = 2^MIN_LOG2 (20) ... 2^MAX_LOG2, RUNS (21) runs each;
# 4. report.py: the table to RESULTS/gpu_benchmark.md, appended to APPEND_TO (research/notebook.md,
#    the dated record; set it empty to append nowhere).
# Raw output: RESULTS/gpu_{self_check,check,memcheck,benchmark_raw}.txt, RESULTS = benchmarks/results.
set -euo pipefail
cd "$(dirname "$0")/../.."
min_log2=${MIN_LOG2:-20}
max_log2=${MAX_LOG2:-27}
memcheck_log2=${MEMCHECK_LOG2:-22}
runs=${RUNS:-21}
results=${RESULTS:-benchmarks/results}
append_to=${APPEND_TO-research/notebook.md}
harness=${HARNESS:-build/gpu_harness/gpu_harness}

mkdir -p "$results"
if [ -z "${HARNESS:-}" ]; then
  TFCOMP_CUDA_ARCHS=${TFCOMP_CUDA_ARCHS:-native} benchmarks/gpu/build.sh build/gpu_harness
fi
stage() { echo "run.sh: $1 at ${SECONDS} s" >&2; }
stage "self-check"
"$harness" --self-check > "$results/gpu_self_check.txt"
tail -1 "$results/gpu_self_check.txt"
stage "check"
"$harness" --check --max-log2 "$max_log2" > "$results/gpu_check.txt" || { grep -v " ok$" "$results/gpu_check.txt"; exit 1; }
tail -1 "$results/gpu_check.txt"
stage "memcheck"
if command -v compute-sanitizer > /dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 3 "$harness" --check --max-log2 "$memcheck_log2" \
    > "$results/gpu_memcheck.txt" 2>&1 || { grep -v " ok$" "$results/gpu_memcheck.txt" | tail -40; exit 1; }
  tail -2 "$results/gpu_memcheck.txt"
else
  echo "compute-sanitizer not found: memcheck skipped" | tee "$results/gpu_memcheck.txt"
fi
stage "bench"
printf 'DRIVER\t%s\n' "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)" \
  > "$results/gpu_benchmark_raw.txt"
"$harness" --bench --min-log2 "$min_log2" --max-log2 "$max_log2" --runs "$runs" >> "$results/gpu_benchmark_raw.txt"
python3 benchmarks/gpu/framework_baselines.py --min-log2 "$min_log2" --max-log2 "$max_log2" --runs "$runs" \
  >> "$results/gpu_benchmark_raw.txt"
stage "report"
python3 benchmarks/gpu/report.py "$results/gpu_benchmark_raw.txt" --out "$results/gpu_benchmark.md" \
  ${append_to:+--append "$append_to"}
