"""The op library loads lazily, its ops are namespaced, and a missing or mismatched library fails
with an error that says what was built against what and how to rebuild. Every tensor argument of
every op given a wrong dtype, and lengths too large for the process's memory, are errors that name
the argument and say what it got."""

import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import child_env
from tests.op_child import run_in_child
from tfcomp import ops


def run_python(code: str, library: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=child_env(TFCOMP_OPS_LIBRARY=library), capture_output=True, text=True, timeout=300)


FIRST_USE = """
import tfcomp                                   # importing never loads the library
print("imported")
from tfcomp import ops
try:
    ops.topk_compress([1.0, 2.0], 1)
except ops.OpLibraryError as error:
    print("ERROR:", error)
"""


@pytest.mark.jobs
def test_missing_library_says_how_to_build(tmp_path):
    result = run_python(FIRST_USE, str(tmp_path / "nowhere" / "_tfcomp_ops.so"))
    assert result.returncode == 0, result.stderr
    assert "imported" in result.stdout
    assert "_tfcomp_ops.so was not found" in result.stdout
    assert "scripts/build_ops.sh" in result.stdout


@pytest.mark.jobs
def test_library_built_for_another_tensorflow_says_what_and_how(tmp_path):
    data = ops.library_path().read_bytes()
    marker = f"TFCOMP_BUILD_INFO{{tf={tf.__version__}}}".encode()
    assert marker in data
    other = "9" * len(tf.__version__)
    fake = tmp_path / "_tfcomp_ops.so"
    fake.write_bytes(data.replace(marker, f"TFCOMP_BUILD_INFO{{tf={other}}}".encode()))
    result = run_python(FIRST_USE, str(fake))
    assert result.returncode == 0, result.stderr
    assert f"built against TensorFlow {other}, but this process runs TensorFlow {tf.__version__}" in result.stdout
    assert "scripts/build_ops.sh" in result.stdout


def test_ops_are_namespaced_and_have_no_gradient():
    graph = tf.function(lambda g: ops.dragonn_compress(g, 0.5, 4, 1)).get_concrete_function(
        tf.TensorSpec([8], tf.float32)
    ).graph
    assert "Tfcomp>DragonnCompress" in {op.type for op in graph.get_operations()}
    g = tf.Variable(tf.ones([8]))
    with tf.GradientTape() as tape:
        values, _ = ops.dragonn_compress(g, 0.5, 4, 1)
        loss = tf.reduce_sum(values)
    assert tape.gradient(loss, g) is None


@pytest.mark.parametrize(
    "op, inputs, attr",
    [
        ("tfcomp_dragonn_compress", ([1.0, 2.0], 0.1, 1, []), "num_slots"),
        ("tfcomp_dgc_compress", ([1.0, 2.0], 0.1), "max_out"),
        ("tfcomp_topk_compress", ([1.0, 2.0],), "k"),
        ("tfcomp_sparse_batched_decode", ([1.0], [0]), "size"),
    ],
)
@pytest.mark.parametrize("value", [2**31, 2**63 - 1])
def test_kernels_bound_lengths_without_the_wrapper(op, inputs, attr, value):
    raw_op = getattr(ops.load_library(), op)
    message = rf"{attr} must be at most 2147483647 \(2\^31 - 1: indices are int32\), got {value}"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):  # the kernel's constructor
        raw_op(*inputs, **{attr: value})
    with pytest.raises(ValueError, match=message):  # the shape function, while tracing
        tf.function(lambda: raw_op(*inputs, **{attr: value}))()


@pytest.mark.parametrize(
    "call, attr",
    [
        ("ops.dragonn_compress(np.ones(3, np.float32), 0.5, 2**31 - 1, 1)", "num_slots"),
        ("ops.dgc_compress(np.ones(3, np.float32), 0.5, 2**31 - 1)", "max_out"),
        ("ops.sparse_batched_decode(np.ones(3, np.float32), np.array([0, 5, 9], np.int32), 2**31 - 1)", "size"),
    ],
)
@pytest.mark.jobs
def test_a_length_beyond_the_memory_is_an_error_that_names_it(call, attr):
    """An output of 2^31 - 1 elements within 512 MiB: ResourceExhausted naming the length attribute
    that asked for it (in a child process whose address space is limited)."""
    record = run_in_child(call, budget_mib=512)
    assert record["outcome"] == "raised" and record["error"] == "ResourceExhaustedError", record
    assert f"{attr} = 2147483647 asks for more memory than this process can allocate" in record["message"], record


def valid_call(op: str) -> dict:
    """Arguments of a valid call of ops.<op> (keyword arguments; "variable" made on demand)."""
    g = np.linspace(-1, 1, 16).astype(np.float32)
    return {
        "estimate_threshold": dict(grad=g, ratio=0.5, num_samples=8, seed=1, addend=g),
        "dragonn_compress": dict(grad=g, threshold=0.5, num_slots=8, seed=1, addend=g),
        "dgc_compress": dict(grad=g, threshold=0.5, max_out=8),
        "topk_compress": dict(grad=g, k=4),
        "sparse_batched_decode": dict(values=g[:3], indices=np.array([0, 5, -1], np.int32), size=8),
        "hash_partition": dict(values=g[:3], indices=np.array([0, 5, -1], np.int32), num_parts=2),
        "sum_pairs": dict(rows=np.array([[3, 0], [1, 0]], np.int32)),
        "int_quantize": dict(grad=g, scale=1.0, seed=1, bits=8, levels=8),
        "int_dequantize": dict(lanes=np.zeros(4, np.int32), step=0.5, bits=8, size=16),
        "zero_at": dict(variable=None, indices=np.array([0, 3], np.int32)),
        "momentum_accumulate": dict(grad=g, momentum=g, mu=0.9, residual=g),
        "adam_accumulate": dict(grad=g, m=g, v=np.abs(g), step=3, beta_1=0.9, beta_2=0.999, epsilon=1e-7, residual=g),
        "time_after": dict(tensors=[g, g]),
    }[op]


