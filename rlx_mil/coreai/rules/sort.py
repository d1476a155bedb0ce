"""Sorting: argsort and topk over Core AI's argsort (stable, as MIL's)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.coreai.registry import RuleContext, rule


def _argsort(ctx: RuleContext, x: Any, axis: int, descending: bool) -> Any:
    return ctx.cast(ctx.ops.argsort(x, np.int32(axis), np.bool_(descending), np.bool_(True)), np.int32)


@rule("argsort")
def argsort(ctx: RuleContext) -> Any:
    axis = int(ctx.param("axis", -1)) % ctx.rank("x")
    return _argsort(ctx, ctx.v("x"), axis, not bool(ctx.param("ascending", False)))


@rule("topk")
def topk(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    shape = ctx.in_shape("x")
    axis = int(ctx.param("axis", -1)) % len(shape)
    k = int(ctx.param("k", 1))
    order = _argsort(ctx, x, axis, not bool(ctx.param("ascending", False)))
    stops = list(shape)
    stops[axis] = k
    first = ctx.ops.slice_(order, np.zeros(len(shape), np.int32), np.asarray(stops, np.int32), np.ones(len(shape), np.int32))
    values = ctx.ops.gather_along_axis(x, first, np.int32(axis))
    if len(ctx.op.outputs) == 1:
        return values
    return values, first
