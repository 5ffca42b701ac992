#!/usr/bin/env bash
# The main job (`make run`): 2 Horovod workers train the ResNet-style CNN on Fashion-MNIST with
# tfcomp's default plan (DRAGONN keeping 1 %, DGC momentum correction), on 2 emulated hosts with a
# 1 Gbit/s link each (benchmarks/cluster.py) where this machine can make them, else on localhost.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"  # absolute, not resolved: the venv's python
export PATH="$(dirname "$PY"):$PATH"
TRAIN=("$PY" examples/train_keras.py --compressor=dragonn --ratio=0.01 --momentum=0.9
       --dataset=fashion_mnist --model=cnn --epochs=2 "$@")
# Build the dataset once, before the workers start (about 10 s the first time).
"$PY" -c "from examples import fashion_mnist; fashion_mnist.prepare()" 2>/dev/null || true
if reason=$("$PY" -m benchmarks.cluster check); then
  echo "make run: 2 emulated hosts, 1 Gbit/s each (benchmarks/cluster.py)"
  exec "$PY" -m benchmarks.cluster run --hosts 2 --rate 1gbit -- \
    sh -c 'exec horovodrun -np 2 -H "$TFCOMP_HOSTS" --gloo --network-interface eth0 "$@"' sh "${TRAIN[@]}"
fi
echo "make run: $reason; running both workers on localhost instead"
exec horovodrun -np 2 -H localhost:2 --gloo "${TRAIN[@]}"
