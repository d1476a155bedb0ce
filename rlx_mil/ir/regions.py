"""An ElementwiseRegion spelled back as the plain ops it fuses (spec part 2, section 7.5, the
normative expansion = upstream's `unfuse_elementwise`), and a BatchElementwiseRegion as one such
region per plane concatenated along axis 0 (upstream's `DecomposeFusionRegions`). The reference
evaluates the expansion and the lowering lowers it, so both read a region exactly as they read
its steps."""

from __future__ import annotations

from collections.abc import Sequence

from rlx_mil.errors import ShapeError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import (
    ActivationKind,
    BatchElementwiseRegion,
    BinaryOp,
    ChainSource,
    ChainStep,
    CmpOp,
    ElementwiseRegion,
    RegionPrologue,
)
from rlx_mil.ir.shape import Shape, Static


def expand_region(op: ElementwiseRegion, inputs: Sequence[Shape], declared: Shape) -> Graph:
    """A graph whose Input nodes (in order) are the region's inputs and whose one output is
    the region's value: one plain node per chain step, shapes and dtypes by each op's own
    rule, the last step broadcast (or reshaped) to the declared shape."""
    g = Graph("region")
    operands = [g.input(f"in{i}", list(shape.dims), shape.dtype) for i, shape in enumerate(inputs)]
    g.set_outputs([_emit_chain(g, op.chain, op.prologue, op.prologue_input, operands, declared)])
    return g


def expand_batch_region(op: BatchElementwiseRegion, inputs: Sequence[Shape], declared: Shape) -> Graph:
    """A graph whose Input nodes are the planes and whose one output is the region's value: the
    chain on each plane alone (its `Input(0)`, after the prologue) giving one `declared[0] / n`
    slice of the declared shape, the slices concatenated along axis 0 in input order."""
    n = len(inputs)
    first = declared.dims[0]
    if not isinstance(first, Static) or first.size % n:
        raise ShapeError(f"the declared {declared} does not split into {n} planes along axis 0")
    plane = Shape((Static(first.size // n), *declared.dims[1:]), declared.dtype)
    g = Graph("batch_region")
    planes = [g.input(f"plane{i}", list(shape.dims), shape.dtype) for i, shape in enumerate(inputs)]
    slices = [_emit_chain(g, op.chain, op.prologue, 0, [p], plane) for p in planes]
    g.set_outputs([slices[0] if n == 1 else g.concat(slices, 0)])
    return g


def _emit_chain(g: Graph, chain: Sequence[ChainStep], prologue: RegionPrologue, prologue_input: int,
                operands: list[int], declared: Shape) -> int:
    """The chain's plain nodes in `g` on `operands`; the id of the value in the declared shape."""
    operands = list(operands)
    if prologue is RegionPrologue.RESIZE_NEAREST_2X:
        operands[prologue_input] = g.resize_nearest_2x(operands[prologue_input])
    steps: list[int] = []
    for step in chain:
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
    return result
