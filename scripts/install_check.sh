#!/usr/bin/env bash
# `make install-check` (not in CI: about 5 minutes): installs tfcomp as a library into a fresh virtual
# environment the way the README says, then, from a directory outside the checkout, checks that
# tfcomp imports, an op matches NumPy, the what-if answers, a 2-worker Horovod job trains with
# DRAGONN, `pip check` is clean, the build left nothing in the checkout and no Bazel server runs.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3.11}
WORK=$(mktemp -d /tmp/tfcomp-install-check-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
say() { printf '[install-check] %s\n' "$*"; }
started=$SECONDS

git -C "$ROOT" status --porcelain --ignored > "$WORK/tree.before"
bazel_servers() { pgrep -f 'tfcomp-bazel-' || true; }

say "fresh venv $WORK/venv; TensorFlow, then Horovod built against it"
"$PY" -m venv "$WORK/venv"
V="$WORK/venv/bin"
"$V/pip" install -q --upgrade pip setuptools wheel
"$V/pip" install -q "tensorflow-cpu==2.15.1" "protobuf>=4.25,<5"
HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
HOROVOD_WITHOUT_MXNET=1 CMAKE_POLICY_VERSION_MINIMUM=3.5 \
  "$V/pip" install -q --no-build-isolation horovod==0.28.1
say "pip install $ROOT"
"$V/pip" install -q "$ROOT"
"$V/pip" check

git -C "$ROOT" status --porcelain --ignored > "$WORK/tree.after"
if ! diff -u "$WORK/tree.before" "$WORK/tree.after"; then say "FAIL: the build left files in the checkout"; exit 1; fi
say "the checkout is as it was (git status --ignored)"
if [ -n "$(bazel_servers)" ]; then say "FAIL: a Bazel server of the build still runs"; exit 1; fi
say "no Bazel server left running"

cd "$WORK"
export TF_CPP_MIN_LOG_LEVEL=2 PATH="$V:$PATH"
"$V/python" - <<'PY'
import numpy as np
import tfcomp
print(f"[install-check] import tfcomp {tfcomp.__version__} from {tfcomp.__file__}")
assert "site-packages" in tfcomp.__file__, tfcomp.__file__
rng = np.random.default_rng()
g = rng.standard_normal(100_000).astype(np.float32)
values, indices = (t.numpy() for t in tfcomp.ops.topk_compress(g, 1000))
expected = np.sort(np.argsort(-np.abs(g), kind="stable")[:1000])
assert np.array_equal(np.sort(indices), expected) and np.array_equal(values[np.argsort(indices)], g[expected])
print("[install-check] topk_compress matches NumPy on 100,000 random float32")
PY
"$V/python" -m tfcomp.whatif --help > /dev/null
"$V/python" -m tfcomp.whatif --params 25000000 --workers 8 --bandwidth 10Gbps --encode-ms 5 | tail -1
cat > "$WORK/job.py" <<'PY'
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
import tfcomp

hvd.init()
rng = np.random.default_rng(hvd.rank())
x = rng.standard_normal((256, 32)).astype(np.float32)
y = (x[:, 0] > 0).astype(np.int32)
model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(256, activation="relu"), tf.keras.layers.Dense(2)])
optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), compression=tfcomp.DRAGONN(0.01, planning="off", min_elements=1000))
model.compile(optimizer, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=3, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
if hvd.rank() == 0:
    print(f"[install-check] 2-worker job: loss {history.history['loss'][0]:.3f} -> {history.history['loss'][-1]:.3f}, "
          f"compressed {tfcomp.exchange_of(optimizer).compressed_tensors()}")
PY
horovodrun -np 2 -H localhost:2 --gloo "$V/python" "$WORK/job.py" 2>&1 | grep -o '\[install-check\].*'
say "all checks passed in $((SECONDS - started)) s"
