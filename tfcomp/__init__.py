"""tfcomp: gradient compression that pays in Horovod/Keras data-parallel training.

The op library (Bazel-built TensorFlow custom ops) is reached through `tfcomp.ops`; it is loaded
lazily, on first use, so importing tfcomp never fails because of it.
"""

from tfcomp import ops
from tfcomp.version import __version__

__all__ = ["ops", "__version__"]
