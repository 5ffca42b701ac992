#!/usr/bin/env bash
# Builds the op library with Bazel (offline) and copies it into the Python package:
#   bazel-bin/ops/_tfcomp_ops.so -> tfcomp/_tfcomp_ops.so
# Uses the Python on PATH (the venv when run from scripts/setup.sh or the Makefile) or PYTHON_BIN_PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
for arg in "$@"; do
  if [ "$arg" = --config=cuda ]; then
    echo "build_ops.sh builds the CPU library tfcomp loads; the CUDA build is scripts/cuda_check.sh (make cuda-check)" >&2
    exit 2
  fi
done
scripts/bazel.sh build //ops:_tfcomp_ops.so "$@"
cmp -s bazel-bin/ops/_tfcomp_ops.so tfcomp/_tfcomp_ops.so || install -m 0755 bazel-bin/ops/_tfcomp_ops.so tfcomp/_tfcomp_ops.so
