"""The op library loads lazily, its ops are namespaced, and a missing or mismatched library fails
with an error that says what was built against what and how to rebuild."""

import subprocess
import sys

import pytest
import tensorflow as tf

from tests.helpers import child_env
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


def test_missing_library_says_how_to_build(tmp_path):
    result = run_python(FIRST_USE, str(tmp_path / "nowhere" / "_tfcomp_ops.so"))
    assert result.returncode == 0, result.stderr
    assert "imported" in result.stdout
    assert "_tfcomp_ops.so was not found" in result.stdout
    assert "scripts/build_ops.sh" in result.stdout


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


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
