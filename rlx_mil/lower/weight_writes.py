"""Writing float weights into the package without coremltools' extra copies.

coremltools serialises every fp16 const through `val.flatten().tobytes()` (two full copies of
the array, then a view of them) and every fp32 const through `val.flatten()`: for a 1B-parameter
model that is seconds of copying and, for the largest weight, twice its size in transient
memory. A C-contiguous array's flat view holds exactly those bytes, so while `direct_weight_writes`
is active the fp16/fp32 consts are handed to the blob writer as that view; every other value
goes through coremltools' own function unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np


def _writer(original: Any) -> Any:
    from coremltools.converters.mil.mil import types

    def write(output_var: Any, blob_writer: Any) -> Any:
        val = output_var.val
        if isinstance(val, np.ndarray) and val.flags.c_contiguous:
            if output_var.dtype == types.fp16 and val.dtype == np.float16:
                return blob_writer.write_fp16_data(val.reshape(-1).view(np.uint16))
            if output_var.dtype == types.fp32 and val.dtype == np.float32:
                return blob_writer.write_float_data(val.reshape(-1))
        return original(output_var, blob_writer)

    write.rlx_mil_direct = True  # type: ignore[attr-defined]
    return write


@contextmanager
def direct_weight_writes() -> Iterator[None]:
    from coremltools.converters.mil.backend.mil import helper

    original = helper._get_offset_by_writing_data
    if getattr(original, "rlx_mil_direct", False):  # a conversion already installed it
        yield
        return
    helper._get_offset_by_writing_data = _writer(original)
    try:
        yield
    finally:
        helper._get_offset_by_writing_data = original
