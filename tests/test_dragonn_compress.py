"""dragonn_compress against the NumPy reference, its collision rule, coverage statistics and checks."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference as ref
from tests.helpers import SHAPES, assert_same_bits, quantile_threshold, random_gradient
from tfcomp import ops


def compress(g, threshold, num_slots, seed):
    values, indices = ops.dragonn_compress(g, threshold, num_slots, seed)
    return values.numpy(), indices.numpy()


@pytest.mark.parametrize("dtype", ref.DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference(rng, shape, dtype):
    g = random_gradient(rng, shape, dtype)
    threshold = quantile_threshold(g, fraction=rng.uniform(0.001, 0.2))
    selected = int(ref.selected(g, threshold).sum())
    for num_slots in {1, max(1, selected // 2), selected + 1, 2 * selected + 5}:  # collisions and room
        seed = int(rng.integers(-(2**63), 2**63 - 1))
        values, indices = compress(g, threshold, num_slots, seed)
        expected_values, expected_indices = ref.dragonn_compress(g, threshold, num_slots, seed)
        np.testing.assert_array_equal(indices, expected_indices)
        assert_same_bits(values, expected_values)


@pytest.mark.parametrize("dtype", ref.DTYPES, ids=lambda d: np.dtype(d).name)
def test_outputs_are_selected_unique_elements(rng, dtype):
    g = random_gradient(rng, (300_001,), dtype)
    threshold = quantile_threshold(g, 0.01)
    values, indices = compress(g, threshold, 3000, int(rng.integers(1 << 40)))
    kept = indices[indices >= 0]
    assert kept.size == np.unique(kept).size
    assert np.all(ref.selected(g[kept], threshold))
    assert_same_bits(values[indices >= 0], g[kept])
    assert np.all(values[indices < 0] == 0)


def test_collision_keeps_the_largest_magnitude(rng):
    g = (rng.uniform(1.0, 2.0, 500) * rng.choice([-1, 1], 500)).astype(np.float32)
    g[123] = -5.0
    values, indices = compress(g, 1.0, 1, int(rng.integers(1 << 40)))
    assert indices.tolist() == [123] and values.tolist() == [-5.0]


def test_equal_magnitudes_keep_the_largest_index(rng):
    g = np.where(rng.random(1000) < 0.5, 1.0, -1.0).astype(np.float32)
    _, indices = compress(g, 0.5, 1, 3)
    assert indices.tolist() == [999]


def test_index_zero_can_be_selected(rng):
    g = rng.standard_normal(5000).astype(np.float32)
    g[0] = 100.0
    values, indices = compress(g, 50.0, 8, int(rng.integers(1 << 40)))
    assert 0 in indices.tolist() and values[indices.tolist().index(0)] == 100.0
    assert np.count_nonzero(indices >= 0) == 1


@pytest.mark.parametrize("dtype", ref.DTYPES, ids=lambda d: np.dtype(d).name)
def test_nan_and_inf_are_always_selected(rng, dtype):
    g = random_gradient(rng, (10_000,), dtype)
    special = rng.choice(g.size, 6, replace=False)
    g[special] = np.array([np.nan, np.inf, -np.inf, np.nan, np.inf, -np.inf], dtype=dtype)
    values, indices = compress(g, 1e30, 4096, int(rng.integers(1 << 40)))
    kept = indices[indices >= 0]
    # Nothing finite reaches 1e30; the six specials all land (a collision among them is possible
    # but then the slot keeps another special).
    assert set(kept.tolist()) <= set(special.tolist()) and kept.size >= 1
    assert not np.any(np.isfinite(values[indices >= 0].astype(np.float32)))
    # In one slot, NaN beats Inf and every finite value.
    _, one = compress(g, 0.0, 1, 1)
    assert np.isnan(g[one[0]])


def test_same_seed_same_output_and_seeds_change_collisions(rng):
    g = random_gradient(rng, (200_000,), np.float32)
    threshold = quantile_threshold(g, 0.01)
    first = compress(g, threshold, 1000, 42)
    for _ in range(3):
        again = compress(g, threshold, 1000, 42)
        np.testing.assert_array_equal(again[1], first[1])
        assert_same_bits(again[0], first[0])
    patterns = {tuple(compress(g, threshold, 1000, seed)[1]) for seed in range(5)}
    assert len(patterns) == 5


def test_enough_slots_and_zero_threshold_send_everything_in_one_slot_each(rng):
    g = random_gradient(rng, (64,), np.float32)
    # With m >> n^2 slots a collision is very unlikely; find a seed without one and check all arrive.
    for seed in range(20):
        values, indices = compress(g, 0.0, 1 << 20, seed)
        kept = indices[indices >= 0]
        if kept.size == g.size:
            np.testing.assert_array_equal(np.sort(kept), np.arange(g.size))
            np.testing.assert_array_equal(values[indices >= 0], g[kept])
            return
    pytest.fail("every seed collided")


def test_empty_gradient_gives_empty_slots():
    values, indices = compress(np.zeros((0,), np.float32), 0.1, 4, 1)
    assert indices.tolist() == [-1] * 4 and values.tolist() == [0.0] * 4


@pytest.mark.parametrize("num_slots, num_selected", [(1024, 1024), (512, 1024), (2048, 512)])
def test_empty_slot_fraction_matches_lemma_a10(rng, num_slots, num_selected):
    # 004 Lemma A.10: n selected elements hashed into m slots leave a fraction (1 - 1/m)^n empty.
    size = 4 * num_selected
    g = rng.uniform(-0.5, 0.5, size).astype(np.float32)
    g[rng.choice(size, num_selected, replace=False)] = 10.0
    empty = [np.mean(compress(g, 1.0, num_slots, seed)[1] == -1) for seed in range(300)]
    expected = (1 - 1 / num_slots) ** num_selected
    assert abs(np.mean(empty) - expected) < 0.02, (np.mean(empty), expected)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(num_slots=0), ValueError, r"num_slots must be in \[1, 2147483647\], got 0"),
        (dict(num_slots=2**31), ValueError, r"num_slots must be in \[1, 2147483647\], got 2147483648"),
        (dict(num_slots=True), TypeError, r"num_slots must be an int, got True of type bool"),
        (dict(seed=2**63), ValueError, r"seed must be in \[-9223372036854775808, 9223372036854775807\], got 9223372036854775808"),
        (dict(seed=1.5), TypeError, r"seed must be an int, got 1.5 of type float"),
        (dict(threshold=float("nan")), ValueError, r"threshold must be finite as a float32, got nan"),
        (dict(threshold=-1e39), ValueError, r"threshold must be finite as a float32, got -1e\+39"),
        (dict(threshold=np.array(np.inf, np.float32)), tf.errors.InvalidArgumentError, r"threshold must be finite, got inf"),
        (dict(threshold=[0.1, 0.2]), tf.errors.InvalidArgumentError, r"threshold must be a scalar, got shape \[2\]"),
        (dict(seed=[[1]]), tf.errors.InvalidArgumentError, r"seed must be a scalar, got shape \[1,1\]"),
    ],
)
def test_bad_arguments(rng, kwargs, error, message):
    args = dict(grad=random_gradient(rng, (100,), np.float32), threshold=0.1, num_slots=10, seed=1)
    args.update(kwargs)
    with pytest.raises(error, match=message):
        ops.dragonn_compress(**args)


def test_graph_mode_names_the_bad_argument():
    with pytest.raises(ValueError, match=r"threshold must be a scalar, got shape \[3\]"):
        tf.function(lambda g: ops.dragonn_compress(g, tf.ones([3]), 4, 1))(tf.ones([4]))


def test_runs_inside_tf_function_with_a_seed_tensor(rng):
    g = random_gradient(rng, (5000,), np.float32)
    threshold = quantile_threshold(g, 0.01)
    graph_fn = tf.function(lambda g, seed: ops.dragonn_compress(g, threshold, 64, seed))
    for seed in (3, 4):
        values, indices = graph_fn(g, tf.constant(seed, tf.int64))
        expected_values, expected_indices = ref.dragonn_compress(g, threshold, 64, seed)
        np.testing.assert_array_equal(indices.numpy(), expected_indices)
        np.testing.assert_array_equal(values.numpy(), expected_values)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def gradient_and_residual(rng, shape):
    """float32 gradient and residual with NaN, +-Inf and denormals sprinkled in, and a few sums that
    come out denormal."""
    g, r = random_gradient(rng, shape, np.float32), random_gradient(rng, shape, np.float32)
    flat_g, flat_r = g.reshape(-1), r.reshape(-1)
    if flat_g.size >= 8:
        spots = rng.choice(flat_g.size, 8, replace=False)
        flat_g[spots[:4]] = [np.nan, np.inf, -np.inf, 1e-40]
        flat_r[spots[4:6]] = [np.nan, 3e-39]
        flat_g[spots[6:]], flat_r[spots[6:]] = 1.5e-38, -1.4e-38  # a denormal sum
    return g, r


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_addend_sparsifies_the_sum_and_writes_it(rng, shape):
    g, r = gradient_and_residual(rng, shape)
    total = ref.accumulate(g, r)
    threshold = quantile_threshold(total, fraction=rng.uniform(0.001, 0.2))
    selected = int(ref.selected(total, threshold).sum())
    for num_slots in {1, max(1, selected // 2), 2 * selected + 5}:
        seed = int(rng.integers(-(2**63), 2**63 - 1))
        values, indices, written = ops.dragonn_compress(g, threshold, num_slots, seed, addend=r)
        expected_values, expected_indices = ref.dragonn_compress(total, threshold, num_slots, seed)
        np.testing.assert_array_equal(indices.numpy(), expected_indices)
        assert_same_bits(values.numpy(), expected_values)
        assert_same_bits(written.numpy(), total)


def test_addend_gives_what_adding_first_gives(rng):
    g, r = gradient_and_residual(rng, (1000, 300))
    values, indices, written = ops.dragonn_compress(g, 0.7, 3000, 11, addend=r)
    added = tf.add(g, r)
    expected_values, expected_indices = ops.dragonn_compress(added, 0.7, 3000, 11)
    np.testing.assert_array_equal(indices.numpy(), expected_indices.numpy())
    assert_same_bits(values.numpy(), expected_values.numpy())
    assert_same_bits(written.numpy(), added.numpy())


@pytest.mark.parametrize(
    "grad_dtype, addend, error, message",
    [
        (np.float32, np.zeros(99, np.float32), tf.errors.InvalidArgumentError,
         r"addend\[0\] must have the shape of grad\[0\], \[100\], got \[99\]"),
        (np.float16, np.zeros(100, np.float16), TypeError,
         r"addend is supported for a float32 grad only, got grad as a float16 array of shape \(100,\)"),
    ],
)
def test_bad_addend_names_the_argument(rng, grad_dtype, addend, error, message):
    g = random_gradient(rng, (100,), grad_dtype)
    with pytest.raises(error, match=message):
        ops.dragonn_compress(g, 0.1, 10, 1, addend=addend)


def test_kernel_refuses_an_addend_to_a_half_grad(rng):
    """The raw op (no wrapper) reaches the kernel's check."""
    g = random_gradient(rng, (100,), np.float16)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"addend is supported for float32 only, got half grad"):
        ops.load_library().tfcomp_dragonn_compress([g], np.float32(0.1), np.int64(1), [np.zeros(100, np.float16)],
                                                   num_slots=10)


