"""NumPy reference implementations of the tfcomp ops, written from their specification.

They share only the specification with the kernels: selection is |g| >= t computed in float64,
sampling and hashing follow the documented formulas in uint64 arithmetic, and the collision rule
("largest magnitude wins, then largest index") is evaluated with an explicit per-slot maximum.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

__all__ = [
    "DTYPES",
    "dgc_compress",
    "dragonn_compress",
    "estimate_threshold",
    "magnitude_rank",
    "mix64",
    "sample_positions",
    "slot_hash",
    "sparse_batched_decode",
    "topk_compress",
]

DTYPES = (np.float32, np.float16, tf.bfloat16.as_numpy_dtype)
_U64 = np.uint64


def _bits_view(g: np.ndarray) -> np.ndarray:
    return g.reshape(-1).view(np.uint32 if g.dtype.itemsize == 4 else np.uint16)


def magnitude_rank(g: np.ndarray) -> np.ndarray:
    """Integers that order the elements by |g| with NaN above Inf above every finite value."""
    bits = _bits_view(g).astype(np.int64)
    return bits & (0x7FFFFFFF if g.dtype.itemsize == 4 else 0x7FFF)


def selected(g: np.ndarray, threshold: float) -> np.ndarray:
    """Flat mask of |g| >= threshold, NaN always included."""
    return ~(np.abs(g.reshape(-1).astype(np.float64)) < np.float64(np.float32(threshold)))


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = np.asarray(x, dtype=_U64) + _U64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
        return x ^ (x >> _U64(31))


def _reduce(r32: np.ndarray, n) -> np.ndarray:
    return (r32.astype(_U64) * np.asarray(n, dtype=_U64)) >> _U64(32)


def sample_positions(n: int, size: int, seed: int) -> np.ndarray:
    """Stratified sample: one uniform position in each stratum [i*size//n, (i+1)*size//n)."""
    i = np.arange(n, dtype=np.int64)
    lo, hi = i * size // n, (i + 1) * size // n
    seed64 = _U64(np.int64(seed).view(np.uint64))
    r32 = mix64(seed64 ^ mix64(i.astype(_U64))) >> _U64(32)
    return lo + _reduce(r32, (hi - lo)).astype(np.int64)


def estimate_threshold(g: np.ndarray, ratio: float, num_samples: int, seed: int) -> np.float32:
    """k-th largest finite |g| over the sample, k = max(1, round-half-up(ratio * n))."""
    flat = g.reshape(-1)
    n = min(num_samples, flat.size)
    sample = flat if n == flat.size else flat[sample_positions(n, flat.size, seed)]
    k = max(1, math.floor(float(np.float32(ratio)) * n + 0.5))
    finite = np.sort(np.abs(sample[np.isfinite(sample)]).astype(np.float32))[::-1]
    if finite.size == 0:
        return np.float32(tf.as_dtype(g.dtype).max)
    return np.float32(finite[min(k, finite.size) - 1])


def slot_hash(indices: np.ndarray, seed: int, num_slots: int) -> np.ndarray:
    """Multiply-add-shift universal hash of flat indices into [0, num_slots)."""
    seed64 = _U64(np.int64(seed).view(np.uint64))
    a = mix64(seed64 ^ _U64(0xD1B54A32D192ED03)) | _U64(1)
    with np.errstate(over="ignore"):
        b = mix64(seed64 + _U64(0x632BE59BD9B4E019))
        h32 = (a * indices.astype(_U64) + b) >> _U64(32)
    return _reduce(h32, num_slots).astype(np.int64)


def dragonn_compress(g: np.ndarray, threshold: float, num_slots: int, seed: int):
    """004 Algorithm 1 with the documented collision rule."""
    flat = g.reshape(-1)
    chosen = np.flatnonzero(selected(g, threshold))
    best = np.full(num_slots, -1, dtype=np.int64)
    best_rank = np.full(num_slots, -1, dtype=np.int64)
    ranks = magnitude_rank(g)
    for index, slot in zip(chosen, slot_hash(chosen, seed, num_slots)):
        if (ranks[index], index) > (best_rank[slot], best[slot]):
            best[slot], best_rank[slot] = index, ranks[index]
    values = np.zeros(num_slots, dtype=g.dtype)
    values[best >= 0] = flat[best[best >= 0]]
    return values, best.astype(np.int32)


def dgc_compress(g: np.ndarray, threshold: float, max_out: int):
    """The first max_out selected elements in index order, padded with -1 / 0."""
    flat = g.reshape(-1)
    chosen = np.flatnonzero(selected(g, threshold))[:max_out]
    indices = np.full(max_out, -1, dtype=np.int32)
    indices[: chosen.size] = chosen
    values = np.zeros(max_out, dtype=g.dtype)
    values[: chosen.size] = flat[chosen]
    return values, indices


def topk_compress(g: np.ndarray, k: int):
    """The k largest |g| (ties: larger index first), reported in increasing index order."""
    flat = g.reshape(-1)
    order = np.lexsort((np.arange(flat.size), magnitude_rank(g)))  # ascending by (rank, index)
    chosen = np.sort(order[-k:])
    return flat[chosen], chosen.astype(np.int32)


def sparse_batched_decode(values: np.ndarray, indices: np.ndarray, size: int) -> np.ndarray:
    """Dense sum of the pairs in pair order; index -1 skipped."""
    dense = np.zeros(size, dtype=values.dtype)
    keep = indices >= 0
    np.add.at(dense, indices[keep], values[keep])
    return dense
