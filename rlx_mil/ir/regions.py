"""An ElementwiseRegion spelled back as the plain ops it fuses (spec part 2, section 7.5, the
normative expansion = upstream's `unfuse_elementwise`). The reference evaluates the expansion
and the lowering lowers it, so both read a region exactly as they read its steps."""

from __future__ import annotations

from collections.abc import Sequence

from rlx_mil.errors import ShapeError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import (
    ActivationKind,
    BinaryOp,
    ChainSource,
    CmpOp,
    ElementwiseRegion,
    RegionPrologue,
)
from rlx_mil.ir.shape import Shape


def expand_region(op: ElementwiseRegion, inputs: Sequence[Shape], declared: Shape) -> Graph:
    """A graph whose Input nodes (in order) are the region's inputs and whose one output is
    the region's value: one plain node per chain step, shapes and dtypes by each op's own
    rule, the last step broadcast (or reshaped) to the declared shape."""
    g = Graph("region")
    operands = [g.input(f"in{i}", list(shape.dims), shape.dtype) for i, shape in enumerate(inputs)]
    if op.prologue is RegionPrologue.RESIZE_NEAREST_2X:
        operands[op.prologue_input] = g.resize_nearest_2x(operands[op.prologue_input])
    steps: list[int] = []
    for step in op.chain:
        args = [operands[o.index] if o.source is ChainSource.INPUT else steps[o.index] for o in step.operands]
        if step.kind == "Activation":
            assert isinstance(step.attr, ActivationKind)
            steps.append(g.activation(step.attr, args[0]))
        elif step.kind == "Cast":
            assert isinstance(step.attr, DType)
            steps.append(g.cast(args[0], step.attr))
        elif step.kind == "Binary":
            assert isinstance(step.attr, BinaryOp)
            steps.append(g.binary(step.attr, args[0], args[1]))
        elif step.kind == "Compare":
            assert isinstance(step.attr, CmpOp)
            steps.append(g.compare(step.attr, args[0], args[1]))
        else:
            steps.append(g.where_(args[0], args[1], args[2]))
    result = steps[-1]
    got = g.node(result).shape
    if got.dtype is not declared.dtype:
        raise ShapeError(f"the chain ends in a {got.dtype.value} value but the region declares {declared}")
    if got.dims != declared.dims:
        if got.is_static and declared.is_static and got.numel() == declared.numel():
            result = g.reshape(result, list(declared.sizes()))
        else:
            try:
                result = g.expand(result, list(declared.sizes()))
            except ShapeError:
                raise ShapeError(f"the chain computes {got}, which does not broadcast to the declared {declared}") from None
    g.set_outputs([result])
    return g