def test_addend_count_other_than_grads_is_refused(rng):
    from tfcomp.ops import load_library

    g = random_gradient(rng, (100,), np.float32)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match=r"addend must hold no tensor or one per grad tensor \(1\), got 2"):
        load_library().tfcomp_dragonn_compress([g], 0.1, tf.constant(1, tf.int64), [g, g], num_slots=10)
    with pytest.raises(ValueError, match=r"addend must hold one tensor per grad tensor \(2\), got 1"):
        ops.dragonn_compress([g, g], 0.1, 10, 1, addend=[g])
    with pytest.raises(TypeError, match=r"addend must be a list where grad is a list"):
        ops.dragonn_compress([g, g], 0.1, 10, 1, addend=g)
    with pytest.raises(ValueError, match=r"grad must hold at least one tensor, got an empty list"):
        ops.dragonn_compress([], 0.1, 10, 1)


def random_parts(rng, dtype, count):
    """A gradient of `count` parts of random shapes (some empty, some tiny) and their concatenation."""
    shapes = [tuple(int(d) for d in rng.integers(0, 40, size=rng.integers(0, 3))) if rng.random() < 0.3
              else (int(rng.integers(1, 70_000)),) for _ in range(count)]
    parts = [random_gradient(rng, shape, dtype) for shape in shapes]
    return parts, np.concatenate([p.ravel() for p in parts])


