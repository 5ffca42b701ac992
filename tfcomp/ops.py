"""The op library `_tfcomp_ops.so`: lazy loading and typed wrappers of its ops.

All ops run on the CPU (CUDA kernels are registered when the library is built with CUDA).
Gradients may have any shape and dtype float32, float16 or bfloat16; indices are int32 flat
indices into the gradient, -1 marking an empty entry; thresholds are float32 scalars.

The library is loaded on the first call of any op. If it is missing, or was built against another
TensorFlow than the one running, that call raises `OpLibraryError`, which says what was built
against what and the command that rebuilds it.

Every wrapper checks its Python-number arguments before the op runs: a wrong type is a `TypeError`,
a value out of range a `ValueError`, each naming the argument and the value. It checks the dtype of
every tensor argument too (a `TypeError` naming the argument, the dtypes it takes and the dtype and
shape it was given); arrays and lists are converted as each argument's doc says. Tensor values and
shapes (which may be symbolic) are checked by the kernel, which raises
`tf.errors.InvalidArgumentError` (or, in a `tf.function`, a `ValueError` from the shape function)
naming the argument and its value or shape. Lengths (num_slots, max_out, k, size) are at most
2^31 - 1, since indices are int32; an output those lengths make too large for the process's memory
is a `tf.errors.ResourceExhaustedError` naming the length.
"""

from __future__ import annotations

import functools
import numbers
import os
import re
from pathlib import Path

import numpy as np
import tensorflow as tf

__all__ = [
    "MAX_LENGTH",
    "MAX_NUM_PARTS",
    "OpLibraryError",
    "REBUILD_COMMAND",
    "adam_accumulate",
    "adam_bias_corrections",
    "dgc_compress",
    "dragonn_compress",
    "estimate_threshold",
    "hash_partition",
    "int_dequantize",
    "int_quantize",
    "library_path",
    "load_library",
    "momentum_accumulate",
    "sparse_batched_decode",
    "sum_pairs",
    "time_after",
    "topk_compress",
    "zero_at",
]

LIBRARY_NAME = "_tfcomp_ops.so"
LIBRARY_ENV = "TFCOMP_OPS_LIBRARY"
REBUILD_COMMAND = "scripts/build_ops.sh   (from the tfcomp checkout, with its .venv active; or: pip install .)"
_BUILD_INFO = re.compile(rb"TFCOMP_BUILD_INFO\{tf=([^}]*)\}")
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
MAX_LENGTH = _INT32_MAX  # the longest gradient, payload or dense output: indices are int32
MAX_NUM_PARTS = 2**20  # hash_partition's owners: its splits hold one int32 per owner
_GRADIENT_DTYPES = (tf.float32, tf.float16, tf.bfloat16)
_GRADIENT_NUMPY_DTYPES = tuple(np.dtype(dtype.as_numpy_dtype) for dtype in _GRADIENT_DTYPES)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

for _op in ("EstimateThreshold", "DragonnCompress", "DgcCompress", "TopkCompress", "SparseBatchedDecode", "ZeroAt",
            "HashPartition", "SumPairs", "TimeAfter", "MomentumAccumulate", "AdamAccumulate"):
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


def _is_scalar_number(value) -> bool:
    """True for a Python or NumPy scalar (bool included), which the wrappers check themselves."""
    return isinstance(value, (numbers.Number, np.generic))


