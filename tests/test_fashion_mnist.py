"""examples/fashion_mnist.py: tfds's fashion_mnist built offline from Debian's archives holds the
archives' images and labels, and the per-worker pipeline shards them."""

import gzip
import os

import numpy as np
import pytest
import tensorflow as tf

from examples import fashion_mnist

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(fashion_mnist.DEBIAN_DIR, fashion_mnist.DEBIAN_FILES["test_data"])),
    reason="Debian's dataset-fashion-mnist is not installed (make setup installs it)")


def read_idx(name):
    """The reference: an IDX archive decoded with NumPy alone (big-endian header, then uint8 data)."""
    with gzip.open(os.path.join(fashion_mnist.DEBIAN_DIR, fashion_mnist.DEBIAN_FILES[name]), "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("tfds"))
    assert fashion_mnist.prepare(directory) == directory
    return directory


def test_splits_hold_the_archives_images_and_labels(data_dir, rng):
    import tensorflow_datasets as tfds

    for split in ("train", "test"):
        images, labels = tfds.as_numpy(tfds.load("fashion_mnist", split=split, as_supervised=True, batch_size=-1,
                                                 download=False, data_dir=data_dir))
        assert images.shape == (fashion_mnist.SPLIT_SIZES[split], 28, 28, 1) and images.dtype == np.uint8
        assert set(np.unique(labels)) == set(range(10))
        reference_images, reference_labels = read_idx(f"{split}_data"), read_idx(f"{split}_labels")
        # tfds stores the examples in its own shuffled order: match them by content.
        index = {image.tobytes(): label for image, label in zip(reference_images, reference_labels)}
        for i in rng.choice(len(images), 200, replace=False):
            assert index[images[i, ..., 0].tobytes()] == labels[i]
        assert np.array_equal(np.bincount(labels, minlength=10), np.bincount(reference_labels, minlength=10))


def test_prepared_dataset_is_reused(data_dir):
    before = sorted(os.listdir(os.path.join(data_dir, "fashion_mnist", "3.0.1")))
    assert fashion_mnist.prepare(data_dir) == data_dir
    assert sorted(os.listdir(os.path.join(data_dir, "fashion_mnist", "3.0.1"))) == before


def test_worker_shards_are_disjoint_equal_and_scaled(data_dir):
    shards = []
    for rank in range(3):
        batches = list(fashion_mnist.input_pipeline(rank, 3, 16, seed=0, examples=1000, data_dir=data_dir))
        assert len(batches) == 1000 // 3 // 16
        x = np.concatenate([b[0].numpy() for b in batches])
        assert x.dtype == np.float32 and x.shape[1:] == (28, 28, 1) and 0.0 <= x.min() and x.max() <= 1.0
        assert batches[0][1].dtype == tf.int32
        shards.append({row.tobytes() for row in x})
    assert not (shards[0] & shards[1]) and not (shards[1] & shards[2]) and not (shards[0] & shards[2])


def test_bad_arguments_name_themselves(data_dir):
    with pytest.raises(ValueError, match="rank"):
        fashion_mnist.input_pipeline(3, 3, 16, seed=0, data_dir=data_dir)
    with pytest.raises(ValueError, match="examples"):
        fashion_mnist.input_pipeline(0, 4, 64, seed=0, examples=100, data_dir=data_dir)


def test_missing_debian_package_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(fashion_mnist, "DEBIAN_DIR", str(tmp_path / "absent"))
    with pytest.raises(fashion_mnist.DatasetUnavailable, match="dataset-fashion-mnist is not installed"):
        fashion_mnist.prepare(str(tmp_path / "empty"))
