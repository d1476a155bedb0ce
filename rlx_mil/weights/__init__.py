"""Weights files: `.safetensors` and `.npz`, opened lazily and read as untrusted input.

`open_safetensors` / `open_npz` validate a container's metadata in full when it is opened
(typed errors naming the file and tensor) and return a :class:`LazyTensors` Mapping that
reads each tensor only when it is accessed; BF16 arrives as `ml_dtypes.bfloat16`.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlx_mil.errors import WeightsFormatError
from rlx_mil.weights.base import MAX_RANK, LazyTensors, TensorHeader
from rlx_mil.weights.npz_file import NpzFile, open_npz
from rlx_mil.weights.safetensors_file import (
    MAX_HEADER_BYTES,
    SafetensorsFile,
    open_safetensors,
    read_safetensors_header,
    save_safetensors,
)

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_RANK",
    "LazyTensors",
    "NpzFile",
    "SafetensorsFile",
    "TensorHeader",
    "WeightsFormatError",
    "load_params",
    "open_arrays",
    "open_npz",
    "open_safetensors",
    "read_safetensors_header",
    "save_safetensors",
]

def open_arrays(path: str | os.PathLike[str], what: str = "weights file") -> LazyTensors:
    """A lazy mapping of the arrays in a `.npz` or `.safetensors` file (chosen by suffix)."""
    p = Path(path)
    if p.suffix == ".safetensors":
        return open_safetensors(p)
    if p.suffix == ".npz":
        return open_npz(p, what)
    raise WeightsFormatError(f"{p}: unknown {what} format {p.suffix or '(no suffix)'!r} (use .npz or .safetensors)")


def load_params(path: str | os.PathLike[str]) -> LazyTensors:
    """Weights by name from a `.npz` or `.safetensors` file, as a lazy read-only mapping."""
    return open_arrays(path, "weights file")
