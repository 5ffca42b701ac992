"""Input generators shared by the op tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np

__all__ = ["REPO_ROOT", "SHAPES", "assert_same_bits", "child_env", "horovodrun", "quantile_threshold", "random_gradient",
           "run_python"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Shapes of several ranks and sizes, including sizes that are not multiples of the kernels' scan
# block (64 float32 / 128 half elements) and ones large enough to be split across threads.
SHAPES = [(1,), (7,), (1000,), (33, 65), (4, 5, 301), (200_003,)]


def random_gradient(rng: np.random.Generator, shape, dtype, heavy_tail: bool = True) -> np.ndarray:
    """Random gradient of `shape` and `dtype`: Gaussian, optionally mixed with a heavy tail so that a
    small fraction of elements stands out, as in real gradients."""
    g = rng.standard_normal(shape)
    if heavy_tail:
        g *= np.where(rng.random(shape) < 0.01, 30.0, 1.0)
    return g.astype(dtype)


def assert_same_bits(actual, expected) -> None:
    """Exact equality of two arrays of the same dtype, NaN included (compares raw bits)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    view = {8: np.uint64, 4: np.uint32, 2: np.uint16}[actual.dtype.itemsize]
    mismatch = np.flatnonzero(actual.view(view) != expected.view(view))
    assert mismatch.size == 0, f"{mismatch.size} mismatches, first at {mismatch[:5]}: {actual[mismatch[:5]]} vs {expected[mismatch[:5]]}"


def quantile_threshold(g: np.ndarray, fraction: float) -> float:
    """A float32 threshold that about `fraction` of |g| reaches."""
    magnitudes = np.abs(g.reshape(-1).astype(np.float32))
    return float(np.quantile(magnitudes[np.isfinite(magnitudes)], 1.0 - fraction))


def child_env(**extra) -> dict:
    """Environment for a child Python process: this checkout first on PYTHONPATH, TensorFlow quiet."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))
    return env


def horovodrun(num_workers: int) -> list:
    """The command prefix that starts num_workers local Gloo workers (python and its args follow)."""
    launcher = shutil.which("horovodrun") or os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return [launcher, "-np", str(num_workers), "-H", f"localhost:{num_workers}", "--gloo"]


def run_python(code: str, timeout: float = 300, **extra_env) -> subprocess.CompletedProcess:
    """Runs `python -c code` in a fresh process from the checkout's root (`child_env(**extra_env)`),
    its output captured as text."""
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=child_env(**extra_env), capture_output=True,
                          text=True, timeout=timeout)
