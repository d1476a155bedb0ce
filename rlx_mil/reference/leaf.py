"""Reference kernel of the Constant leaf (Input and Param are bound by the evaluator)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import AttributeValueError, DTypeError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.ops import (
    Constant,
)
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import (
    reference_kernel,
    static_sizes,
)


@reference_kernel(Constant)
def _constant(op: Constant, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    sizes = static_sizes(out, "Constant")
    numel = math.prod(sizes)
    dtype = out.dtype
    if dtype.is_complex:
        raise DTypeError(f"{dtype.value} constants are outside the rlx_mil IR subset")
    want = numel * dtype.itemsize
    if len(op.data) != want:
        raise AttributeValueError(
            f"data holds {len(op.data)} bytes, but {numel} {dtype.value} values need {want}", operand="data"
        )
    raw = np.frombuffer(op.data, dtype=np.uint8)
    if dtype is DType.BF16:
        halves = raw.view("<u2").astype(np.uint32) << 16
        values = halves.view(np.float32)
    elif dtype is DType.BOOL:
        values = raw != 0
    else:
        values = raw.view(dtype.numpy.newbyteorder("<")).astype(dtype.numpy)
    return values.reshape(sizes).copy()
