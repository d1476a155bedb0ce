"""Walking a MIL program's blocks: shared by the lowering (which checks what its rules built)
and the MIL executor (which checks what it is asked to run)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from coremltools.converters.mil.mil import Block, Operation, Var


def iter_ops(block: Block) -> Iterator[Operation]:
    """Every op of `block` and of its nested blocks, depth first."""
    for op in block.operations:
        yield op
        for inner in op.blocks:
            yield from iter_ops(inner)


def oversized_outputs(block: Block, limit: int) -> Iterator[tuple[Operation, Var, int]]:
    """(op, output var, element count) for every statically shaped output of an op in `block`
    (nested blocks included) holding more than `limit` elements."""
    for op in iter_ops(block):
        for var in op.outputs:
            shape = getattr(var, "shape", None)
            if not shape or not all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape):
                continue
            count = 1
            for dim in shape:
                count *= int(dim)
            if count > limit:
                yield op, var, count
