"""rlx_mil: RLX IR graphs to Apple Core ML ML Programs through the coremltools MIL Builder."""

from __future__ import annotations

import logging as _logging

# coremltools logs Linux-only proxy warnings when imported; keep them quiet unless the user
# configured that logger. (Importing rlx_mil changes nothing in the process environment: the
# pass-pipeline bars are hidden during rlx_mil's own conversions, `coreml.patches`.)
if _logging.getLogger("coremltools").level == _logging.NOTSET:
    _logging.getLogger("coremltools").setLevel(_logging.ERROR)

from rlx_mil import errors
from rlx_mil.ir import DType, Graph, MaskKind, QuantScheme, Shape
from rlx_mil.version import __version__

__all__ = [
    "DType", "Graph", "MaskKind", "QuantScheme", "Shape", "__version__", "convert", "convert_buckets",
    "convert_functions", "errors", "lower", "preflight", "save",
]

# coremltools itself is only imported on first conversion. (`rlx_mil.lower` is the public
# function; the lowering stage is the package `rlx_mil.lowering`.)
from rlx_mil.api import convert, convert_buckets, convert_functions, lower, save
from rlx_mil.coreml.preflight import preflight

_SUBMODULES = ("reference", "milexec", "testing", "weights", "models", "generate")


def __getattr__(name: str) -> object:
    # Heavier submodules load on first attribute access (`rlx_mil.reference.evaluate(...)`).
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"rlx_mil.{name}")
    raise AttributeError(f"module 'rlx_mil' has no attribute {name!r}")