def _check_int(name: str, value, minimum: int, maximum: int) -> int:
    """A Python-int argument (an op attribute or a Python seed) in [minimum, maximum], as an int."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{name} must be in [{minimum}, {maximum}], got {value}")
    return int(value)


def _float32_of(name: str, value) -> np.float32:
    """A real Python or NumPy scalar as the float32 the op receives."""
    real = isinstance(value, numbers.Real) or _kind(value) in ("int", "float")  # bfloat16 is no numbers.Real
    if isinstance(value, (bool, np.bool_)) or not real:
        raise TypeError(f"{name} must be a real number or a tensor, got {value!r} of type {type(value).__name__}")
    try:
        with np.errstate(over="ignore"):
            return np.float32(value)
    except OverflowError:  # an int beyond float64's range
        return np.float32(np.inf if value > 0 else -np.inf)


def _kind(value) -> str | None:
    """The kind of the dtype of a tensor, or of the array NumPy makes of `value`: "int" for integers,
    "float" for floating point (bfloat16 included), None for anything else."""
    if tf.is_tensor(value):
        return "int" if value.dtype.is_integer else "float" if value.dtype.is_floating else None
    dtype = np.asarray(value).dtype
    if dtype.kind in "iu":
        return "int"
    return "float" if dtype.kind == "f" or dtype == tf.bfloat16.as_numpy_dtype else None


def _given(value) -> str:
    """What an argument was, for an error: a tensor's or array's dtype and shape, else its repr."""
    if tf.is_tensor(value) or isinstance(value, (np.ndarray, np.generic)):
        dtype = value.dtype.name
        kind = "tensor" if tf.is_tensor(value) else "array"
        return f"{'an' if dtype[0] in 'aeiou' else 'a'} {dtype} {kind} of shape {value.shape}"
    shown = repr(value)
    return shown if len(shown) <= 80 else f"{shown[:60]}... ({type(value).__name__})"


def _check_kind(name: str, value, kinds: tuple, what: str) -> None:
    """A tensor or array-like argument must have a dtype of one of `kinds` (see _kind)."""
    try:
        kind = _kind(value)
    except ValueError:  # a ragged list
        kind = None
    if kind not in kinds:
        raise TypeError(f"{name} must be {what}, got {_given(value)}")


def _gradient_input(name: str, value):
    """A tensor argument of dtype float32, float16 or bfloat16 (an op's T): a tensor or array of
    another dtype is a TypeError naming `name`; a list or number becomes the tensor TensorFlow makes
    of it (Python floats: float32)."""
    if not tf.is_tensor(value) and not isinstance(value, (np.ndarray, np.generic)):
        try:
            value = tf.convert_to_tensor(value)
        except (TypeError, ValueError) as error:
            raise TypeError(f"{name} must be a float32, float16 or bfloat16 tensor, got {_given(value)}") from error
    if (value.dtype not in _GRADIENT_DTYPES) if tf.is_tensor(value) else (value.dtype not in _GRADIENT_NUMPY_DTYPES):
        raise TypeError(f"{name} must be a float32, float16 or bfloat16 tensor, got {_given(value)}")
    return value


def _check_array_range(name: str, array: np.ndarray, minimum: int, maximum: int) -> None:
    """Every element of an integer array lies in [minimum, maximum]."""
    outside = np.flatnonzero((array < minimum) | (array > maximum))
    if outside.size:
        first = outside[0]
        raise ValueError(f"{name} must be in [{minimum}, {maximum}], got {array.flat[first]} at flat position {first}")


def _to_float32(value):
    """A real tensor, array or number as float32: arrays and numbers rounded by NumPy, since
    TensorFlow's Cast runs with denormals flushed to zero and would turn a denormal into 0."""
    if tf.is_tensor(value):
        return tf.cast(value, tf.float32)
    with np.errstate(over="ignore"):
        return np.asarray(value, np.float32)


def _ratio(value):
    """ratio as float32: a number must be in (0, 1]; a tensor must be real (its value is the kernel's)."""
    if not _is_scalar_number(value):
        _check_kind("ratio", value, ("int", "float"), "a real number or tensor")
    elif not 0.0 < _float32_of("ratio", value) <= 1.0:
        raise ValueError(f"ratio must be in (0, 1] as a float32, got {value!r}")
    return _to_float32(value)


def _threshold(value):
    """threshold as float32: a number must be finite; a tensor must be real (its value is the kernel's)."""
    if not _is_scalar_number(value):
        _check_kind("threshold", value, ("int", "float"), "a real number or tensor")
    elif not np.isfinite(_float32_of("threshold", value)):
        raise ValueError(f"threshold must be finite as a float32, got {value!r}")
    return _to_float32(value)


def _real(name: str, value):
    """A float32 scalar argument (scale, step): a real number, or a tensor or array of a real dtype,
    as float32 (its value and shape are the kernel's to check)."""
    if _is_scalar_number(value):
        _float32_of(name, value)
    else:
        _check_kind(name, value, ("int", "float"), "a real number or a tensor of a real dtype")
    return _to_float32(value)


def _seed(value):
    """seed: an int (or an array of ints) must fit int64; a tensor must be of an integer dtype."""
    if _is_scalar_number(value):
        return _check_int("seed", value, _INT64_MIN, _INT64_MAX)
    _check_kind("seed", value, ("int",), "an int or an integer tensor")
    if not tf.is_tensor(value):
        _check_array_range("seed", np.asarray(value), _INT64_MIN, _INT64_MAX)
    return value


def _parts(grad, addend) -> tuple:
    """(grad as a list of tensors, addend as a list: [] for None; whether grad was a list). A list
    or tuple grad is the parts of one gradient, their concatenation, and its addend must be a list
    of as many. Dtypes are checked here (one of the gradient dtypes for all of grad, float32 for
    grad and addend with an addend); shapes are the kernel's to check (it names them in its error)."""
    as_list = isinstance(grad, (list, tuple))
    grads = list(grad) if as_list else [grad]
    if not grads:
        raise ValueError("grad must hold at least one tensor, got an empty list")
    grads = [_gradient_input(f"grad[{i}]" if as_list else "grad", g) for i, g in enumerate(grads)]
    dtypes = {tf.as_dtype(g.dtype) for g in grads}
    if len(dtypes) > 1:
        raise TypeError(f"grad's tensors must share one dtype, got {', '.join(_given(g) for g in grads)}")
    if addend is None:
        return grads, [], as_list
    if as_list != isinstance(addend, (list, tuple)):
        raise TypeError(f"addend must be a list where grad is a list and a tensor where grad is a tensor, got "
                        f"{type(addend).__name__} for a grad of type {type(grad).__name__}")
    addends = list(addend) if as_list else [addend]
    if len(addends) != len(grads):
        raise ValueError(f"addend must hold one tensor per grad tensor ({len(grads)}), got {len(addends)}")
    if dtypes != {tf.float32}:
        raise TypeError(f"addend is supported for a float32 grad only, got grad as {_given(grads[0])}")
    addends = [_float32_input(f"addend[{i}]" if as_list else "addend", a) for i, a in enumerate(addends)]
    return grads, addends, as_list


def _indices(value, name: str = "indices"):
    """indices (or another int32 argument `name`): a tensor must be int32 (its values are the
    kernel's to check); an array or list must hold integers that fit int32 (TensorFlow's conversion
    would truncate floats and wrap large integers silently), returned as int32."""
    if tf.is_tensor(value):
        if value.dtype != tf.int32:
            raise TypeError(f"{name} must be an int32 tensor (or integers that fit int32), got {_given(value)}")
        return value
    array = np.asarray(value)
    if array.size == 0:  # NumPy makes [] a float64 array
        return array.astype(np.int32)
    _check_kind(name, array, ("int",), "integers (int32)")
    _check_array_range(name, array, _INT32_MIN, _INT32_MAX)
    return array.astype(np.int32)


def estimate_threshold(grad, ratio, num_samples: int, seed, addend=None, name: str | None = None) -> tf.Tensor:
    """Estimates the |g| threshold that keeps a fraction `ratio` of `grad` (004 Sec. 2, DGC).

    Samples min(num_samples, size) elements, one uniformly at random within each of that many equal
    strata (all elements when num_samples >= size), and returns the k-th largest magnitude among the
    finite samples, k = max(1, round(ratio * number of samples)), rounding halves up.

    Args:
      grad: tensor of any shape; float32, float16 or bfloat16. Or a list of such tensors of one
        dtype, the parts of one gradient (a bucket), read in place as their flattened
        concatenation, which is never built: the result is that of the concatenation. Not empty,
        < 2^31 elements in all.
      ratio: float32 scalar in (0, 1].
      num_samples: Python int in [1, 2^63 - 1].
      seed: int64 scalar; the same seed gives the same sample positions.
      addend: None, or a float32 tensor of grad's shape (grad then float32 too), a list of one per
        tensor of a list grad: the samples are taken from grad + addend (each sum rounded once, as
        `tf.add` gives), never stored.
      name: optional op name.

    Returns:
      float32 scalar tensor.

    Raises:
      TypeError, ValueError: a Python-number argument of the wrong type or out of range.
    """
    ratio, seed = _ratio(ratio), _seed(seed)
    num_samples = _check_int("num_samples", num_samples, 1, _INT64_MAX)
    grads, addends, _ = _parts(grad, addend)
    return load_library().tfcomp_estimate_threshold(
        grads, ratio, tf.cast(seed, tf.int64), addends, num_samples=num_samples, name=name
    )


def dragonn_compress(grad, threshold, num_slots: int, seed, addend=None, name: str | None = None):
    """DRAGONN hashing sparsification (004 Algorithm 1).

    Every element with |g| >= threshold (NaN and Inf always) writes its flat index into slot h(index)
    of `num_slots` slots; h is a universal hash chosen by `seed`. When several selected elements hash
    to one slot, the one of largest magnitude keeps it (NaN above Inf above finite values; equal
    magnitudes: the largest index), so equal inputs and seed always give equal outputs.

    Args:
      grad: tensor of any shape; float32, float16 or bfloat16. Or a list of such tensors of one
        dtype, the parts of one gradient (a bucket), read in place as their flattened
        concatenation, which is never built: indices are into it. < 2^31 elements in all.
      threshold: finite float32 scalar.
      num_slots: Python int in [1, 2^31 - 1], the payload length.
      seed: int64 scalar selecting the hash function.
      addend: None, or a float32 tensor of grad's shape (grad then float32 too), a list of one per
        tensor of a list grad: the op then sparsifies g = grad + addend (each sum rounded once, as
        `tf.add` gives), computed in the pass that selects and returned (error feedback's gradient
        plus residual, read once).
      name: optional op name.

    Returns:
      (values, indices): [num_slots] of grad's dtype and [num_slots] int32, g's values at the
      indices; empty slots hold index -1 and value 0. With an addend, (values, indices, g), g of
      grad's shape (for a list grad, a list: one tensor per part, of its shape).

    Raises:
      TypeError, ValueError: a Python-number argument of the wrong type or out of range.
    """
    threshold, seed = _threshold(threshold), _seed(seed)
    num_slots = _check_int("num_slots", num_slots, 1, MAX_LENGTH)
    grads, addends, as_list = _parts(grad, addend)
    values, indices, sums = load_library().tfcomp_dragonn_compress(
        grads, threshold, tf.cast(seed, tf.int64), addends, num_slots=num_slots, name=name
    )
    if addend is None:
        return values, indices
    return values, indices, (list(sums) if as_list else sums[0])


def dgc_compress(grad, threshold, max_out: int, name: str | None = None):
    """DGC threshold sparsification, the baseline of 004 Algorithm 3.

    Args:
      grad: tensor of any shape with < 2^31 elements; float32, float16 or bfloat16.
      threshold: finite float32 scalar.
      max_out: Python int in [1, 2^31 - 1], the payload length.
      name: optional op name.

    Returns:
      (values, indices): [max_out] of grad's dtype and [max_out] int32: the elements with
      |g| >= threshold (NaN and Inf always) in increasing index order, the first max_out of them,
      padded with index -1 and value 0.

    Raises:
      TypeError, ValueError: a Python-number argument of the wrong type or out of range.
    """
    grad, threshold = _gradient_input("grad", grad), _threshold(threshold)
    max_out = _check_int("max_out", max_out, 1, MAX_LENGTH)
    return load_library().tfcomp_dgc_compress(grad, threshold, max_out=max_out, name=name)


def topk_compress(grad, k: int, name: str | None = None):
    """Exact top-k sparsification by magnitude.

    Args:
      grad: tensor of any shape with k <= size < 2^31; float32, float16 or bfloat16.
      k: Python int in [1, 2^31 - 1].
      name: optional op name.

    Returns:
      (values, indices): [k] of grad's dtype and [k] int32, the k elements of largest |g| in increasing
      index order (NaN ranks above Inf above finite values; equal magnitudes: the larger index first).

    Raises:
      TypeError, ValueError: k of the wrong type or out of range.
    """
    grad, k = _gradient_input("grad", grad), _check_int("k", k, 1, MAX_LENGTH)
    return load_library().tfcomp_topk_compress(grad, k=k, name=name)


def sparse_batched_decode(values, indices, size: int, name: str | None = None) -> tf.Tensor:
    """Sums (value, index) pairs into a dense vector in one pass (004 Sec. 4.3).

    Pass the concatenated payloads of all K workers to decode them with one op instead of K dense
    decodes and a sum. Index -1 is skipped; duplicate indices add up, in pair order, from 0.

    Subnormal sums are flushed to zero on the CPU: float32 and bfloat16 add in float32 under
    TensorFlow's floating-point mode (FTZ and DAZ), so a value of magnitude below 2^-126 (1.18e-38)
    adds as a zero of its sign and a partial or final sum that lands below it becomes a zero of its
    sign (1.5e-38 + -1.4e-38 gives +0; -1.5e-38 + 1.4e-38 gives -0). float16 keeps its subnormals
    (they are normal float32 values). The GPU kernel does not flush.

    Args:
      values: [n] float32, float16 or bfloat16.
      indices: [n] int32, each in [-1, size); anything else is an InvalidArgument error.
      size: Python int in [0, 2^31 - 1], the dense length.
      name: optional op name.

    Returns:
      [size] tensor of values' dtype.

    Raises:
      TypeError, ValueError: size of the wrong type or out of range, or indices given as an array or
        list that are not integers or do not fit int32.
    """
    values, size = _gradient_input("values", values), _check_int("size", size, 0, MAX_LENGTH)
    return load_library().tfcomp_sparse_batched_decode(values, _indices(indices), size=size, name=name)


def hash_partition(values, indices, num_parts: int, name: str | None = None):
    """Sorts (value, index) pairs by the rank that owns their index, for Horovod's alltoall (the
    hash-partitioned sparse allreduce).

    The owner of index i is a hash of i that every rank and device shares: with u = (i * 2654435761)
    mod 2^32 (Fibonacci hashing), owner = floor(u * num_parts / 2^32), so that the neighbouring
    indices of one layer spread over all owners. Pairs with index -1 (empty slots) are dropped.

    Args:
      values: [m] float32 (an array of another real dtype is converted to float32).
      indices: [m] int32, -1 or >= 0; an index < -1 is an InvalidArgument error.
      num_parts: Python int in [1, 2^20], the number of owners (ranks); splits holds one int32 per
        owner, and the op's memory is its outputs and O(m + num_parts).
      name: optional op name.

    Returns:
      (rows, splits): rows int32 [n, 2], (index, the float32 bits of its value) of the n pairs with
      index >= 0, owner 0's first, in input order within an owner; splits int32 [num_parts], the
      rows of each owner.

    Raises:
      TypeError, ValueError: num_parts of the wrong type or out of range, or indices given as an
        array or list that are not integers or do not fit int32.
    """
    num_parts = _check_int("num_parts", num_parts, 1, MAX_NUM_PARTS)
    return load_library().tfcomp_hash_partition(_float32_input("values", values), _indices(indices),
                                                 num_parts=num_parts, name=name)


def sum_pairs(rows, max_pairs: int | None = None, name: str | None = None) -> tf.Tensor:
    """The owner's step of the hash-partitioned sparse allreduce: the (index, value) rows every
    worker sent to this owner (`hash_partition`'s rows, after Horovod's alltoall) summed per index,
    at most `max_pairs` of the sums kept.

    Each sum is 0 plus its index's values in row order, one float32 rounding per addition (as
    unsorted_segment_sum adds them; denormals flushed as on TensorFlow's CPU threads). The kept sums
    are the largest in magnitude (NaN above +Inf above every finite value; of equal magnitudes, the
    lower index's).

    Args:
      rows: int32 [n, 2], (index >= 0, the float32 bits of a value) per row; a negative index is an
        InvalidArgument error. An array or list must hold integers that fit int32.
      max_pairs: None to keep every sum, or a Python int in [0, 2^31 - 1].
      name: optional op name.

    Returns:
      int32 [m, 2]: (index, the float32 bits of the sum of its values) of the m kept distinct
      indices (m = min(max_pairs, distinct indices)), in ascending index order.

    Raises:
      TypeError, ValueError: max_pairs of the wrong type or out of range.
    """
    max_pairs = -1 if max_pairs is None else _check_int("max_pairs", max_pairs, 0, _INT32_MAX)
    return load_library().tfcomp_sum_pairs(_indices(rows, "rows"), max_pairs=max_pairs, name=name)


def _check_bits(bits) -> int:
    if not isinstance(bits, numbers.Integral) or isinstance(bits, (bool, np.bool_)) or bits not in (4, 8, 16):
        raise ValueError(f"bits must be 4, 8 or 16, got {bits!r}")
    return int(bits)


def int_quantize(grad, scale, seed, bits: int, levels: int, name: str | None = None) -> tf.Tensor:
    """IntQuant's encode: integer levels of `grad` that an integer allreduce sums (THC).

    Element i becomes clamp(floor(grad[i] * (levels / scale) + u_i), -levels, levels), u_i uniform
    in [0, 1) drawn from (seed, i), so that its expectation is grad[i] * levels / scale where
    |grad[i]| <= scale (float32, one rounding per operation); a non-finite element, or a scale
    that is not positive and finite, gives 0.
    32 / bits levels are packed into each int32 (level j of a lane times 2^(bits j)), so that the
    sum of K workers' lanes holds the sums of their levels while K * levels <= 2^(bits-1) - 1.

    Args:
      grad: float32 tensor of any shape with < 2^31 elements.
      scale: float32 scalar, agreed by the workers (at least every |grad[i]|).
      seed: int64 scalar.
      bits: Python int, 4, 8 or 16.
      levels: Python int in [1, 2^(bits-1) - 1].
      name: optional op name.

    Returns:
      int32 [ceil(size / (32 / bits))].

    Raises:
      TypeError, ValueError: a Python-number argument of the wrong type or out of range.
    """
    bits = _check_bits(bits)
    levels = _check_int("levels", levels, 1, 2 ** (bits - 1) - 1)
    return load_library().tfcomp_int_quantize(_float32_input("grad", grad), _real("scale", scale),
                                              tf.cast(_seed(seed), tf.int64), bits=bits, levels=levels, name=name)


def int_dequantize(lanes, step, bits: int, size: int, name: str | None = None) -> tf.Tensor:
    """IntQuant's decode: the signed `bits`-bit fields of int32 lanes (from `int_quantize`, or a
    sum of such lanes), lowest first, each times `step`.

    Args:
      lanes: int32 [ceil(size / (32 / bits))].
      step: float32 scalar, the value of one level.
      bits: Python int, 4, 8 or 16.
      size: Python int in [0, 2^31 - 1], the elements to unpack.
      name: optional op name.

    Returns:
      float32 [size].

    Raises:
      TypeError, ValueError: a Python-number argument of the wrong type or out of range.
    """
    bits = _check_bits(bits)
    size = _check_int("size", size, 0, MAX_LENGTH)
    return load_library().tfcomp_int_dequantize(_indices(lanes, "lanes"), _real("step", step), bits=bits, size=size,
                                                name=name)


def zero_at(variable: tf.Variable, indices, offset: int = 0, name: str | None = None) -> tf.Operation:
    """Sets to zero, in place, the elements of `variable` that `indices` name (error feedback's
    clearing of the k sent elements of a residual, in O(k)).

    Element i - offset is cleared for every index i in [offset, offset + variable size); the other
    indices (-1, or those of the other tensors of a merged bucket) are skipped. Unlike
    `variable.scatter_nd_update`, it leaves the variable out of TensorFlow's copy-on-read mode, in
    which every later read of the variable copies all of it.

    Args:
      variable: a float32 `tf.Variable` (resource variable) of any shape, initialized.
      indices: [n] int32 flat indices.
      offset: Python int in [0, 2^31 - 1], where the variable's elements start among the indices.
      name: optional op name.

    Returns:
      The op (None when executing eagerly).

    Raises:
      TypeError, ValueError: offset of the wrong type or out of range; variable not a float32
        resource variable.
    """
    offset = _check_int("offset", offset, 0, MAX_LENGTH)
    if not isinstance(variable, tf.Variable) or not hasattr(variable, "handle"):
        raise TypeError(f"variable must be a tf.Variable (resource variable), got {type(variable).__name__}")
    if variable.dtype != tf.float32:
        raise ValueError(f"variable must be float32, got {variable.dtype.name}")
    return load_library().tfcomp_zero_at(variable.handle, _indices(indices), offset=offset, name=name)


def _finite_coefficient(name: str, value) -> float:
    """A finite real Python or NumPy number (an op attribute, float32 in the op)."""
    if not _is_scalar_number(value):
        raise TypeError(f"{name} must be a real number, got {value!r} of type {type(value).__name__}")
    if not np.isfinite(_float32_of(name, value)):
        raise ValueError(f"{name} must be finite as a float32, got {value!r}")
    return float(value)


def _float32_input(name: str, value):
    """A float32 tensor argument as given; an array or number of a real dtype as float32."""
    if tf.is_tensor(value):
        if value.dtype != tf.float32:
            raise TypeError(f"{name} must be a float32 tensor, got {_given(value)}")
        return value
    _check_kind(name, value, ("int", "float"), "a float32 tensor or a real array")
    return _to_float32(value)


def _residual_list(residual) -> list:
    return [] if residual is None else [_float32_input("residual", residual)]


def momentum_accumulate(grad, momentum, mu: float, residual=None, name: str | None = None) -> tuple:
    """Error feedback's accumulation under DGC's momentum correction, in one pass.

    u' = mu * u + g and the accumulated gradient r + u', each operation one float32 operation
    rounded to nearest, as TensorFlow's mul and add give them, but reading g, u and r once.

    Args:
      grad: float32 tensor of any shape (< 2^31 elements); here and below an array is taken as float32,
        a tensor of another dtype is a TypeError.
      momentum: float32 tensor of grad's shape, u.
      mu: finite real Python number, the momentum coefficient.
      residual: None, or a float32 tensor of grad's shape, r.
      name: optional op name.

    Returns:
      (new_momentum u', accumulated r + u'), float32 tensors of grad's shape; without a residual,
      accumulated is u' itself.
    """
    mu = _finite_coefficient("mu", mu)
    new_momentum, accumulated = load_library().tfcomp_momentum_accumulate(
        _float32_input("grad", grad), _float32_input("momentum", momentum), _residual_list(residual), mu=mu, name=name)
    return new_momentum, accumulated


def _step(value) -> tf.Tensor:
    """Adam's step t as a float32 scalar tensor: a real number, or a scalar tensor or array of an
    integer or floating dtype; anything else is a TypeError (a ValueError for a known rank > 0)."""
    what = "a real number or a scalar tensor of an integer or floating dtype"
    if _is_scalar_number(value):
        _float32_of("step", value)
    else:
        _check_kind("step", value, ("int", "float"), what)
        rank = value.shape.rank if tf.is_tensor(value) else np.ndim(value)
        if rank not in (None, 0):
            raise ValueError(f"step must be a scalar ({what}), got {_given(value)}")
    return tf.cast(value, tf.float32)


def adam_bias_corrections(step, beta_1: float, beta_2: float) -> tuple:
    """(1 - beta_1^t, 1 - beta_2^t), float32 scalars: Adam's bias corrections for the step t
    (`step`, a real number or a scalar tensor of an integer or floating dtype, cast to float32), as
    `adam_accumulate` computes them; computed once, they serve every tensor of a step.

    Raises:
      TypeError, ValueError: step not a real scalar (the error names it and says what it got); a
        coefficient not a finite real number.
    """
    beta_1, beta_2 = _finite_coefficient("beta_1", beta_1), _finite_coefficient("beta_2", beta_2)
    t = _step(step)
    return 1.0 - tf.pow(tf.constant(beta_1, tf.float32), t), 1.0 - tf.pow(tf.constant(beta_2, tf.float32), t)


def adam_accumulate(grad, m, v, step, beta_1: float, beta_2: float, epsilon: float, residual=None,
                    name: str | None = None, bias_corrections=None) -> tuple:
    """Error feedback's accumulation under the Adam correction, in one pass.

    m' = beta_1 m + (1 - beta_1) g, v' = beta_2 v + (1 - beta_2) g^2, and the accumulated gradient
    r + d of Adam's bias-corrected direction d = (m' / (1 - beta_1^t)) / (sqrt(v' / (1 - beta_2^t)) +
    epsilon), each operation one float32 operation rounded to nearest (the results of the same
    TensorFlow ops, with 1 - beta rounded from Python's float), reading g, m, v and r once.

    Args:
      grad: float32 tensor of any shape (< 2^31 elements).
      m, v: float32 tensors of grad's shape, Adam's moments.
      step: the step t of the bias corrections, a real number or a scalar tensor of an integer or
        floating dtype (cast to float32); None where `bias_corrections` gives them.
      beta_1, beta_2, epsilon: finite real Python numbers.
      residual: None, or a float32 tensor of grad's shape, r.
      name: optional op name.
      bias_corrections: None, or `adam_bias_corrections(t, beta_1, beta_2)` of the same betas,
        shared by the tensors of one step (fewer ops in the step's graph).

    Returns:
      (new_m, new_v, accumulated), float32 tensors of grad's shape.

    Raises:
      TypeError, ValueError: an argument of the wrong type, dtype or rank (the error names it and
        says what it got), or a coefficient that is not finite.
    """
    if (step is None) == (bias_corrections is None):
        raise ValueError("adam_accumulate needs exactly one of step and bias_corrections, got "
                         f"step={step!r}, bias_corrections={bias_corrections!r}")
    beta_1, beta_2 = _finite_coefficient("beta_1", beta_1), _finite_coefficient("beta_2", beta_2)
    epsilon = _finite_coefficient("epsilon", epsilon)
    if bias_corrections is None:
        m_correction, v_correction = adam_bias_corrections(step, beta_1, beta_2)
    elif isinstance(bias_corrections, (tuple, list)) and len(bias_corrections) == 2:
        m_correction, v_correction = (_float32_input(f"bias_corrections[{i}]", correction)
                                      for i, correction in enumerate(bias_corrections))
    else:
        raise TypeError(f"bias_corrections must be the pair adam_bias_corrections returns, got {_given(bias_corrections)}")
    new_m, new_v, accumulated = load_library().tfcomp_adam_accumulate(
        _float32_input("grad", grad), _float32_input("m", m), _float32_input("v", v), _residual_list(residual),
        m_correction, v_correction, beta_1=beta_1, one_minus_beta_1=1.0 - beta_1,
        beta_2=beta_2, one_minus_beta_2=1.0 - beta_2, epsilon=epsilon, name=name)
    return new_m, new_v, accumulated


def time_after(tensors, name: str | None = None) -> tf.Tensor:
    """float64 scalar: the time (seconds since the Unix epoch, as `tf.timestamp`) once every tensor
    of `tensors` has been computed: they are the op's data inputs, so the order holds where
    `tf.control_dependencies` on a `tf.timestamp` does not (Grappler's dependency optimizer can drop
    such control edges inside a `tf.function`). The tensors are not read.

    Args:
      tensors: a non-empty list of tensors (any dtypes and shapes), or of values that
        `tf.convert_to_tensor` takes.
      name: optional op name.

    Raises:
      TypeError: tensors not a list, or an entry (None, say) that is no tensor; the error names it.
      ValueError: an empty list.
    """
    if tf.is_tensor(tensors) or isinstance(tensors, (np.ndarray, np.generic)) or tensors is None:
        raise TypeError(f"tensors must be a list of tensors, got {_given(tensors)}")
    tensors = list(tensors)
    if not tensors:
        raise ValueError("tensors: give at least one tensor to wait for (tf.timestamp waits for none)")
    for i, tensor in enumerate(tensors):
        if not tf.is_tensor(tensor):
            try:
                tensors[i] = tf.convert_to_tensor(tensor)
            except (TypeError, ValueError) as error:
                raise TypeError(f"tensors[{i}] must be a tensor (or a value tf.convert_to_tensor takes), "
                                f"got {_given(tensor)}") from error
    return load_library().tfcomp_time_after(tensors, name=name)
