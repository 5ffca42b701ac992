#!/usr/bin/env bash
# `make asan-test`: builds the op library with AddressSanitizer (--config=asan: its own output tree,
# bazel-asan-bin/, so the library in tfcomp/ is untouched) and runs the fuzz cases of
# tests/test_fuzz_ops.py against it, the ASan runtime preloaded into Python (which is not built with
# ASan). Leak detection is off: Python and TensorFlow keep memory until exit by design. Any ASan
# report fails a fuzz worker, and the test names its case. TFCOMP_FUZZ_CASES sets the cases per op.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bazel.sh build --config=asan //ops:_tfcomp_ops.so
lib=$PWD/bazel-asan-bin/ops/_tfcomp_ops.so
# The ASan runtime first, and libstdc++ with it: Python does not link libstdc++, and ASan's
# __cxa_throw interceptor aborts on TensorFlow's first C++ exception unless it is there at start-up.
asan=$(ldd "$lib" | awk '/libasan/ {print $3}')
stdcxx=$(ldd "$lib" | awk '/libstdc\+\+/ {print $3}')
if [ -z "$asan" ] || [ -z "$stdcxx" ] || ! nm -D "$lib" | grep -q __asan_report_load; then
  echo "asan-test: $lib is not instrumented and linked against libasan and libstdc++" >&2
  exit 1
fi
# TF_ENABLE_ONEDNN_OPTS=0: tensors from TensorFlow's plain CPU allocator (malloc, which ASan guards
# with redzones) instead of oneDNN's, which carves them out of large chunks of its own.
export LD_PRELOAD="$asan $stdcxx" ASAN_OPTIONS=detect_leaks=0 TF_ENABLE_ONEDNN_OPTS=0 TFCOMP_OPS_LIBRARY=$lib
# The instrumented library must be the one the workers load.
python3 -c "from tfcomp import ops; ops.load_library(); assert 'libasan' in open('/proc/self/maps').read()"
python3 -m pytest -q -s -p no:cacheprovider tests/test_fuzz_ops.py
