#!/usr/bin/env bash
# Nsight Compute over one size of the GPU benchmark: per kernel, its duration and DRAM traffic.
#   benchmarks/gpu/profile.sh [LOG2 (27)] > profile.txt      (after benchmarks/gpu/run.sh built the harness;
#                                                             HARNESS names another build of it)
# Clocks are left as the card runs them (--clock-control none), so durations compare with --bench.
set -euo pipefail
cd "$(dirname "$0")/../.."
log2=${1:-27}
ncu --clock-control none --csv --page raw \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
  "${HARNESS:-build/gpu_harness/gpu_harness}" --bench --min-log2 "$log2" --max-log2 "$log2" --runs 1
