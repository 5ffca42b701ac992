"""The op library `_tfcomp_ops.so`: lazy loading and typed wrappers of its ops.

All ops run on the CPU (CUDA kernels are registered when the library is built with CUDA).
Gradients may have any shape and dtype float32, float16 or bfloat16; indices are int32 flat
indices into the gradient, -1 marking an empty entry; thresholds are float32 scalars.

The library is loaded on the first call of any op. If it is missing, or was built against another
TensorFlow than the one running, that call raises `OpLibraryError`, which says what was built
against what and the command that rebuilds it.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import tensorflow as tf

__all__ = [
    "OpLibraryError",
    "REBUILD_COMMAND",
    "dgc_compress",
    "dragonn_compress",
    "estimate_threshold",
    "library_path",
    "load_library",
    "sparse_batched_decode",
    "topk_compress",
]

LIBRARY_NAME = "_tfcomp_ops.so"
LIBRARY_ENV = "TFCOMP_OPS_LIBRARY"
REBUILD_COMMAND = "scripts/build_ops.sh   (from the tfcomp checkout, with its .venv active; or: pip install .)"
_BUILD_INFO = re.compile(rb"TFCOMP_BUILD_INFO\{tf=([^}]*)\}")

for _op in ("EstimateThreshold", "DragonnCompress", "DgcCompress", "TopkCompress", "SparseBatchedDecode"):
    tf.no_gradient("Tfcomp>" + _op)


class OpLibraryError(ImportError):
    """The op library is missing, cannot be loaded, or was built against another TensorFlow."""


def _candidate_paths() -> list[Path]:
    package = Path(__file__).parent
    if os.environ.get(LIBRARY_ENV):
        return [Path(os.environ[LIBRARY_ENV])]
    return [
        package / LIBRARY_NAME,  # installed package, or copied by scripts/build_ops.sh
        package.parent / "ops" / LIBRARY_NAME,  # Bazel runfiles of a py_test
        package.parent / "bazel-bin" / "ops" / LIBRARY_NAME,  # a source checkout after bazel build
    ]


def library_path() -> Path:
    """The op library that `load_library` loads; raises `OpLibraryError` when there is none."""
    candidates = _candidate_paths()
    for path in candidates:
        if path.is_file():
            return path
    looked = ", ".join(str(p) for p in candidates)
    raise OpLibraryError(
        f"tfcomp's op library {LIBRARY_NAME} was not found (looked at: {looked}). "
        f"Build it with: {REBUILD_COMMAND}"
    )


def _built_against(path: Path) -> str | None:
    """The TensorFlow version recorded in the library's build-info string, if any."""
    match = _BUILD_INFO.search(path.read_bytes())
    return match.group(1).decode() if match else None


@functools.lru_cache(maxsize=None)
def load_library():
    """Loads the op library once and returns its generated op module."""
    path = library_path()
    built_for = _built_against(path)
    if built_for != tf.__version__:
        raise OpLibraryError(
            f"tfcomp's op library {path} was built against TensorFlow {built_for or 'unknown'}, "
            f"but this process runs TensorFlow {tf.__version__}. Rebuild it with: {REBUILD_COMMAND}"
        )
    try:
        return tf.load_op_library(str(path))
    except tf.errors.NotFoundError as error:
        raise OpLibraryError(
            f"tfcomp's op library {path} (built against TensorFlow {built_for}) failed to load: {error}. "
            f"Rebuild it with: {REBUILD_COMMAND}"
        ) from error


def estimate_threshold(grad, ratio, num_samples: int, seed, name: str | None = None) -> tf.Tensor:
    """Estimates the |g| threshold that keeps a fraction `ratio` of `grad` (004 Sec. 2, DGC).

    Samples min(num_samples, size) elements, one uniformly at random within each of that many equal
    strata (all elements when num_samples >= size), and returns the k-th largest magnitude among the
    finite samples, k = max(1, round(ratio * number of samples)), rounding halves up.

    Args:
      grad: non-empty tensor of any shape; float32, float16 or bfloat16.
      ratio: float32 scalar in (0, 1].
      num_samples: Python int >= 1.
      seed: int64 scalar; the same seed gives the same sample positions.
      name: optional op name.

    Returns:
      float32 scalar tensor.
    """
    return load_library().tfcomp_estimate_threshold(
        grad, tf.cast(ratio, tf.float32), tf.cast(seed, tf.int64), num_samples=num_samples, name=name
    )


def dragonn_compress(grad, threshold, num_slots: int, seed, name: str | None = None):
    """DRAGONN hashing sparsification (004 Algorithm 1).

    Every element with |g| >= threshold (NaN and Inf always) writes its flat index into slot h(index)
    of `num_slots` slots; h is a universal hash chosen by `seed`. When several selected elements hash
    to one slot, the one of largest magnitude keeps it (NaN above Inf above finite values; equal
    magnitudes: the largest index), so equal inputs and seed always give equal outputs.

    Args:
      grad: tensor of any shape with < 2^31 elements; float32, float16 or bfloat16.
      threshold: finite float32 scalar.
      num_slots: Python int >= 1, the payload length.
      seed: int64 scalar selecting the hash function.
      name: optional op name.

    Returns:
      (values, indices): [num_slots] of grad's dtype and [num_slots] int32; empty slots hold index -1
      and value 0.
    """
    return load_library().tfcomp_dragonn_compress(
        grad, tf.cast(threshold, tf.float32), tf.cast(seed, tf.int64), num_slots=num_slots, name=name
    )


def dgc_compress(grad, threshold, max_out: int, name: str | None = None):
    """DGC threshold sparsification, the baseline of 004 Algorithm 3.

    Args:
      grad: tensor of any shape with < 2^31 elements; float32, float16 or bfloat16.
      threshold: finite float32 scalar.
      max_out: Python int >= 1, the payload length.
      name: optional op name.

    Returns:
      (values, indices): [max_out] of grad's dtype and [max_out] int32: the elements with
      |g| >= threshold (NaN and Inf always) in increasing index order, the first max_out of them,
      padded with index -1 and value 0.
    """
    return load_library().tfcomp_dgc_compress(grad, tf.cast(threshold, tf.float32), max_out=max_out, name=name)


def topk_compress(grad, k: int, name: str | None = None):
    """Exact top-k sparsification by magnitude.

    Args:
      grad: tensor of any shape with k <= size < 2^31; float32, float16 or bfloat16.
      k: Python int >= 1.
      name: optional op name.

    Returns:
      (values, indices): [k] of grad's dtype and [k] int32, the k elements of largest |g| in increasing
      index order (NaN ranks above Inf above finite values; equal magnitudes: the larger index first).
    """
    return load_library().tfcomp_topk_compress(grad, k=k, name=name)


def sparse_batched_decode(values, indices, size: int, name: str | None = None) -> tf.Tensor:
    """Sums (value, index) pairs into a dense vector in one pass (004 Sec. 4.3).

    Pass the concatenated payloads of all K workers to decode them with one op instead of K dense
    decodes and a sum. Index -1 is skipped; duplicate indices add up.

    Args:
      values: [n] float32, float16 or bfloat16.
      indices: [n] int32, each in [-1, size); anything else is an InvalidArgument error.
      size: Python int >= 0, the dense length.
      name: optional op name.

    Returns:
      [size] tensor of values' dtype.
    """
    return load_library().tfcomp_sparse_batched_decode(values, indices, size=size, name=name)
