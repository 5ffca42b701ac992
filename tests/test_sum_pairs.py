"""sum_pairs against a NumPy reference: sums per index in row order, the kept sums chosen by
magnitude (NaN, Inf, ties to the lower index), ascending index order, its argument checks, and
scratch beyond the process's memory as an error."""

import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference as ref
from tests.op_child import run_in_child
from tfcomp import ops


def random_rows(rng, n: int, distinct: int, top: int = 2**31 - 1):
    """int32 [n, 2] rows: indices drawn from `distinct` values in [0, top] (so they repeat), values
    float32 with NaN, Inf, -Inf, -0.0 and a denormal among them, as float32 bits."""
    choices = rng.choice(top + 1, size=min(distinct, top + 1), replace=False)
    indices = rng.choice(choices, size=n).astype(np.int32)
    values = rng.standard_normal(n).astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-42], np.float32)
    values[rng.integers(0, n, min(n, 5))] = specials[: min(n, 5)]
    return np.stack([indices, values.view(np.int32)], axis=1)


def assert_same_sums(got: np.ndarray, want: np.ndarray) -> None:
    """Rows equal bit for bit, except that any NaN sum equals any NaN (Inf + -Inf gives a NaN whose
    sign depends on the CPU's operand order)."""
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_array_equal(got[:, 0], want[:, 0])
    nan = np.isnan(got[:, 1].view(np.float32))
    np.testing.assert_array_equal(nan, np.isnan(want[:, 1].view(np.float32)))
    np.testing.assert_array_equal(got[~nan, 1], want[~nan, 1])


@pytest.mark.parametrize("max_pairs", [None, 0, 1, 7, "third", "all"])
@pytest.mark.parametrize("n, distinct, top", [(1, 1, 0), (100, 40, 1000), (5000, 3000, 2**21),
                                              (30_000, 20_000, 2**31 - 1)])
