"""tfcomp's version and the TensorFlow versions it supports."""

__all__ = ["__version__"]

__version__ = "0.1.0"
