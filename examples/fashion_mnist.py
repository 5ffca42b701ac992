"""Fashion-MNIST through tensorflow-datasets, offline, built from Debian's `dataset-fashion-mnist`.

    from examples import fashion_mnist
    fashion_mnist.prepare()                       # once; later calls return at once
    train = tfds.load("fashion_mnist", split="train", as_supervised=True, download=False)

tfds's registered download URLs are not reachable here, and Debian's archives hold the same images
re-compressed (so tfds's checksums refuse them). `prepare()` runs tfds's own `FashionMNIST` builder
with one change, its `_split_generators` reading the Debian files, and writes the usual prepared
dataset (`fashion_mnist/3.0.1` in the tfds data directory: $TFDS_DATA_DIR, else
~/tensorflow_datasets). From then on `tfds.load("fashion_mnist", download=False)` loads it like any
prepared dataset: splits `train` (60,000) and `test` (10,000) of {"image": uint8 [28, 28, 1],
"label": int64 in 0..9}, `as_supervised`, slicing such as `train[:10%]`.

`input_pipeline` is the tf.data a Horovod user writes on top: this worker's shard, shuffled,
scaled to [0, 1], batched, prefetched.
"""

import fcntl
import os

import numpy as np
import tensorflow as tf

__all__ = ["DEBIAN_DIR", "DatasetUnavailable", "input_pipeline", "prepare", "test_arrays"]

DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
DEBIAN_FILES = {
    "train_data": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_data": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
NAME = "fashion_mnist"
SPLIT_SIZES = {"train": 60_000, "test": 10_000}


class DatasetUnavailable(RuntimeError):
    """Fashion-MNIST is neither prepared in the tfds data directory nor buildable here."""


def _builder_from_debian(data_dir):
    """tfds's FashionMNIST builder whose split generators read DEBIAN_DIR instead of downloading."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.image_classification import mnist

    class FashionMNISTFromDebian(mnist.FashionMNIST, skip_registration=True):
        name = NAME

        def _split_generators(self, dl_manager):
            files = dl_manager.extract({k: os.path.join(DEBIAN_DIR, v) for k, v in DEBIAN_FILES.items()})
            return [tfds.core.SplitGenerator(name=split, gen_kwargs=dict(
                        num_examples=SPLIT_SIZES[split], data_path=files[f"{split}_data"],
                        label_path=files[f"{split}_labels"]))
                    for split in ("train", "test")]

    return FashionMNISTFromDebian(data_dir=data_dir)


def prepare(data_dir=None) -> str:
    """Makes `tfds.load("fashion_mnist", data_dir=data_dir, download=False)` work; returns the data
    directory. Builds from Debian's archives the first time (about 20 s; a file lock keeps workers
    started together from building it twice). Raises DatasetUnavailable when it is not prepared and
    the Debian package is not installed."""
    import tensorflow_datasets as tfds

    builder = tfds.builder(NAME, data_dir=data_dir)
    if builder.is_prepared():
        return str(builder.data_dir_root)
    missing = [f for f in DEBIAN_FILES.values() if not os.path.exists(os.path.join(DEBIAN_DIR, f))]
    if missing:
        raise DatasetUnavailable(f"Fashion-MNIST is not prepared in {builder.data_dir_root} and Debian's "
                                 f"dataset-fashion-mnist is not installed ({DEBIAN_DIR}/{missing[0]} is missing)")
    os.makedirs(builder.data_dir_root, exist_ok=True)
    with open(os.path.join(builder.data_dir_root, f".{NAME}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not tfds.builder(NAME, data_dir=data_dir).is_prepared():
                tfds.disable_progress_bar()
                _builder_from_debian(builder.data_dir_root).download_and_prepare()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return str(builder.data_dir_root)


def _scale(image, label):
    return tf.cast(image, tf.float32) / 255.0, tf.cast(label, tf.int32)


def input_pipeline(rank: int, size: int, batch_size: int, seed: int, examples=None, data_dir=None) -> tf.data.Dataset:
    """This worker's training data: its part of the `train` split (of its first `examples` if
    given), read as `tfds.even_splits` cuts it so that a worker reads and decodes only its own
    records and every worker has the same number of batches, cached, shuffled anew every epoch
    (seeded by `seed` and `rank`), scaled to float32 [0, 1], in batches of
    ([batch_size, 28, 28, 1] float32, [batch_size] int32), prefetched."""
    import tensorflow_datasets as tfds

    if not 0 <= rank < size:
        raise ValueError(f"rank: {rank} is not in [0, size={size})")
    total = SPLIT_SIZES["train"] if examples is None else int(examples)
    if not 0 < total <= SPLIT_SIZES["train"]:
        raise ValueError(f"examples: {examples} is not in 1..{SPLIT_SIZES['train']}")
    batches = total // size // batch_size
    if batches == 0:
        raise ValueError(f"examples: {total} examples give no batch of {batch_size} to each of {size} workers")
    shard = tfds.even_splits(f"train[:{total}]", n=size, drop_remainder=True)[rank]
    data = tfds.load(NAME, split=shard, as_supervised=True, download=False, data_dir=prepare(data_dir))
    return (data.take(batches * batch_size).cache()
            .shuffle(batches * batch_size, seed=seed * 1000 + rank, reshuffle_each_iteration=True)
            .map(_scale, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch_size, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE))


def test_arrays(examples=None, data_dir=None) -> tuple:
    """(x [n, 28, 28, 1] float32 in [0, 1], y [n] int32) of the `test` split (its first `examples`)."""
    import tensorflow_datasets as tfds

    split = "test" if examples is None else f"test[:{int(examples)}]"
    x, y = tfds.as_numpy(tfds.load(NAME, split=split, as_supervised=True, batch_size=-1, download=False,
                                   data_dir=prepare(data_dir)))
    return (x.astype(np.float32) / 255.0), y.astype(np.int32)
