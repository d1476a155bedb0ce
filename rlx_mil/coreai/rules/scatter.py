"""Scatters: MIL scatter / scatter_along_axis as Core AI's scatter_along_axis (its modes are
MIL's); scatter_nd over the flattened data, through scatter_along_axis (Core AI's scatter_nd
takes no combining mode)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.coreai import adapter
from rlx_mil.coreai.registry import RuleContext, rule
from rlx_mil.coreai.rules.shape import wrap_indices

_MODES = {"update", "add", "sub", "mul", "div", "max", "min"}


def _mode(ctx: RuleContext) -> str:
    mode = str(ctx.param("mode", "update"))
    if mode not in _MODES:
        raise ctx.fail(f"scatter mode {mode!r} is not supported")
    return mode


@rule("scatter")
def scatter(ctx: RuleContext) -> Any:
    data, updates = ctx.v("data"), ctx.v("updates")
    shape = ctx.in_shape("data")
    axis = int(ctx.param("axis", 0)) % len(shape)
    indices = wrap_indices(ctx, ctx.v("indices"), shape[axis])
    count = ctx.in_shape("indices")[0]
    placed = [1] * len(shape)
    placed[axis] = count
    spread = ctx.ops.broadcast_to(ctx.reshape(indices, placed), np.asarray(ctx.in_shape("updates"), np.uint32))
    return adapter.scatter_along_axis(data, spread, updates, axis, _mode(ctx))


@rule("scatter_along_axis")
def scatter_along_axis(ctx: RuleContext) -> Any:
    shape = ctx.in_shape("data")
    axis = int(ctx.param("axis", 0)) % len(shape)
    indices = wrap_indices(ctx, ctx.v("indices"), shape[axis])
    return adapter.scatter_along_axis(ctx.v("data"), indices, ctx.v("updates"), axis, _mode(ctx))


@rule("scatter_nd")
def scatter_nd(ctx: RuleContext) -> Any:
    """Over the flattened data: each index tuple names a slice of `prod(shape[K:])` elements,
    whose flat positions are scattered along axis 0 with the op's mode."""
    data, updates = ctx.v("data"), ctx.v("updates")
    shape = ctx.in_shape("data")
    index_shape = ctx.in_shape("indices")
    depth = index_shape[-1]
    inner = int(np.prod(shape[depth:], dtype=np.int64))
    strides = np.asarray([int(np.prod(shape[a + 1:depth], dtype=np.int64)) * inner for a in range(depth)], np.int32)
    indices = ctx.cast(ctx.v("indices"), np.int32)
    dims = ctx.constant(np.asarray(shape[:depth], np.int32))
    negative = ctx.ops.broadcasting_greater(ctx.constant(np.int32(0)), indices)
    indices = ctx.ops.broadcasting_where(negative, ctx.ops.broadcasting_add(indices, dims), indices)
    linear = ctx.ops.reduce_sum(ctx.ops.broadcasting_mul(indices, ctx.constant(strides)), np.asarray([len(index_shape) - 1], np.int32))
    count = int(np.prod(index_shape[:-1], dtype=np.int64))
    flat_positions = ctx.ops.broadcasting_add(ctx.reshape(linear, [count, 1]),
                                              ctx.constant(np.arange(inner, dtype=np.int32).reshape(1, inner)))
    total = int(np.prod(shape, dtype=np.int64))
    flat = adapter.scatter_along_axis(ctx.reshape(data, [total]), ctx.reshape(flat_positions, [count * inner]),
                                      ctx.reshape(updates, [count * inner]), 0, _mode(ctx))
    return ctx.reshape(flat, shape)
