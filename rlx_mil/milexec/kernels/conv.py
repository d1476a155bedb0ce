"""conv, conv_transpose and the pooling ops (1-D to 3-D, NC + spatial layout)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from rlx_mil.milexec.registry import OpContext, kernel


def _pads(
    ctx: OpContext,
    spatial: tuple[int, ...],
    kernel_sizes: list[int],
    strides: list[int],
    dilations: list[int],
) -> list[tuple[int, int]]:
    """(before, after) padding per spatial dim for pad_type valid / same / same_lower / custom."""
    pad_type = str(ctx.param("pad_type", "valid")).lower()
    nd = len(spatial)
    if pad_type == "valid":
        return [(0, 0)] * nd
    if pad_type == "custom":
        pad = ctx.int_list("pad", [0] * 2 * nd)
        return [(pad[2 * i], pad[2 * i + 1]) for i in range(nd)]
    if pad_type in ("same", "same_lower"):
        pads = []
        for size, k, s, d in zip(spatial, kernel_sizes, strides, dilations, strict=True):
            effective = (k - 1) * d + 1
            total = max(0, s * math.ceil(size / s) - size + effective - s)
            small, large = total // 2, total - total // 2
            pads.append((small, large) if pad_type == "same" else (large, small))
        return pads
    raise ctx.error(f"unknown pad_type {pad_type!r}")


def _windows(x: np.ndarray, sizes: list[int], strides: list[int], dilations: list[int]) -> np.ndarray:
    """View [N, C, *out, *kernel] of every (strided, dilated) window of a padded x."""
    nd = len(sizes)
    extents = [(k - 1) * d + 1 for k, d in zip(sizes, dilations, strict=True)]
    view = sliding_window_view(x, extents, axis=tuple(range(2, 2 + nd)))
    picks = (
        [slice(None), slice(None)]
        + [slice(None, None, s) for s in strides]
        + [slice(None, None, d) for d in dilations]
    )
    return view[tuple(picks)]


@kernel("conv")
def conv(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x").astype(np.float32, copy=False)
    weight = ctx.val("weight").astype(np.float32, copy=False)
    nd = x.ndim - 2
    sizes = list(weight.shape[2:])
    strides = ctx.int_list("strides", [1] * nd)
    dilations = ctx.int_list("dilations", [1] * nd)
    groups = int(ctx.param("groups", 1))
    pads = _pads(ctx, x.shape[2:], sizes, strides, dilations)
    padded = np.pad(x, [(0, 0), (0, 0), *pads])
    windows = _windows(padded, sizes, strides, dilations)
    c_in = x.shape[1] // groups
    c_out = weight.shape[0] // groups
    window_axes = [1, *range(2 + nd, 2 + 2 * nd)]
    weight_axes = [1, *range(2, 2 + nd)]
    parts = [
        np.tensordot(
            windows[:, g * c_in : (g + 1) * c_in],
            weight[g * c_out : (g + 1) * c_out],
            axes=(window_axes, weight_axes),
        )
        for g in range(groups)
    ]
    out = np.moveaxis(np.concatenate(parts, axis=-1), -1, 1)
    if ctx.has("bias"):
        out = out + ctx.val("bias").reshape((1, -1) + (1,) * nd)
    return out


@kernel("conv_transpose")
def conv_transpose(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x").astype(np.float32, copy=False)
    weight = ctx.val("weight").astype(np.float32, copy=False)  # [C_in, C_out / groups, *K]
    nd = x.ndim - 2
    sizes = list(weight.shape[2:])
    strides = ctx.int_list("strides", [1] * nd)
    dilations = ctx.int_list("dilations", [1] * nd)
    groups = int(ctx.param("groups", 1))
    n, c_in_total = x.shape[:2]
    c_in = c_in_total // groups
    c_out = weight.shape[1]
    spatial_in = x.shape[2:]
    full = [
        (d - 1) * s + (k - 1) * dl + 1
        for d, s, k, dl in zip(spatial_in, strides, sizes, dilations, strict=True)
    ]
    out = np.zeros((n, c_out * groups, *full), dtype=np.float32)
    for g in range(groups):
        xg = x[:, g * c_in : (g + 1) * c_in]
        wg = weight[g * c_in : (g + 1) * c_in]
        for offset in itertools.product(*(range(k) for k in sizes)):
            tap_index: tuple[Any, ...] = (slice(None), slice(None), *offset)
            tap = wg[tap_index]  # [C_in, C_out]
            contribution = np.moveaxis(np.tensordot(xg, tap, axes=([1], [0])), -1, 1)
            target = tuple(
                slice(o * dl, o * dl + (d - 1) * s + 1, s)
                for o, dl, d, s in zip(offset, dilations, spatial_in, strides, strict=True)
            )
            out_index: tuple[Any, ...] = (slice(None), slice(g * c_out, (g + 1) * c_out), *target)
            out[out_index] += contribution

    pad_type = str(ctx.param("pad_type", "valid")).lower()
    if ctx.has("output_shape") and ctx.param("output_shape") is not None:
        wanted = ctx.int_list("output_shape")[2:]
        befores = ctx.int_list("pad", [0] * 2 * nd)[0::2] if pad_type == "custom" else None
        if befores is None:
            befores = [max(f - w, 0) // 2 for f, w in zip(full, wanted, strict=True)]
    elif pad_type == "same":
        wanted = [d * s for d, s in zip(spatial_in, strides, strict=True)]
        befores = [max(f - w, 0) // 2 for f, w in zip(full, wanted, strict=True)]
    elif pad_type == "custom":
        pad = ctx.int_list("pad", [0] * 2 * nd)
        befores = pad[0::2]
        wanted = [f - pad[2 * i] - pad[2 * i + 1] for i, f in enumerate(full)]
    elif pad_type == "valid":
        befores, wanted = [0] * nd, full
    else:
        raise ctx.error(f"unknown pad_type {pad_type!r}")
    # Crop `befores` at the start, then crop or zero-extend the end to `wanted`.
    result = np.zeros((n, out.shape[1], *wanted), dtype=np.float32)
    source = tuple(slice(b, b + min(w, f - b)) for b, w, f in zip(befores, wanted, full, strict=True))
    dest = tuple(slice(0, min(w, f - b)) for b, w, f in zip(befores, wanted, full, strict=True))
    dest_index: tuple[Any, ...] = (slice(None), slice(None), *dest)
    source_index: tuple[Any, ...] = (slice(None), slice(None), *source)
    result[dest_index] = out[source_index]
    if ctx.has("bias"):
        result = result + ctx.val("bias").reshape((1, -1) + (1,) * nd)
    return result


def _pool_geometry(
    ctx: OpContext, x: np.ndarray
) -> tuple[list[int], list[int], list[tuple[int, int]], list[int]]:
    nd = x.ndim - 2
    sizes = ctx.int_list("kernel_sizes")
    strides = ctx.int_list("strides", [1] * nd)
    pads = _pads(ctx, x.shape[2:], sizes, strides, [1] * nd)
    ceil_mode = bool(ctx.param("ceil_mode", False))
    extra = []
    for size, k, s, (before, after) in zip(x.shape[2:], sizes, strides, pads, strict=True):
        padded = size + before + after
        if ceil_mode:
            out = (padded - k + s - 1) // s + 1
            # The last window must start inside the input or the left padding (PyTorch rule).
            if (out - 1) * s >= size + before and before + after > 0:
                out -= 1
        else:
            out = (padded - k) // s + 1
        extra.append(max(0, (out - 1) * s + k - padded))
    return sizes, strides, pads, extra


def _pad_spatial(
    x: np.ndarray, pads: list[tuple[int, int]], extra: list[int], value: float, extra_value: float
) -> np.ndarray:
    padded = np.pad(x, [(0, 0), (0, 0), *pads], constant_values=value)
    if any(extra):
        padded = np.pad(padded, [(0, 0), (0, 0), *((0, e) for e in extra)], constant_values=extra_value)
    return padded


def _window_reduce_axes(x: np.ndarray) -> tuple[int, ...]:
    nd = x.ndim - 2
    return tuple(range(2 + nd, 2 + 2 * nd))


@kernel("max_pool")
def max_pool(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x").astype(np.float32, copy=False)
    sizes, strides, pads, extra = _pool_geometry(ctx, x)
    padded = _pad_spatial(x, pads, extra, -np.inf, -np.inf)
    windows = _windows(padded, sizes, strides, [1] * len(sizes))
    return np.max(windows, axis=_window_reduce_axes(x))


@kernel("avg_pool")
def avg_pool(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x").astype(np.float32, copy=False)
    sizes, strides, pads, extra = _pool_geometry(ctx, x)
    ones = [1] * len(sizes)
    axes = _window_reduce_axes(x)
    total = np.sum(_windows(_pad_spatial(x, pads, extra, 0, 0), sizes, strides, ones), axis=axes)
    indicator_shape = (1, 1, *x.shape[2:])
    real = np.ones(indicator_shape, dtype=np.float32)
    if ctx.param("exclude_padding_from_average", False):
        counted = _pad_spatial(real, pads, extra, 0, 0)
    else:
        # Explicit padding counts toward the divisor; the ceil_mode overhang does not.
        counted = _pad_spatial(real, pads, extra, 1, 0)
    count = np.sum(_windows(counted, sizes, strides, ones), axis=axes)
    return total / count


@kernel("l2_pool")
def l2_pool(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x").astype(np.float32, copy=False)
    sizes, strides, pads, extra = _pool_geometry(ctx, x)
    padded = _pad_spatial(x * x, pads, extra, 0, 0)
    windows = _windows(padded, sizes, strides, [1] * len(sizes))
    return np.sqrt(np.sum(windows, axis=_window_reduce_axes(x)))