@pytest.mark.parametrize("dtype", ref.DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("count", [1, 2, 7])
def test_parts_match_the_reference_of_their_concatenation(rng, dtype, count):
    parts, joined = random_parts(rng, dtype, count)
    threshold = quantile_threshold(joined, fraction=rng.uniform(0.001, 0.2)) if joined.size else 0.5
    selected = int(ref.selected(joined, threshold).sum())
    for num_slots in {1, max(1, selected // 2), 2 * selected + 5}:
        seed = int(rng.integers(-(2**63), 2**63 - 1))
        values, indices = ops.dragonn_compress(parts, threshold, num_slots, seed)
        expected_values, expected_indices = ref.dragonn_compress(joined, threshold, num_slots, seed)
        np.testing.assert_array_equal(indices.numpy(), expected_indices)
        assert_same_bits(values.numpy(), expected_values)


@pytest.mark.parametrize("count", [1, 3, 9])
def test_parts_with_addends_sparsify_and_write_each_sum(rng, count):
    parts, _ = random_parts(rng, np.float32, count)
    pairs = [gradient_and_residual(rng, p.shape) for p in parts]
    grads, residuals = [g for g, _ in pairs], [r for _, r in pairs]
    totals = [ref.accumulate(g, r) for g, r in pairs]
    joined = np.concatenate([t.ravel() for t in totals])
    threshold = quantile_threshold(joined, fraction=rng.uniform(0.001, 0.2)) if joined.size else 0.5
    seed = int(rng.integers(-(2**63), 2**63 - 1))
    num_slots = max(1, int(ref.selected(joined, threshold).sum()))
    values, indices, written = ops.dragonn_compress(grads, threshold, num_slots, seed, addend=residuals)
    expected_values, expected_indices = ref.dragonn_compress(joined, threshold, num_slots, seed)
    np.testing.assert_array_equal(indices.numpy(), expected_indices)
    assert_same_bits(values.numpy(), expected_values)
    assert len(written) == count
    for sum_tensor, total in zip(written, totals):
        assert sum_tensor.shape == total.shape
        assert_same_bits(sum_tensor.numpy(), total)


@pytest.mark.parametrize("lead", [1, 2, 3, 4, 16, 17])
def test_sums_written_from_any_alignment(rng, lead):
    """The pass writes each sum by 16-byte (non-temporal) stores from the first aligned element of
    its range on; ranges start wherever the blocks of the joint index space (2^16 elements) cut a
    part. A leading part of `lead` elements shifts every later cut off (or onto) that alignment."""
    sizes = [lead, 2 * 65536 + 7, 65536 + 21, 13]
    pairs = [gradient_and_residual(rng, (size,)) for size in sizes]
    totals = [ref.accumulate(g, r) for g, r in pairs]
    joined = np.concatenate(totals)
    threshold = quantile_threshold(joined, fraction=0.01)
    num_slots = int(ref.selected(joined, threshold).sum())
    values, indices, written = ops.dragonn_compress([g for g, _ in pairs], threshold, num_slots, 5,
                                                    addend=[r for _, r in pairs])
    expected_values, expected_indices = ref.dragonn_compress(joined, threshold, num_slots, 5)
    np.testing.assert_array_equal(indices.numpy(), expected_indices)
    assert_same_bits(values.numpy(), expected_values)
    for sum_tensor, total in zip(written, totals):
        assert_same_bits(sum_tensor.numpy(), total)


def test_bad_part_addend_names_its_position(rng):
    g = [random_gradient(rng, (100,), np.float32), random_gradient(rng, (5, 4), np.float32)]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"addend\[1\] must have the shape of grad\[1\], \[5,4\], got \[20\]"):
        ops.dragonn_compress(g, 0.1, 10, 1, addend=[g[0], g[1].ravel()])