def test_matches_reference(rng, max_pairs, n, distinct, top):
    rows = random_rows(rng, n, distinct, top)
    limit = {"third": n // 3, "all": 2**31 - 1}.get(max_pairs, max_pairs)
    sums = ops.sum_pairs(rows, limit).numpy()
    assert_same_sums(sums, ref.sum_pairs(rows, -1 if limit is None else limit))
    distinct_indices = np.unique(rows[:, 0]).size
    assert sums.shape == (distinct_indices if limit is None else min(limit, distinct_indices), 2)


def test_sums_add_in_row_order():
    """1e8 + 1 rounds to 1e8 in float32: (1e8 + 1) - 1e8 is 0 where (1e8 - 1e8) + 1 is 1."""
    values = np.array([1e8, 1.0, -1e8], np.float32)
    rows = np.stack([np.full(3, 5, np.int32), values.view(np.int32)], axis=1)
    assert ops.sum_pairs(rows).numpy()[0, 1].view(np.float32) == 0.0
    assert ops.sum_pairs(rows[[0, 2, 1]]).numpy()[0, 1].view(np.float32) == 1.0


def test_keeps_the_largest_nan_and_inf_first_ties_to_the_lower_index():
    values = np.array([1.0, -3.0, 3.0, np.inf, 2.0, np.nan, -np.inf], np.float32)
    indices = np.array([60, 50, 40, 30, 20, 10, 0], np.int32)
    rows = np.stack([indices, values.view(np.int32)], axis=1)
    kept = {k: ops.sum_pairs(rows, k).numpy()[:, 0].tolist() for k in range(8)}
    assert kept[1] == [10]                 # NaN
    assert kept[2] == [0, 10]              # then -Inf (index 0) before +Inf (index 30)
    assert kept[3] == [0, 10, 30]
    assert kept[4] == [0, 10, 30, 40]      # |3| twice: index 40 before 50
    assert kept[5] == [0, 10, 30, 40, 50]
    assert kept[7] == sorted(indices.tolist())


def test_equals_the_tensorflow_ops_it_replaces(rng):
    """unique, unsorted_segment_sum and top_k by magnitude (the owner's step before the op) give
    the same kept sums, bit for bit, where no two magnitudes tie."""
    rows = random_rows(rng, 20_000, 12_000, 2**22)
    rows[:, 1] = rng.standard_normal(rows.shape[0]).astype(np.float32).view(np.int32)
    owned, position = tf.unique(rows[:, 0])
    sums = tf.math.unsorted_segment_sum(tf.bitcast(rows[:, 1], tf.float32), position, tf.size(owned))
    largest = tf.math.top_k(tf.abs(sums), 2500, sorted=False).indices
    expected = np.stack([tf.gather(owned, largest).numpy(), tf.bitcast(tf.gather(sums, largest), tf.int32).numpy()],
                        axis=1)
    expected = expected[np.argsort(expected[:, 0])]
    np.testing.assert_array_equal(ops.sum_pairs(rows, 2500).numpy(), expected)


def test_every_sum_equals_unsorted_segment_sums_bit_for_bit(rng):
    """With NaN, Inf, -0.0 and denormals among the values: each sum is 0 plus the values in row
    order, denormals flushed, as unsorted_segment_sum computes it (a lone -0.0 sums to +0.0)."""
    rows = random_rows(rng, 20_000, 9_000, 2**22)
    tiny = rng.random(rows.shape[0]) < 0.2
    rows[tiny, 1] = (rng.standard_normal(int(tiny.sum())) * 1e-40).astype(np.float32).view(np.int32)
    rows[-3:] = [[2**22 + 1, np.float32(-0.0).view(np.int32)], [2**22 + 2, np.float32(1e-42).view(np.int32)],
                 [2**22 + 2, np.float32(1e-42).view(np.int32)]]
    owned, position = tf.unique(rows[:, 0])
    sums = tf.math.unsorted_segment_sum(tf.bitcast(rows[:, 1], tf.float32), position, tf.size(owned))
    expected = np.stack([owned.numpy(), tf.bitcast(sums, tf.int32).numpy()], axis=1)
    got = ops.sum_pairs(rows).numpy()
    assert_same_sums(got, expected[np.argsort(expected[:, 0])])
    assert got[-2:, 1].tolist() == [0, 0]  # +0.0 from -0.0, two denormals flushed


def test_empty_rows_and_a_function_of_unknown_length(rng):
    assert ops.sum_pairs(np.zeros((0, 2), np.int32)).shape == (0, 2)
    assert ops.sum_pairs(np.zeros((0, 2), np.int32), 3).shape == (0, 2)
    rows = random_rows(rng, 777, 300, 10_000)
    owner_step = tf.function(lambda r: ops.sum_pairs(r, 100), input_signature=[tf.TensorSpec([None, 2], tf.int32)])
    assert_same_sums(owner_step(rows).numpy(), ref.sum_pairs(rows, 100))


@pytest.mark.parametrize("rows, max_pairs, error, match", [
    (np.array([[0, 1], [3, 2], [-1, 0], [-5, 0]], np.int32), None, tf.errors.InvalidArgumentError,
     r"rows\[2, 0\] = -1 is negative"),
    (np.zeros((4, 3), np.int32), None, (tf.errors.InvalidArgumentError, ValueError), r"rows must have shape \[n, 2\]"),
    (np.zeros(4, np.int32), None, (tf.errors.InvalidArgumentError, ValueError), r"rows must have shape \[n, 2\]"),
    (np.zeros((4, 2), np.float32), None, (tf.errors.InvalidArgumentError, TypeError), "int32"),
    (np.zeros((4, 2), np.int32), -1, ValueError, "max_pairs"),
    (np.zeros((4, 2), np.int32), 2**31, ValueError, "max_pairs"),
    (np.zeros((4, 2), np.int32), 2.0, TypeError, "max_pairs"),
    (np.zeros((4, 2), np.int32), True, TypeError, "max_pairs"),
])
def test_bad_arguments_are_named(rows, max_pairs, error, match):
    with pytest.raises(error, match=match):
        ops.sum_pairs(rows, max_pairs)


def test_kernel_and_shape_function_name_a_bad_max_pairs():
    """Below the Python checks: the op itself rejects max_pairs < -1 (in a graph, by the shape function)."""
    library = ops.load_library()
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="max_pairs must be -1"):
        library.tfcomp_sum_pairs(np.zeros((2, 2), np.int32), max_pairs=-2)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="max_pairs must be -1"):
        tf.function(lambda r: library.tfcomp_sum_pairs(r, max_pairs=-3)).get_concrete_function(
            tf.TensorSpec([None, 2], tf.int32))


@pytest.mark.jobs
def test_scratch_beyond_the_memory_is_an_error_not_an_abort():
    """2^24 rows (128 MiB) within 256 MiB more: the kernel's scratch (three times the rows) does not
    fit, and its std::bad_alloc, which ended the process, is a ResourceExhausted error (in a child
    process whose address space is limited). Should the scratch shrink to fit, the sums must be right."""
    n = 2**24
    setup = (f"rows = tf.constant(np.stack([np.arange({n}, dtype=np.int32)[::-1], "
             f"np.full({n}, np.float32(1).view(np.int32))], axis=1))")
    check = f"bool(np.array_equal(ops.sum_pairs(rows).numpy()[::{n // 8}, 0], np.arange(0, {n}, {n // 8})))"
    record = run_in_child(check, budget_mib=256, setup=setup)
    if record["outcome"] == "returned":
        assert record["value"] is True, record
    else:
        assert record["outcome"] == "raised" and record["error"] == "ResourceExhaustedError", record
        assert "out of host memory for the sort of the rows" in record["message"], record
