"""Control flow: MIL `cond` as Core AI `if`, MIL `while_loop` as Core AI `while` (the loop's
condition block, then its body); the nested blocks go through the ordinary rules."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.coreai import adapter
from rlx_mil.coreai.registry import RuleContext, rule


def _scalar_bool(ctx: RuleContext, value: Any) -> Any:
    if adapter.dtype_name(value) != "i1":
        value = ctx.ops.broadcasting_not_equal(value, ctx.scalar(0, value))
    return ctx.ops.reshape(value, np.zeros(0, np.int32)) if adapter.shape_of(value) != () else value


def _types(ctx: RuleContext, values: list[Any]) -> list[Any]:
    return [v.type for v in values]


@rule("cond")
def cond(ctx: RuleContext) -> Any:
    pred = _scalar_bool(ctx, ctx.v("pred"))
    true_block, false_block = ctx.op.blocks
    types = [adapter.tensor_type(ctx.out_shape(i), ctx.out_dtype(i)) for i in range(len(ctx.op.outputs))]
    results, then_builder, else_builder = adapter.if_(types, pred)
    for builder, block in ((then_builder, true_block), (else_builder, false_block)):
        with builder:
            outputs = ctx.translator.run_block(block, [])
            ctx.ops.yield_(outputs)
    return tuple(results) if len(results) > 1 else results[0]


@rule("while_loop")
def while_loop(ctx: RuleContext) -> Any:
    inits = ctx.vs("loop_vars")
    cond_block, body_block = ctx.op.blocks
    results, before, after = adapter.while_(_types(ctx, inits), inits)
    with before:
        keep_going = ctx.translator.run_block(cond_block, list(before.arguments))[0]
        ctx.ops.condition(_scalar_bool(ctx, keep_going), *before.arguments)
    with after:
        updated = ctx.translator.run_block(body_block, list(after.arguments))
        ctx.ops.yield_(updated)
    return tuple(results) if len(results) > 1 else results[0]
