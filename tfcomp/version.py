"""tfcomp's version and the TensorFlow/Keras versions it supports."""

from __future__ import annotations

__all__ = ["SUPPORTED_TENSORFLOW", "__version__", "check_supported_stack"]

__version__ = "0.1.0"

# tfcomp is built and tested with TensorFlow 2.15 (Keras 2 built in) and Horovod 0.28.1.
SUPPORTED_TENSORFLOW = (">=2.15", "<2.16")


def check_supported_stack() -> None:
    """Raises RuntimeError when TensorFlow or Keras is outside the supported range."""
    import tensorflow as tf
    from packaging import version

    supported = f"TensorFlow {SUPPORTED_TENSORFLOW[0]},{SUPPORTED_TENSORFLOW[1]} with Keras 2"
    tf_version = version.parse(tf.__version__)
    if not version.parse("2.15") <= tf_version < version.parse("2.16"):
        raise RuntimeError(f"tfcomp supports {supported}; this process runs TensorFlow {tf.__version__}")
    keras_version = getattr(tf.keras, "__version__", None) or "2"
    if version.parse(keras_version).major >= 3:
        raise RuntimeError(f"tfcomp supports {supported}; tf.keras is Keras {keras_version}")
