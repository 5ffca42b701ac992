"""`LazyModule`: a module imported on first use, so that what needs no TensorFlow does not load it.

    tf = LazyModule("tensorflow")   # nothing imported yet
    tf.constant(1.0)                # imports tensorflow, then looks the name up in it

`tfcomp.compressors` refers to TensorFlow and the op library this way: a compressor's settings and
payload sizes (all the cost model and `python -m tfcomp.whatif` read) need neither, and importing
TensorFlow takes seconds.
"""

from __future__ import annotations

import importlib
import types

__all__ = ["LazyModule"]


class LazyModule(types.ModuleType):
    """Stands in for the module `name`: every attribute read imports it (once; later reads find it
    in `sys.modules`) and returns the module's attribute. An ImportError surfaces at that read."""

    def __getattr__(self, attribute: str):
        return getattr(importlib.import_module(self.__name__), attribute)

    def __repr__(self) -> str:
        return f"<tfcomp.LazyModule {self.__name__!r}>"
