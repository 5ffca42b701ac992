"""Worker of tests/test_cluster.py: times Horovod allreduces of one 32 MiB float32 tensor.

    horovodrun -np K -H $TFCOMP_HOSTS --gloo --network-interface eth0 python tests/cluster_worker.py

After two untimed allreduces it times --repeats more, each started right after a barrier, and rank 0
prints one JSON line: {"workers": K, "bytes": S, "seconds": [...]}.
"""

import argparse
import json
import time

import horovod.tensorflow as hvd
import tensorflow as tf

BYTES = 32 * 2**20


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    hvd.init()
    tensor = tf.random.stateless_uniform([BYTES // 4], seed=[hvd.rank(), 1])
    seconds = []
    for repeat in range(2 + args.repeats):
        hvd.allreduce(tf.constant(0.0), name="barrier")
        start = time.perf_counter()
        hvd.allreduce(tensor, name="timed", op=hvd.Sum).numpy()
        if repeat >= 2:
            seconds.append(time.perf_counter() - start)
    if hvd.rank() == 0:
        print(json.dumps({"workers": hvd.size(), "bytes": BYTES, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
