"""Reference kernels of KvAppend and Roll (spec part 2, section 1.11)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import ShapeError
from rlx_mil.ir.ops import KvAppend, Roll
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import finish, reference_kernel


@reference_kernel(KvAppend)
def _kv_append(op: KvAppend, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    cache, row = inputs
    if op.pos >= cache.shape[op.axis]:
        raise ShapeError(f"pos {op.pos} is past the cache's capacity {cache.shape[op.axis]}", operand="cache")
    kept = np.take(cache, np.arange(op.pos), axis=op.axis)
    return finish(np.concatenate([kept, row], axis=op.axis), out)


@reference_kernel(Roll)
def _roll(op: Roll, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    for shift, dim in zip(op.shifts, op.dims, strict=True):
        x = np.roll(x, shift, axis=dim)
    return finish(x, out)
