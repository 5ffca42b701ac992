#!/usr/bin/env bash
# `make cuda-check` (and CI): where nvcc is present, compile the CUDA build of the op library and the
# GPU harness, and run every check that needs no GPU; where it is not, say so and succeed (the CPU-only
# build needs no CUDA). Any compile error fails. Takes about 3 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=${TFCOMP_NVCC:-nvcc}
if ! command -v "$nvcc" >/dev/null 2>&1; then
  echo "cuda-check: skipped, no nvcc on PATH (set TFCOMP_NVCC to use one elsewhere)"
  exit 0
fi
"$nvcc" --version | tail -1

# 1. The op library with its DEVICE_GPU kernels (outputs under bazel-cuda-bin/, see .bazelrc).
scripts/bazel.sh build --config=cuda //ops:_tfcomp_ops.so
lib=bazel-cuda-bin/ops/_tfcomp_ops.so

# 2. It links the CUDA runtime statically, so it loads into tensorflow-cpu too: its GPU kernels must
#    be registered (13 ops: 5 x 3 dtypes, and ZeroAt, IntQuantize, IntDequantize, HashPartition,
#    SumPairs, TimeAfter, MomentumAccumulate and AdamAccumulate once), and the op tests must pass
#    with it (on its CPU kernels).
TF_CPP_MIN_LOG_LEVEL=2 python3 - "$lib" <<'PY'
import sys
import tensorflow as tf
from tensorflow.python.framework import kernels
tf.load_op_library(sys.argv[1])
expected = {"EstimateThreshold": 3, "DragonnCompress": 3, "DgcCompress": 3, "TopkCompress": 3,
            "SparseBatchedDecode": 3, "ZeroAt": 1, "IntQuantize": 1, "IntDequantize": 1,
            "HashPartition": 1, "SumPairs": 1, "TimeAfter": 1, "MomentumAccumulate": 1, "AdamAccumulate": 1}
count = {op: sum(k.device_type == "GPU" for k in kernels.get_registered_kernels_for_op("Tfcomp>" + op).kernel)
         for op in expected}
print("cuda-check: DEVICE_GPU kernels registered per op:", count)
sys.exit(0 if count == expected else 1)
PY
TFCOMP_OPS_LIBRARY=$PWD/$lib python3 -m pytest -q -p no:cacheprovider tests/test_op_library.py \
  tests/test_estimate_threshold.py tests/test_dragonn_compress.py tests/test_dgc_compress.py \
  tests/test_topk_compress.py tests/test_sparse_batched_decode.py tests/test_zero_at.py tests/test_int_quantize.py \
  tests/test_hash_partition.py tests/test_sum_pairs.py tests/test_timeline.py tests/test_accumulate.py

# 3. The standalone harness (nvcc, same kernel sources, no TensorFlow) and its host-only self-check.
benchmarks/gpu/build.sh build/gpu_harness
build/gpu_harness/gpu_harness --self-check
