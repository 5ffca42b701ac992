#!/usr/bin/env bash
# Runs Bazel against the TensorFlow of the Python on PATH (or PYTHON_BIN_PATH), e.g.
#   scripts/bazel.sh build //ops:_tfcomp_ops.so      scripts/bazel.sh test //...
# Passing the interpreter and its TensorFlow version as --repo_env makes the tf_configure repository
# re-run when either changes, and keeps every invocation on the same configuration (no rebuilds).
# TFCOMP_BAZEL_STARTUP: Bazel startup options (setup.py: --batch and an output root of its own).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_BIN=${PYTHON_BIN_PATH:-$(command -v python3)}
TF_VERSION=$("$PYTHON_BIN" -c "import tensorflow as tf; print(tf.__version__)" 2>/dev/null) || {
  echo "scripts/bazel.sh: '$PYTHON_BIN' cannot import tensorflow; run scripts/setup.sh first" >&2
  exit 1
}
command=$1
shift
# shellcheck disable=SC2086 # startup options are words
exec bazel ${TFCOMP_BAZEL_STARTUP:-} "$command" --repo_env=PYTHON_BIN_PATH="$PYTHON_BIN" --repo_env=TFCOMP_TF_VERSION="$TF_VERSION" "$@"
