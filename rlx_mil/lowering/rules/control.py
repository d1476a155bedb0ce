"""Control flow and regions (spec part 2, section 7): If as MIL `cond`, While and Scan as MIL
`while_loop` (an int32 step counter among the loop vars, so the program size does not grow with
the iteration count), ElementwiseRegion expanded back into its plain element-wise ops. Bodies
are lowered by the ordinary rules into the MIL block, their Input nodes bound positionally."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlx_mil.errors import GraphError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops.control import body_inputs
from rlx_mil.ir.regions import expand_batch_region, expand_region
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.rules.elementwise import to_bool

#: MIL loop counters are int32.
_MAX_STEPS = (1 << 31) - 1


def _body(ctx: LowerContext, value: object, role: str) -> Graph:
    if not isinstance(value, Graph):
        raise ctx.error(f"{role} must be an rlx_mil Graph, got {type(value).__name__}")
    return value


def _shaped(ctx: LowerContext, var: Any, sizes: Sequence[int], suffix: str) -> Any:
    """`var` reshaped to `sizes` when it holds the same elements in another shape."""
    from coremltools.converters.mil import Builder as mb

    if tuple(int(d) for d in var.shape) == tuple(sizes):
        return var
    return mb.reshape(x=var, shape=np.asarray(list(sizes), np.int32), name=ctx.name(suffix))


def _run_body(ctx: LowerContext, body: Graph, operands: Sequence[Any], role: str) -> list[Any]:
    """Lower `body` on `operands` (each reshaped to the Input it binds to) into the current block."""
    bound = [_shaped(ctx, var, node.shape.sizes(), f"{role}_in{i}") for i, (node, var) in
             enumerate(zip(body_inputs(body), operands, strict=True))]
    return ctx.lower_body(body, bound, role)


def _in_block(ctx: LowerContext, var: Any, sizes: Sequence[int], suffix: str) -> Any:
    """A block result of shape `sizes` produced inside the block (an identity when the body
    hands an outer value straight through)."""
    from coremltools.converters.mil import Builder as mb

    shaped = _shaped(ctx, var, sizes, suffix)
    return mb.identity(x=shaped, name=ctx.name(suffix)) if shaped is var else shaped


def _scalar_flag(ctx: LowerContext, var: Any, dtype: DType, suffix: str) -> Any:
    flag = to_bool(ctx, var, dtype, f"{suffix}_bool")
    return _shaped(ctx, flag, (), f"{suffix}_scalar")


@lowering(
    notes=(
        "A one-element pred: MIL `cond` with both branches lowered into its blocks (captures read from"
        " the enclosing block). An element-wise pred: both branches inline + `select`."
    ),
)
def lower_if(op: ops.If, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    then_branch, else_branch = _body(ctx, op.then_branch, "then_branch"), _body(ctx, op.else_branch, "else_branch")
    out = ctx.out_shape.sizes()
    captures = [ctx.var(i) for i in range(1, ctx.num_inputs)]
    pred_shape = ctx.input_shape(0)
    if pred_shape.numel() != 1:
        then_value = _shaped(ctx, _run_body(ctx, then_branch, captures, "then")[0], out, "then_out")
        else_value = _shaped(ctx, _run_body(ctx, else_branch, captures, "else")[0], out, "else_out")
        pred = to_bool(ctx, ctx.var(0), pred_shape.dtype, "pred_bool")
        return mb.select(cond=pred, a=then_value, b=else_value, name=ctx.name())
    pred = _scalar_flag(ctx, ctx.var(0), pred_shape.dtype, "pred")

    def branch(body: Graph, role: str) -> Any:
        return lambda: _in_block(ctx, _run_body(ctx, body, captures, role)[0], out, f"{role}_out")

    return mb.cond(pred=pred, _true_fn=branch(then_branch, "then"), _false_fn=branch(else_branch, "else"),
                   name=ctx.name())


def _steps(ctx: LowerContext, count: int, what: str) -> Any:
    if count > _MAX_STEPS:
        raise ctx.unsupported(f"{what} {count} exceeds the int32 loop counter of MIL `while_loop`")
    return np.int32(count)


@lowering(
    notes=(
        "MIL `while_loop` over (step, carried...): condition `step < max_iterations and cond(c)`, body"
        " `(step + 1, body(c))`; the result is the first carried value. Program size is independent of"
        " max_iterations."
    ),
)
def lower_while(op: ops.While, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    cond, body = _body(ctx, op.cond, "cond"), _body(ctx, op.body, "body")
    assert op.max_iterations is not None  # the shape rule refuses an unbounded loop
    limit = _steps(ctx, op.max_iterations, "max_iterations")
    carried = ctx.vars()
    if limit == 0 or not carried:
        return carried[0] if carried else ctx.error("a While without carried values has no result")
    sizes = [ctx.input_shape(i).sizes() for i in range(ctx.num_inputs)]
    flag_dtype = cond.node(cond.outputs[0]).shape.dtype

    def condition(step: Any, *values: Any) -> Any:
        flag = _scalar_flag(ctx, _run_body(ctx, cond, values, "cond")[0], flag_dtype, "cond_flag")
        in_budget = mb.less(x=step, y=limit, name=ctx.name("in_budget"))
        return mb.logical_and(x=in_budget, y=flag, name=ctx.name("go_on"))

    def step_body(step: Any, *values: Any) -> tuple[Any, ...]:
        nxt = _run_body(ctx, body, values, "body")
        shaped = [_in_block(ctx, v, s, f"next{i}") for i, (v, s) in enumerate(zip(nxt, sizes, strict=True))]
        return (mb.add(x=step, y=np.int32(1), name=ctx.name("next_step")), *shaped)

    start = mb.const(val=np.int32(0), name=ctx.name("step0"))
    results = mb.while_loop(_cond=condition, _body=step_body, loop_vars=(start, *carried), name=ctx.name())
    return results[1]


def _zeros(ctx: LowerContext, sizes: tuple[int, ...], dtype: DType) -> Any:
    if dtype is DType.BOOL:
        raise ctx.unsupported("a Bool trajectory has no MIL scatter; save_trajectory needs a numeric carry")
    np_dtype = ctx.float_dtype if dtype.is_float else np.int32
    return ctx.const(np.zeros(sizes, np_dtype), "trajectory0")


@lowering(
    notes=(
        "MIL `while_loop` over (t, carry[, trajectory]) for `length` steps: row t of each xs by `gather`,"
        " bcast operands read from the enclosing block, the body lowered into the loop block; with"
        " save_trajectory each carry is written into row t by `scatter` (mode update). Program size is"
        " independent of length. length = 0 returns init (an empty trajectory is refused: Core ML has no"
        " zero-size tensors)."
    ),
)
def lower_scan(op: ops.Scan, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    body = _body(ctx, op.body, "body")
    length = _steps(ctx, op.length, "length")
    carry_shape = ctx.input_shape(0)
    carry_sizes = carry_shape.sizes()
    init = ctx.var(0)
    if length == 0:
        if op.save_trajectory:
            raise ctx.unsupported("an empty trajectory (length = 0) is a zero-size tensor Core ML cannot hold")
        return init
    bcast = [ctx.var(1 + i) for i in range(op.num_bcast)]
    xs = [ctx.var(1 + op.num_bcast + i) for i in range(op.num_xs)]

    def condition(t: Any, *state: Any) -> Any:
        return mb.less(x=t, y=length, name=ctx.name("in_range"))

    def step_body(t: Any, *state: Any) -> tuple[Any, ...]:
        rows = [mb.gather(x=x, indices=t, axis=0, name=ctx.name(f"xs{i}_row")) for i, x in enumerate(xs)]
        nxt = _in_block(ctx, _run_body(ctx, body, [state[0], *bcast, *rows], "body")[0], carry_sizes, "next")
        done = [mb.add(x=t, y=np.int32(1), name=ctx.name("next_t")), nxt]
        if op.save_trajectory:
            row = mb.expand_dims(x=nxt, axes=[0], name=ctx.name("row"))
            at = mb.reshape(x=t, shape=np.asarray([1], np.int32), name=ctx.name("row_index"))
            done.append(mb.scatter(data=state[1], indices=at, updates=row, axis=0, mode="update",
                                   name=ctx.name("trajectory")))
        return tuple(done)

    start = mb.const(val=np.int32(0), name=ctx.name("t0"))
    loop_vars = [start, init]
    if op.save_trajectory:
        loop_vars.append(_zeros(ctx, (length, *carry_sizes), carry_shape.dtype))
    results = mb.while_loop(_cond=condition, _body=step_body, loop_vars=tuple(loop_vars), name=ctx.name())
    return results[2] if op.save_trajectory else results[1]


@lowering(
    notes=(
        "Expanded back into its steps (Activation / Cast / Binary / Compare / Where, a ResizeNearest2x"
        " prologue on prologue_input), each lowered by its own rule and rounded to its declared type;"
        " input_modulus / scalar_input_mask are hints and are not read."
    ),
)
def lower_elementwise_region(op: ops.ElementwiseRegion, ctx: LowerContext) -> Any:
    shapes = [ctx.input_shape(i) for i in range(ctx.num_inputs)]
    try:
        expanded = expand_region(op, shapes, ctx.out_shape)
    except GraphError as err:
        raise ctx.fail(ShapeError, f"the region does not expand: {err.detail}") from None
    return ctx.lower_body(expanded, ctx.vars(), "region")[0]


@lowering(
    notes=(
        "Expanded as upstream's DecomposeFusionRegions does: the chain on each plane alone (its"
        " Input(0), after a ResizeNearest2x prologue), each step lowered by its own rule, the planes'"
        " results joined by one `concat` on axis 0; input_modulus / scalar_input_mask are not read."
    ),
)
def lower_batch_elementwise_region(op: ops.BatchElementwiseRegion, ctx: LowerContext) -> Any:
    shapes = [ctx.input_shape(i) for i in range(ctx.num_inputs)]
    try:
        expanded = expand_batch_region(op, shapes, ctx.out_shape)
    except GraphError as err:
        raise ctx.fail(ShapeError, f"the region does not expand: {err.detail}") from None
    return ctx.lower_body(expanded, ctx.vars(), "batch_region")[0]


@lowering(notes="`fwd_body` lowered inline on the inputs (its first output); vjp_body / jvp_body are not read.")
def lower_custom_fn(op: ops.CustomFn, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    out = ctx.lower_body(_body(ctx, op.fwd_body, "fwd_body"), ctx.vars(), "fwd")[0]
    return mb.identity(x=out, name=ctx.name())


@lowering(notes="one `upsample_nearest_neighbor` (2 x 2) per step, on the region input or earlier step it names.")
def lower_transform_region(op: ops.TransformRegion, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    done: list[Any] = []
    for i, operand in enumerate(op.steps):
        src = ctx.var(operand.index) if operand.source is ops.ChainSource.INPUT else done[operand.index]
        done.append(mb.upsample_nearest_neighbor(x=src, scale_factor_height=2, scale_factor_width=2,
                                                 name=ctx.name(f"step{i}")))
    return done[-1]
