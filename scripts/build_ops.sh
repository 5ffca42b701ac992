#!/usr/bin/env bash
# Builds the op library with Bazel (offline) and copies it into the Python package:
#   bazel-bin/ops/_tfcomp_ops.so -> tfcomp/_tfcomp_ops.so
# Uses the Python on PATH (the venv when run from scripts/setup.sh or the Makefile).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_BIN=${PYTHON_BIN_PATH:-$(command -v python)}
TF_VERSION=$("$PYTHON_BIN" -c "import tensorflow as tf; print(tf.__version__)" 2>/dev/null)
bazel build --repo_env=PYTHON_BIN_PATH="$PYTHON_BIN" --repo_env=TFCOMP_TF_VERSION="$TF_VERSION" \
  //ops:_tfcomp_ops.so "$@"
install -m 0755 bazel-bin/ops/_tfcomp_ops.so tfcomp/_tfcomp_ops.so
