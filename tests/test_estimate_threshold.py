"""estimate_threshold against the NumPy reference, its statistics, and its argument checks."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference as ref
from tests.helpers import SHAPES, random_gradient
from tfcomp import ops


@pytest.mark.parametrize("dtype", ref.DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("num_samples", [1, 100, 5000, 1_000_000])
def test_matches_reference(rng, shape, dtype, num_samples):
    g = random_gradient(rng, shape, dtype)
    ratio = float(np.float32(rng.uniform(0.0005, 0.5)))
    seed = int(rng.integers(-(2**63), 2**63 - 1))
    actual = ops.estimate_threshold(g, ratio, num_samples, seed).numpy()
    assert actual.dtype == np.float32 and actual.shape == ()
    assert actual == ref.estimate_threshold(g, ratio, num_samples, seed)


@pytest.mark.parametrize("dtype", ref.DTYPES, ids=lambda d: np.dtype(d).name)
def test_all_elements_give_the_exact_kth_largest(rng, dtype):
    g = random_gradient(rng, (5003,), dtype)
    for ratio in (0.001, 0.01, 0.3, 1.0):
        k = max(1, int(np.floor(np.float32(ratio) * g.size + 0.5)))
        expected = np.sort(np.abs(g.astype(np.float32)))[::-1][k - 1]
        assert ops.estimate_threshold(g, ratio, 10**6, 0).numpy() == expected


def test_threshold_keeps_about_ratio(rng):
    g = random_gradient(rng, (1 << 20,), np.float32)
    num_samples = 65536
    for ratio in (0.001, 0.01, 0.1):
        kept = [
            np.mean(np.abs(g) >= ops.estimate_threshold(g, ratio, num_samples, int(rng.integers(1 << 62))).numpy())
            for _ in range(20)
        ]
        # The kept fraction of one estimate has a standard deviation of about sqrt(ratio / num_samples).
        sigma = np.sqrt(ratio / num_samples)
        assert np.all(np.abs(np.asarray(kept) - ratio) < 5 * sigma), (ratio, kept)
        assert abs(np.mean(kept) - ratio) < 5 * sigma / np.sqrt(len(kept)), (ratio, np.mean(kept))


def test_seed_picks_the_sample(rng):
    g = random_gradient(rng, (1 << 18,), np.float32)
    first = ops.estimate_threshold(g, 0.01, 4096, 7).numpy()
    assert all(ops.estimate_threshold(g, 0.01, 4096, 7).numpy() == first for _ in range(3))
    others = {float(ops.estimate_threshold(g, 0.01, 4096, s).numpy()) for s in range(8)}
    assert len(others) > 1


def test_sample_is_uniform_within_strata():
    # With g[i] = i + 1, ratio 1 returns the smallest sampled value: the position drawn in the first
    # stratum [0, 100) plus one. Over many seeds it must be spread uniformly over that stratum.
    size, num_samples = 100_000, 1000
    g = np.arange(1, size + 1, dtype=np.float32)
    first = np.array([ops.estimate_threshold(g, 1.0, num_samples, seed).numpy() for seed in range(400)]) - 1
    assert first.min() >= 0 and first.max() < size // num_samples
    counts = np.histogram(first, bins=4, range=(0, 100))[0]
    assert np.all(np.abs(counts - 100) < 40), counts  # 4 sigma of a binomial(400, 1/4)


@pytest.mark.parametrize("dtype", ref.DTYPES, ids=lambda d: np.dtype(d).name)
def test_non_finite_samples_are_left_out(rng, dtype):
    g = random_gradient(rng, (2000,), dtype)
    g[rng.choice(g.size, 50, replace=False)] = np.array([np.nan, np.inf, -np.inf] * 17, dtype=dtype)[:50]
    t = ops.estimate_threshold(g, 0.01, 10**6, 1).numpy()
    finite = np.sort(np.abs(g[np.isfinite(g)].astype(np.float32)))[::-1]
    assert t == finite[int(np.floor(np.float32(0.01) * g.size + 0.5)) - 1]
    all_nan = np.full(10, np.nan, dtype=dtype)
    assert ops.estimate_threshold(all_nan, 0.5, 10, 1).numpy() == np.float32(tf.as_dtype(dtype).max)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(ratio=0.0), ValueError, r"ratio must be in \(0, 1\] as a float32, got 0.0"),
        (dict(ratio=-0.5), ValueError, r"ratio must be in \(0, 1\] as a float32, got -0.5"),
        (dict(ratio=1.5), ValueError, r"ratio must be in \(0, 1\] as a float32, got 1.5"),
        (dict(ratio=1e-50), ValueError, r"ratio must be in \(0, 1\] as a float32, got 1e-50"),
        (dict(ratio=float("nan")), ValueError, r"ratio must be in \(0, 1\] as a float32, got nan"),
        (dict(ratio=1j), TypeError, r"ratio must be a real number or a tensor, got 1j of type complex"),
        (dict(num_samples=0), ValueError, r"num_samples must be in \[1, 9223372036854775807\], got 0"),
        (dict(num_samples=2**63), ValueError, r"num_samples must be in \[1, 9223372036854775807\], got 9223372036854775808"),
        (dict(seed=-(2**63) - 1), ValueError, r"seed must be in \[-9223372036854775808, 9223372036854775807\]"),
        (dict(seed=None), TypeError, r"seed must be an int or an integer tensor, got None"),
        (dict(seed=np.array(1.5)), TypeError, r"seed must be an int or an integer tensor, got a float64 array of shape \(\)"),
        (dict(ratio=np.array(np.nan, np.float32)), tf.errors.InvalidArgumentError, r"ratio must be in \(0, 1\], got nan"),
        (dict(ratio=np.array(0.0, np.float32)), tf.errors.InvalidArgumentError, r"ratio must be in \(0, 1\], got 0"),
        (dict(grad=np.zeros((0, 3), np.float32)), tf.errors.InvalidArgumentError, r"grad must not be empty, got shape \[0,3\]"),
        (dict(ratio=[0.1, 0.2]), tf.errors.InvalidArgumentError, r"ratio must be a scalar, got shape \[2\]"),
        (dict(seed=[1, 2]), tf.errors.InvalidArgumentError, r"seed must be a scalar, got shape \[2\]"),
    ],
)
def test_bad_arguments(rng, kwargs, error, message):
    args = dict(grad=random_gradient(rng, (100,), np.float32), ratio=0.1, num_samples=10, seed=1)
    args.update(kwargs)
    with pytest.raises(error, match=message):
        ops.estimate_threshold(**args)


def test_graph_mode_names_the_bad_argument():
    with pytest.raises(ValueError, match=r"seed must be a scalar, got shape \[2\]"):
        tf.function(lambda g: ops.estimate_threshold(g, 0.1, 10, tf.constant([1, 2])))(tf.ones([4]))


@pytest.mark.parametrize("dtype", ref.DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("num_samples", [1, 777, 65536, 1_000_000])
def test_parts_sample_their_concatenation(rng, dtype, num_samples):
    shapes = [(int(rng.integers(1, 50_000)),), (0,), (13, 17), (1,), (int(rng.integers(1, 90_000)),)]
    parts = [random_gradient(rng, shape, dtype) for shape in shapes]
    joined = np.concatenate([p.ravel() for p in parts])
    ratio = float(np.float32(rng.uniform(0.0005, 0.5)))
    seed = int(rng.integers(-(2**63), 2**63 - 1))
    actual = ops.estimate_threshold(parts, ratio, num_samples, seed).numpy()
    assert actual == ref.estimate_threshold(joined, ratio, num_samples, seed)
    if dtype == np.float32:
        residuals = [random_gradient(rng, shape, dtype) for shape in shapes]
        with_addend = ops.estimate_threshold(parts, ratio, num_samples, seed, addend=residuals).numpy()
        summed = np.concatenate([ref.accumulate(p, r).ravel() for p, r in zip(parts, residuals)])
        assert with_addend == ref.estimate_threshold(summed, ratio, num_samples, seed)


def test_parts_all_empty_are_refused(rng):
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"grad must not be empty, got shapes \[0\], \[3,0\]"):
        ops.estimate_threshold([np.zeros(0, np.float32), np.zeros((3, 0), np.float32)], 0.1, 10, 1)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("num_samples", [1, 5000, 1_000_000])
def test_addend_samples_the_sum(rng, shape, num_samples):
    g, r = random_gradient(rng, shape, np.float32), random_gradient(rng, shape, np.float32)
    ratio = float(np.float32(rng.uniform(0.0005, 0.5)))
    seed = int(rng.integers(-(2**63), 2**63 - 1))
    actual = ops.estimate_threshold(g, ratio, num_samples, seed, addend=r).numpy()
    assert actual == ref.estimate_threshold(ref.accumulate(g, r), ratio, num_samples, seed)


def test_bad_addend_names_the_argument(rng):
    g = random_gradient(rng, (100,), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"addend\[0\] must have the shape of grad\[0\], \[100\], got \[10,10\]"):
        ops.estimate_threshold(g, 0.1, 50, 1, addend=g.reshape(10, 10))
