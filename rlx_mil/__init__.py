"""rlx_mil: RLX IR graphs to Apple Core ML ML Programs through the coremltools MIL Builder."""

from __future__ import annotations

import logging as _logging
import os as _os
from typing import Any

# coremltools prints Linux-only proxy warnings and tqdm bars; keep the library quiet unless
# the user configured logging themselves.
_os.environ.setdefault("TQDM_DISABLE", "1")
if _logging.getLogger("coremltools").level == _logging.NOTSET:
    _logging.getLogger("coremltools").setLevel(_logging.ERROR)

from rlx_mil import errors
from rlx_mil.ir import DType, Graph, MaskKind, QuantScheme, Shape

__version__ = "0.1.0"

__all__ = ["DType", "Graph", "MaskKind", "QuantScheme", "Shape", "__version__", "convert", "errors", "lower", "save"]

# Conversion pulls in coremltools (slow to import); load it on first use.
_LAZY = {"convert": "rlx_mil.lower.api", "lower": "rlx_mil.lower.api", "save": "rlx_mil.lower.api"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rlx_mil' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