# (op, argument, a value of a wrong dtype, what the error must say the argument takes)
WRONG_DTYPES = [
    ("estimate_threshold", "grad", tf.zeros([16], tf.float64), "a float32, float16 or bfloat16 tensor"),
    ("estimate_threshold", "ratio", tf.constant("0.5"), "a real number or tensor"),
    ("estimate_threshold", "seed", tf.constant(1.5), "an int or an integer tensor"),
    ("estimate_threshold", "addend", tf.zeros([16], tf.float64), "a float32 tensor"),
    ("dragonn_compress", "grad", np.zeros(16, np.int32), "a float32, float16 or bfloat16 tensor"),
    ("dragonn_compress", "threshold", tf.constant(True), "a real number or tensor"),
    ("dragonn_compress", "seed", tf.constant("1"), "an int or an integer tensor"),
    ("dragonn_compress", "addend", tf.zeros([16], tf.float16), "a float32 tensor"),
    ("dgc_compress", "grad", tf.zeros([16], tf.int64), "a float32, float16 or bfloat16 tensor"),
    ("dgc_compress", "threshold", np.array("0.5"), "a real number or tensor"),
    ("topk_compress", "grad", np.zeros(16, np.complex64), "a float32, float16 or bfloat16 tensor"),
    ("sparse_batched_decode", "values", tf.zeros([3], tf.float64), "a float32, float16 or bfloat16 tensor"),
    ("sparse_batched_decode", "indices", tf.constant([0, 5, -1], tf.int64), "an int32 tensor"),
    ("hash_partition", "values", tf.zeros([3], tf.int32), "a float32 tensor"),
    ("hash_partition", "indices", tf.constant([0.0, 5.0, -1.0]), "an int32 tensor"),
    ("sum_pairs", "rows", tf.constant([[3, 0], [1, 0]], tf.int64), "an int32 tensor"),
    ("int_quantize", "grad", tf.zeros([16], tf.float16), "a float32 tensor"),
    ("int_quantize", "scale", tf.constant("1"), "a real number or a tensor of a real dtype"),
    ("int_quantize", "seed", tf.constant(1.0), "an int or an integer tensor"),
    ("int_dequantize", "lanes", tf.zeros([4], tf.float32), "an int32 tensor"),
    ("int_dequantize", "step", np.array(0.5j), "a real number or a tensor of a real dtype"),
    ("zero_at", "indices", tf.constant([0, 3], tf.int64), "an int32 tensor"),
    ("momentum_accumulate", "grad", tf.zeros([16], tf.float64), "a float32 tensor"),
    ("momentum_accumulate", "momentum", tf.zeros([16], tf.bfloat16), "a float32 tensor"),
    ("momentum_accumulate", "residual", tf.zeros([16], tf.float16), "a float32 tensor"),
    ("adam_accumulate", "grad", tf.zeros([16], tf.float16), "a float32 tensor"),
    ("adam_accumulate", "m", tf.zeros([16], tf.float64), "a float32 tensor"),
    ("adam_accumulate", "v", tf.zeros([16], tf.int32), "a float32 tensor"),
    ("adam_accumulate", "residual", tf.zeros([16], tf.float64), "a float32 tensor"),
    ("adam_accumulate", "step", tf.constant("3"), "a real number or a scalar tensor of an integer or floating dtype"),
    ("adam_accumulate", "step", np.array([True]), "a real number or a scalar tensor of an integer or floating dtype"),
]


@pytest.mark.parametrize("op, argument, value, takes", WRONG_DTYPES,
                         ids=[f"{op}-{argument}-{np.asarray(value).dtype.name if not tf.is_tensor(value) else value.dtype.name}"
                              for op, argument, value, _ in WRONG_DTYPES])
def test_a_wrong_dtype_is_named_with_what_was_expected_and_given(op, argument, value, takes):
    arguments = valid_call(op)
    if op == "zero_at":
        arguments["variable"] = tf.Variable(tf.zeros([8]))
    getattr(ops, op)(**arguments)  # the call is valid as it stands
    arguments[argument] = value
    kind = "tensor" if tf.is_tensor(value) else "array"
    dtype = value.dtype.name
    shape = re.escape(str(value.shape))
    given = rf"got an? {dtype} {kind} of shape {shape}"
    with pytest.raises(TypeError, match=rf"^{argument} must be {re.escape(takes)}.*, {given}"):
        getattr(ops, op)(**arguments)


@pytest.mark.parametrize("step", [tf.constant([1, 2]), np.array([3.0, 4.0])], ids=["tensor", "array"])
def test_a_vector_step_is_named_with_its_shape(step):
    g = np.ones(4, np.float32)
    with pytest.raises(ValueError, match=r"^step must be a scalar \(.*\), got an? (int32|float64) (tensor|array) of shape \(2,\)"):
        ops.adam_accumulate(g, g, g, step, 0.9, 0.999, 1e-7)
    with pytest.raises(ValueError, match=r"^step must be a scalar"):
        ops.adam_bias_corrections(step, 0.9, 0.999)


@pytest.mark.parametrize("step", ["3", None, True, 2j], ids=["str", "None-with-no-corrections", "bool", "complex"])
def test_a_step_that_is_no_real_number_is_named(step):
    g = np.ones(4, np.float32)
    error = ValueError if step is None else TypeError  # None: neither step nor bias_corrections
    with pytest.raises(error, match=r"step"):
        ops.adam_accumulate(g, g, g, step, 0.9, 0.999, 1e-7)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
