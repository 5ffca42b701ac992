"""hash_partition against a NumPy reference: owners by the shared hash, stable order within an
owner, empty slots dropped, values carried bit for bit, its argument checks, and its memory: a huge
num_parts is refused by name (it once ended the process), the largest allowed runs in little memory."""

import re

import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference as ref
from tests.op_child import run_in_child
from tfcomp import ops

THREE_PAIRS = "np.ones(3, np.float32), np.array([0, 5, 9], np.int32)"


def random_pairs(rng, n: int, size: int):
    """float32 values (with NaN, Inf, -0.0 and denormals) and int32 indices in [-1, size), duplicates included."""
    values = rng.standard_normal(n).astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-42], np.float32)
    values[rng.integers(0, n, min(n, 5))] = specials[: min(n, 5)]
    indices = rng.integers(0, size, n).astype(np.int32)
    indices[rng.random(n) < 0.3] = -1
    indices[: n // 4] = indices[n // 4: 2 * (n // 4)]
    return values, indices


@pytest.mark.parametrize("num_parts", [1, 2, 3, 4, 8, 13, 64, 100_003])
@pytest.mark.parametrize("n, size", [(1, 1), (100, 1000), (5000, 2_000_000), (20_000, 2**31 - 1)])
def test_matches_reference(rng, num_parts, n, size):
    values, indices = random_pairs(rng, n, size)
    rows, splits = ops.hash_partition(values, indices, num_parts)
    expected_rows, expected_splits = ref.hash_partition(values, indices, num_parts)
    np.testing.assert_array_equal(splits.numpy(), expected_splits)
    np.testing.assert_array_equal(rows.numpy(), expected_rows)  # int32 rows: values compared bit for bit
    assert rows.shape == (int(np.sum(indices >= 0)), 2)


def test_owners_spread_one_layers_neighbouring_indices(rng):
    """A contiguous run of indices (one layer's top elements) lands on every owner about equally."""
    indices = np.arange(100_000, 140_000, dtype=np.int32)
    _, splits = ops.hash_partition(np.ones(indices.size, np.float32), indices, 8)
    counts = splits.numpy()
    assert counts.sum() == indices.size
    assert counts.min() > 0.9 * indices.size / 8 and counts.max() < 1.1 * indices.size / 8


def test_every_owner_gets_only_its_indices(rng):
    values, indices = random_pairs(rng, 3000, 50_000)
    rows, splits = ops.hash_partition(values, indices, 5)
    start = 0
    for owner, count in enumerate(splits.numpy()):
        part = rows.numpy()[start:start + count, 0]
        assert np.all(ref.hash_owner(part, 5) == owner)
        start += count


def test_in_a_function_with_unknown_length(rng):
    values, indices = random_pairs(rng, 777, 10_000)
    partition = tf.function(lambda v, i: ops.hash_partition(v, i, 4),
                            input_signature=[tf.TensorSpec([None], tf.float32), tf.TensorSpec([None], tf.int32)])
    rows, splits = partition(values, indices)
    expected_rows, expected_splits = ref.hash_partition(values, indices, 4)
    np.testing.assert_array_equal(rows.numpy(), expected_rows)
    np.testing.assert_array_equal(splits.numpy(), expected_splits)


def test_empty_and_all_empty_slots():
    rows, splits = ops.hash_partition(np.zeros(0, np.float32), np.zeros(0, np.int32), 3)
    assert rows.shape == (0, 2) and splits.numpy().tolist() == [0, 0, 0]
    rows, splits = ops.hash_partition(np.ones(4, np.float32), -np.ones(4, np.int32), 2)
    assert rows.shape == (0, 2) and splits.numpy().tolist() == [0, 0]


@pytest.mark.parametrize("values, indices, num_parts, error, match", [
    (np.ones(3, np.float32), np.array([0, -2, 1], np.int32), 2, tf.errors.InvalidArgumentError,
     r"indices\[1\] = -2 is negative"),
    (np.ones(3, np.float32), np.array([0, 1], np.int32), 2, (tf.errors.InvalidArgumentError, ValueError),
     "same length"),
    (np.ones((2, 2), np.float32), np.array([0, 1], np.int32), 2, (tf.errors.InvalidArgumentError, ValueError),
     "values must be a vector"),
    (np.ones(2, np.float32), np.array([0, 1], np.int32), 0, ValueError, "num_parts"),
    (np.ones(2, np.float32), np.array([0, 1], np.int32), 2**20 + 1, ValueError,
     r"num_parts must be in \[1, 1048576\], got 1048577"),
    (np.ones(2, np.float32), np.array([0, 1], np.int32), 2.0, TypeError, "num_parts"),
    (np.ones(2, np.float32), np.array([0, 2**31], np.int64), 2, ValueError, "indices"),
])
def test_bad_arguments_are_named(values, indices, num_parts, error, match):
    with pytest.raises(error, match=match):
        ops.hash_partition(values, indices, num_parts)


@pytest.mark.parametrize("call", [f"ops.hash_partition({THREE_PAIRS}, 2**26)",
                                  f"raw.tfcomp_hash_partition({THREE_PAIRS}, num_parts=2**26)"],
                         ids=["wrapper", "kernel"])
@pytest.mark.jobs
def test_a_huge_num_parts_is_refused_by_name_in_little_memory(call):
    """num_parts = 2^26 for 3 pairs once took 772 MiB and ended the process on an uncaught
    std::bad_alloc; now the wrapper and, without it, the kernel refuse it, naming num_parts and its
    limit, within 512 MiB (run in a child process, so that a crash fails only this test)."""
    record = run_in_child(call, budget_mib=512)
    assert record["outcome"] == "raised", record
    assert record["error"] in ("ValueError", "InvalidArgumentError"), record
    assert re.search(r"num_parts must be in \[1, 1048576\].*got 67108864", record["message"]), record


def test_the_shape_function_refuses_a_huge_num_parts():
    raw_op = ops.load_library().tfcomp_hash_partition
    with pytest.raises(ValueError, match=r"num_parts must be in \[1, 1048576\].*got 1048577"):
        tf.function(lambda: raw_op(np.ones(3, np.float32), np.zeros(3, np.int32), num_parts=2**20 + 1))()


@pytest.mark.jobs
def test_the_largest_num_parts_partitions_in_little_memory(rng, tmp_path):
    """num_parts = 2^20: the reference's rows and splits within 32 MiB, of which splits take 4 (a
    scratch of num_parts cursors is not needed: the kernel's memory is its outputs)."""
    values, indices = random_pairs(rng, 5000, 2**31 - 1)
    np.savez(tmp_path / "pairs.npz", values=values, indices=indices)
    record = run_in_child(f"ops.hash_partition(pairs['values'], pairs['indices'], {ops.MAX_NUM_PARTS})", budget_mib=32,
                          setup=f"pairs = dict(np.load({str(tmp_path / 'pairs.npz')!r}))", save=str(tmp_path / "out.npz"))
    assert record["outcome"] == "returned", record
    outputs = np.load(tmp_path / "out.npz")
    expected_rows, expected_splits = ref.hash_partition(values, indices, ops.MAX_NUM_PARTS)
    np.testing.assert_array_equal(outputs["output_1"], expected_splits)
    np.testing.assert_array_equal(outputs["output_0"], expected_rows)
