"""Convolutions and pooling: the padding is an explicit Core AI pad first (Core AI's conv and
pool ops take none); 1-D and 3-D convolutions go through conv2d / conv3d."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.coreai import adapter
from rlx_mil.coreai.registry import RuleContext, rule


def _spatial_pads(ctx: RuleContext, spatial: list[int], kernel: list[int], strides: list[int],
                  dilations: list[int]) -> list[int]:
    """[begin_0, end_0, begin_1, end_1, ...] of the spatial axes, from MIL's pad_type."""
    pad_type = str(ctx.param("pad_type", "valid"))
    n = len(spatial)
    if pad_type == "valid":
        return [0] * (2 * n)
    if pad_type == "custom":
        pads = ctx.ints("pad", [0] * (2 * n))
        return pads
    out = []
    for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        out += [large, small] if pad_type == "same_lower" else [small, large]
    return out


def _pad(ctx: RuleContext, x: Any, spatial_pads: list[int], value: float = 0.0) -> Any:
    if not any(spatial_pads):
        return x
    full = [0, 0, 0, 0, *spatial_pads]
    return ctx.ops.pad(x, np.asarray(full, np.uint32), ctx.scalar(value, x), "constant")


@rule("conv")
def conv(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    shape = ctx.in_shape("x")
    n = len(shape) - 2
    if n not in (1, 2, 3):
        raise ctx.fail(f"a {n}-D convolution is not supported")
    weight = ctx.v("weight")
    kernel = list(adapter.shape_of(weight)[2:])
    strides = ctx.ints("strides", [1] * n)
    dilations = ctx.ints("dilations", [1] * n)
    groups = int(ctx.param("groups", 1))
    x = _pad(ctx, x, _spatial_pads(ctx, list(shape[2:]), kernel, strides, dilations))
    if n == 1:
        x = ctx.reshape(x, [*adapter.shape_of(x)[:2], 1, adapter.shape_of(x)[2]])
        weight = ctx.reshape(weight, [*adapter.shape_of(weight)[:2], 1, kernel[0]])
        strides, dilations = [1, strides[0]], [1, dilations[0]]
    make = ctx.ops.conv3d if n == 3 else ctx.ops.conv2d
    y = make(x, weight, np.asarray(strides, np.int32), np.asarray(dilations, np.int32), np.int32(groups))
    y = ctx.reshape(y, ctx.out_shape())
    if ctx.has("bias"):
        bias = ctx.reshape(ctx.v("bias"), [1, ctx.out_shape()[1]] + [1] * n)
        y = ctx.ops.broadcasting_add(y, bias)
    return y


@rule("conv_transpose")
def conv_transpose(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    shape = ctx.in_shape("x")
    n = len(shape) - 2
    if n not in (2, 3):
        raise ctx.fail(f"a {n}-D transposed convolution is not supported")
    weight = ctx.v("weight")
    strides = ctx.ints("strides", [1] * n)
    dilations = ctx.ints("dilations", [1] * n)
    groups = int(ctx.param("groups", 1))
    make = ctx.ops.conv_transpose3d if n == 3 else ctx.ops.conv_transpose2d
    # The full (unpadded) result, then MIL's padding cut off and the output shape reached.
    y = make(x, weight, np.asarray(strides, np.uint32), np.zeros(n, np.uint32), np.asarray(dilations, np.uint32),
             np.zeros(n, np.uint32), np.uint32(groups))
    full = adapter.shape_of(y)
    pads = ctx.ints("pad", [0] * (2 * n)) if str(ctx.param("pad_type", "valid")) == "custom" else [0] * (2 * n)
    out = ctx.out_shape()
    starts = [0, 0] + [pads[2 * i] for i in range(n)]
    stops = list(full[:2]) + [min(full[2 + i], pads[2 * i] + out[2 + i]) for i in range(n)]
    y = ctx.ops.slice_(y, np.asarray(starts, np.int32), np.asarray(stops, np.int32), np.ones(n + 2, np.int32))
    short = [out[2 + i] - (stops[2 + i] - starts[2 + i]) for i in range(n)]
    if any(short):
        y = ctx.ops.pad(y, np.asarray([0, 0, 0, 0, *[v for s in short for v in (0, s)]], np.uint32),
                        ctx.scalar(0, y), "constant")
    if ctx.has("bias"):
        y = ctx.ops.broadcasting_add(y, ctx.reshape(ctx.v("bias"), [1, out[1]] + [1] * n))
    return y


@rule("max_pool", "avg_pool")
def pool(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    shape = ctx.in_shape("x")
    n = len(shape) - 2
    if n != 2:
        raise ctx.fail(f"a {n}-D pool is not supported")
    kernel = ctx.ints("kernel_sizes")
    strides = ctx.ints("strides", [1] * n)
    pads = _spatial_pads(ctx, list(shape[2:]), kernel, strides, [1] * n)
    ceil_mode = bool(ctx.param("ceil_mode", False))
    if ctx.op_type == "max_pool":
        padded = _pad(ctx, x, pads, -3.0e38)
        return adapter.maxpool2d(padded, ctx.out_shape(), kernel, strides, ceil_mode)
    if ceil_mode:
        raise ctx.fail("avg_pool with ceil_mode is not supported")
    padded = _pad(ctx, x, pads)
    total = ctx.ops.sumpool2d(padded, np.asarray(kernel, np.int32), np.asarray(strides, np.int32), np.ones(2, np.int32))
    if ctx.param("exclude_padding_from_average", False) and any(pads):
        ones = ctx.constant(np.ones((1, 1, *shape[2:]), adapter_float(ctx)))
        counts = ctx.ops.sumpool2d(_pad(ctx, ones, pads), np.asarray(kernel, np.int32), np.asarray(strides, np.int32),
                                   np.ones(2, np.int32))
        return ctx.ops.broadcasting_divide(total, counts)
    return ctx.ops.broadcasting_mul(total, ctx.scalar(1.0 / float(np.prod(kernel)), total))


def adapter_float(ctx: RuleContext) -> np.dtype:
    return ctx.out_dtype()


@rule("upsample_nearest_neighbor")
def upsample_nearest_neighbor(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    n, c, h, w = ctx.in_shape("x")
    out = ctx.out_shape()
    rows = (np.arange(out[2]) * h // out[2]).astype(np.int32)
    cols = (np.arange(out[3]) * w // out[3]).astype(np.int32)
    y = ctx.ops.gather_along_axis(x, ctx.constant(np.ascontiguousarray(np.broadcast_to(rows[None, None, :, None],
                                                                                        (n, c, out[2], w)))),
                                  np.int32(2))
    return ctx.ops.gather_along_axis(y, ctx.constant(np.ascontiguousarray(np.broadcast_to(cols[None, None, None, :],
                                                                                           (n, c, out[2], out[3])))),
                                     np.int32(3))
