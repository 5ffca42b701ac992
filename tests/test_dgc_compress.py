"""dgc_compress against the NumPy reference and its argument checks."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference as ref
from tests.helpers import SHAPES, assert_same_bits, quantile_threshold, random_gradient
from tests.op_child import run_in_child
from tfcomp import ops


@pytest.mark.parametrize("dtype", ref.DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference(rng, shape, dtype):
    g = random_gradient(rng, shape, dtype)
    threshold = quantile_threshold(g, fraction=rng.uniform(0.001, 0.3))
    selected = int(ref.selected(g, threshold).sum())
    for max_out in {1, max(1, selected // 3), selected, selected + 17}:  # truncated, exact, padded
        values, indices = ops.dgc_compress(g, threshold, max_out)
        expected_values, expected_indices = ref.dgc_compress(g, threshold, max_out)
        np.testing.assert_array_equal(indices.numpy(), expected_indices)
        assert_same_bits(values.numpy(), expected_values)


def test_zero_threshold_takes_the_first_elements_including_index_zero(rng):
    g = random_gradient(rng, (1000,), np.float32)
    values, indices = ops.dgc_compress(g, 0.0, 10)
    np.testing.assert_array_equal(indices.numpy(), np.arange(10))
    np.testing.assert_array_equal(values.numpy(), g[:10])


@pytest.mark.parametrize("dtype", ref.DTYPES, ids=lambda d: np.dtype(d).name)
def test_nan_and_inf_are_always_selected(rng, dtype):
    g = random_gradient(rng, (300_000,), dtype)
    special = np.sort(rng.choice(g.size, 3, replace=False))
    g[special] = np.array([np.nan, np.inf, -np.inf], dtype=dtype)
    values, indices = ops.dgc_compress(g, 1e30, 5)
    assert indices.numpy().tolist() == special.tolist() + [-1, -1]
    assert_same_bits(values.numpy()[:3], g[special])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(max_out=0), ValueError, r"max_out must be in \[1, 2147483647\], got 0"),
        (dict(max_out=2**63 - 1), ValueError, r"max_out must be in \[1, 2147483647\], got 9223372036854775807"),
        (dict(max_out=10.0), TypeError, r"max_out must be an int, got 10.0 of type float"),
        (dict(threshold=float("nan")), ValueError, r"threshold must be finite as a float32, got nan"),
        (dict(threshold=1e39), ValueError, r"threshold must be finite as a float32, got 1e\+39"),
        (dict(threshold="0.1"), TypeError, r"threshold must be a real number or tensor, got '0.1'"),
        (dict(threshold=np.array(np.nan, np.float32)), tf.errors.InvalidArgumentError, r"threshold must be finite, got nan"),
        (dict(threshold=np.array(-np.inf, np.float32)), tf.errors.InvalidArgumentError, r"threshold must be finite, got -inf"),
        (dict(threshold=[0.1]), tf.errors.InvalidArgumentError, r"threshold must be a scalar, got shape \[1\]"),
    ],
)
def test_bad_arguments(rng, kwargs, error, message):
    args = dict(grad=random_gradient(rng, (100,), np.float32), threshold=0.1, max_out=10)
    args.update(kwargs)
    with pytest.raises(error, match=message):
        ops.dgc_compress(**args)


@pytest.mark.jobs
def test_selected_indices_beyond_the_memory_are_an_error_not_an_abort():
    """2^25 elements, every one selected, max_out 2^16, within 64 MiB more, on two intra-op threads:
    the lists of selected indices that the pool threads collect outgrow the memory, and a pool
    thread's std::bad_alloc ended the process (std::terminate). Now the process lives on: the kernel
    reports its own allocation failure as ResourceExhausted, and one of TensorFlow's or Python's
    comes up as a MemoryError (in a child process whose address space is limited). Where everything
    fits, the payload must be right."""
    n, max_out = 2**25, 2**16
    check = f"ops.dgc_compress(grad, 0.5, {max_out})[1].numpy()[::4096].tolist() == list(range(0, {max_out}, 4096))"
    record = run_in_child(check, budget_mib=64, setup=f"grad = tf.ones([{n}])")
    assert record["outcome"] in ("returned", "raised"), record
    if record["outcome"] == "returned":
        assert record["value"] is True, record
    elif record["error"] != "MemoryError":
        assert record["error"] == "ResourceExhaustedError", record
        assert "out of host memory for the lists of selected elements" in record["message"], record

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
