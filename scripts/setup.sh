#!/usr/bin/env bash
# Takes a fresh Debian machine to a working tfcomp checkout, using only Debian packages and PyPI:
#   1. Debian's bazel-bootstrap (Bazel 4, works offline with the stand-ins in build_deps/),
#   2. a virtual environment .venv with the pinned Python stack (see requirements.txt),
#   3. Horovod 0.28.1 built from source with Gloo against that TensorFlow,
#   4. the op library _tfcomp_ops.so built by Bazel with no network access, and the checkout put on
#      the venv's sys.path (a .pth file), so `import tfcomp` works from any directory.
# Running it again is fast: every step checks whether its result is already there and skips.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${TFCOMP_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

log() { printf '[setup] %s\n' "$*"; }

# 1. Debian packages.
need_apt=()
command -v bazel >/dev/null 2>&1 || need_apt+=(bazel-bootstrap)
[ -d /usr/share/bazel/tools/platforms ] || need_apt+=(bazel-platforms)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
# The emulated cluster (benchmarks/cluster.py) runs one sshd per host namespace.
[ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
# Fashion-MNIST's four IDX archives, from which tfds builds its fashion_mnist offline.
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || need_apt+=(dataset-fashion-mnist)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt-get install ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need_apt[@]}"
else
  log "Debian packages present"
fi

# 2. Virtual environment with the pinned stack.
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
req_stamp="$VENV/.tfcomp-requirements.sha256"
req_hash=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ "$(cat "$req_stamp" 2>/dev/null)" != "$req_hash" ]; then
  log "pip install -r requirements.txt"
  "$VPY" -m pip install -q --upgrade pip setuptools wheel
  "$VPY" -m pip install -q -r requirements.txt
  echo "$req_hash" > "$req_stamp"
else
  log "Python requirements present"
fi

# 3. Horovod with Gloo, built against the venv's TensorFlow (pip caches the built wheel).
if ! "$VPY" -c "import horovod.tensorflow as h; assert h.gloo_built()" >/dev/null 2>&1; then
  log "building horovod==0.28.1 with Gloo (about 2 minutes on 2 cores)"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 CMAKE_POLICY_VERSION_MINIMUM=3.5 \
    "$VPY" -m pip install -q --no-build-isolation horovod==0.28.1
else
  log "horovod with Gloo present"
fi

# The checkout is importable from the venv (like an editable install, without a pip build).
site_packages=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
[ "$(cat "$site_packages/tfcomp-checkout.pth" 2>/dev/null)" = "$ROOT" ] || echo "$ROOT" > "$site_packages/tfcomp-checkout.pth"

# 4. The op library (Bazel caches the build; a no-op rebuild takes about a second).
log "building the op library"
PATH="$VENV/bin:$PATH" "$ROOT/scripts/build_ops.sh"
log "done: activate with 'source $VENV/bin/activate'"
