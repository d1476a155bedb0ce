"""Reference Conv and Pool over NCHW-style `[N, C, *spatial]` tensors (spec section 11).

Both run on strided window views (no Python loops over positions), for 1, 2 or 3 spatial
dims. Per-dim attribute lists may be empty (stride and dilation 1, padding 0) or hold one
value for every spatial dim.

Pool padding: every padded cell holds the identity of the reduction, so padding never
changes Sum, Max, Min or Prod (Max pads with -inf as upstream; Min with +inf; Prod with 1).
Mean divides the window sum by the full kernel area including padded cells (PyTorch
`count_include_pad=True`, upstream CPU). Max/Min ignore NaN like Reduce.
"""

from __future__ import annotations

import itertools
import math
import string
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir.ops import Conv, Conv3d, ConvTranspose2d, ConvTranspose3d, FusedConvBiasAct, Pool, ReduceOp
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.elementwise import activation
from rlx_mil.reference.registry import as_float, compute_dtype, finish, reference_kernel


def per_dim(values: Sequence[int], count: int, default: int, name: str) -> tuple[int, ...]:
    """An attribute list resolved to one value per spatial dim."""
    if len(values) == 0:
        return (default,) * count
    if len(values) == 1 and count > 1:
        return (values[0],) * count
    if len(values) != count:
        raise AttributeValueError(f"{name} has {len(values)} entries for {count} spatial dims")
    return tuple(values)


def _windows(
    x: np.ndarray, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
    dilation: Sequence[int], pad_value: float,
) -> np.ndarray:
    """`[N, C, *out, *kernel]` view of the padded input's windows."""
    spatial = x.ndim - 2
    for name, vals, low in (("kernel_size", kernel, 1), ("stride", stride, 1), ("dilation", dilation, 1), ("padding", padding, 0)):
        if any(v < low for v in vals):
            raise AttributeValueError(f"{name} {list(vals)} must be >= {low}")
    padded = np.pad(
        x, [(0, 0), (0, 0)] + [(p, p) for p in padding], mode="constant", constant_values=pad_value
    )
    span = [d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=True)]
    for axis, (size, width) in enumerate(zip(padded.shape[2:], span, strict=True)):
        if size < width:
            raise ShapeError(
                f"spatial dim {axis} ({x.shape[2 + axis]} + 2*{padding[axis]} padding) is smaller than the"
                f" dilated kernel extent {width}", operand="x",
            )
    view = sliding_window_view(padded, span, axis=tuple(range(2, 2 + spatial)))
    index = (slice(None), slice(None), *tuple(slice(None, None, s) for s in stride))
    index += tuple(slice(None, None, d) for d in dilation)
    return view[index]


def conv(
    x: np.ndarray, w: np.ndarray, stride: Sequence[int], padding: Sequence[int],
    dilation: Sequence[int], groups: int, kernel_size: Sequence[int] = (),
) -> np.ndarray:
    """Grouped, dilated, zero-padded cross-correlation (PyTorch `convNd` without bias)."""
    if x.ndim < 3 or x.ndim > 5:
        raise ShapeError(f"x must be [N, C, *spatial] with 1-3 spatial dims, got {list(x.shape)}", operand="x")
    if w.ndim != x.ndim:
        raise ShapeError(f"w must be [C_out, C_in/groups, *kernel] of rank {x.ndim}, got {list(w.shape)}", operand="w")
    spatial = x.ndim - 2
    kernel = tuple(w.shape[2:])
    if kernel_size and per_dim(kernel_size, spatial, 1, "kernel_size") != kernel:
        raise ShapeError(f"kernel_size {list(kernel_size)} differs from w's spatial dims {list(kernel)}", operand="w")
    c_in, c_out = x.shape[1], w.shape[0]
    if groups < 1 or c_in % groups != 0 or c_out % groups != 0:
        raise AttributeValueError(f"groups={groups} must divide C_in={c_in} and C_out={c_out}")
    if w.shape[1] * groups != c_in:
        raise ShapeError(f"w dim 1 ({w.shape[1]}) * groups ({groups}) must equal C_in ({c_in})", operand="w")
    dt = compute_dtype(x, w)
    xv, wv = as_float(x, dt), as_float(w, dt)
    windows = _windows(
        xv, kernel, per_dim(stride, spatial, 1, "stride"), per_dim(padding, spatial, 0, "padding"),
        per_dim(dilation, spatial, 1, "dilation"), 0.0,
    )
    n = x.shape[0]
    out_sizes = windows.shape[2 : 2 + spatial]
    grouped_x = windows.reshape((n, groups, c_in // groups, *windows.shape[2:]))
    grouped_w = wv.reshape((groups, c_out // groups, c_in // groups, *kernel))
    letters = string.ascii_lowercase
    out_axes, kernel_axes = letters[:spatial], letters[spatial : 2 * spatial]
    spec = f"NGC{out_axes}{kernel_axes},GOC{kernel_axes}->NGO{out_axes}"
    y = np.einsum(spec, grouped_x, grouped_w, optimize=True)
    return y.reshape((n, c_out, *tuple(out_sizes)))


@reference_kernel(Conv)
def _conv(op: Conv, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    y = conv(inputs[0], inputs[1], op.stride, op.padding, op.dilation, op.groups, op.kernel_size)
    return finish(y, out)


_PAD_VALUE = {
    ReduceOp.MAX: -math.inf, ReduceOp.MIN: math.inf, ReduceOp.SUM: 0.0,
    ReduceOp.MEAN: 0.0, ReduceOp.PROD: 1.0,
}


def pool(
    x: np.ndarray, kind: ReduceOp, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int]
) -> np.ndarray:
    if x.ndim < 3 or x.ndim > 5:
        raise ShapeError(f"x must be [N, C, *spatial] with 1-3 spatial dims, got {list(x.shape)}", operand="x")
    spatial = x.ndim - 2
    if not kernel_size:
        raise AttributeValueError("kernel_size must not be empty")
    kernel = per_dim(kernel_size, spatial, 1, "kernel_size")
    xv = as_float(x, compute_dtype(x))
    windows = _windows(
        xv, kernel, per_dim(stride, spatial, 1, "stride"), per_dim(padding, spatial, 0, "padding"),
        (1,) * spatial, _PAD_VALUE[kind],
    )
    axes = tuple(range(2 + spatial, 2 + 2 * spatial))
    with np.errstate(all="ignore"):
        if kind is ReduceOp.MAX:
            return np.asarray(np.fmax.reduce(windows, axis=axes))
        if kind is ReduceOp.MIN:
            return np.asarray(np.fmin.reduce(windows, axis=axes))
        if kind is ReduceOp.PROD:
            return np.prod(windows, axis=axes)
        total = np.sum(windows, axis=axes)
        if kind is ReduceOp.MEAN:
            return total / xv.dtype.type(math.prod(kernel))
        return total


@reference_kernel(Pool)
def _pool(op: Pool, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(pool(inputs[0], op.kind, op.kernel_size, op.stride, op.padding), out)


# ------------------------------------------------------------------------------ part-2 spec section 5


@reference_kernel(Conv3d)
def _conv3d(op: Conv3d, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    if inputs[0].ndim != 5:
        raise ShapeError(f"x must be [N, C, D, H, W], got {list(inputs[0].shape)}", operand="x")
    return finish(conv(inputs[0], inputs[1], op.stride, op.padding, op.dilation, op.groups), out)


def conv_transpose(
    x: np.ndarray, w: np.ndarray, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
    output_padding: Sequence[int], groups: int,
) -> np.ndarray:
    """PyTorch `conv_transposeNd` (no bias): every input cell scatters `x * w[:, :, tap]` to
    `in * stride + tap * dilation`; the full result is cropped by `padding` at both ends and
    extended by `output_padding` at the end (cells no tap reaches stay zero)."""
    spatial = x.ndim - 2
    if w.ndim != x.ndim or w.shape[0] != x.shape[1]:
        raise ShapeError(f"w must be [C_in={x.shape[1]}, C_out/groups, *kernel], got {list(w.shape)}", operand="w")
    n, c_in = x.shape[:2]
    if groups < 1 or c_in % groups:
        raise AttributeValueError(f"groups={groups} must divide C_in={c_in}")
    attrs = [per_dim(v, spatial, d, name) for v, d, name in (
        (stride, 1, "stride"), (padding, 0, "padding"), (dilation, 1, "dilation"), (output_padding, 0, "output_padding"))]
    strides, pads, dilations, extras = attrs
    dt = compute_dtype(x, w)
    xv, wv = as_float(x, dt), as_float(w, dt)
    kernel, sizes = w.shape[2:], x.shape[2:]
    c_in_g, c_out_g = c_in // groups, w.shape[1]
    full = [(sizes[i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1 + extras[i] for i in range(spatial)]
    result = np.zeros((n, groups * c_out_g, *full), dt)
    for g in range(groups):
        xg = xv[:, g * c_in_g:(g + 1) * c_in_g]
        wg = wv[g * c_in_g:(g + 1) * c_in_g]
        for tap in itertools.product(*(range(k) for k in kernel)):
            tap_index: tuple[Any, ...] = (slice(None), slice(None), *tap)
            contribution = np.moveaxis(np.tensordot(xg, wg[tap_index], axes=([1], [0])), -1, 1)
            reached = (
                slice(tap[i] * dilations[i], tap[i] * dilations[i] + (sizes[i] - 1) * strides[i] + 1, strides[i])
                for i in range(spatial)
            )
            target: tuple[Any, ...] = (slice(None), slice(g * c_out_g, (g + 1) * c_out_g), *reached)
            result[target] += contribution
    crop = (slice(None), slice(None), *(slice(pads[i], full[i] - pads[i]) for i in range(spatial)))
    return result[crop]


@reference_kernel(ConvTranspose2d)
def _conv_transpose2d(op: ConvTranspose2d, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x, w = inputs
    if x.ndim != 4:
        raise ShapeError(f"x must be [N, C, H, W], got {list(x.shape)}", operand="x")
    if op.kernel_size and tuple(op.kernel_size) != tuple(w.shape[2:]):
        raise ShapeError(f"kernel_size {list(op.kernel_size)} differs from w's spatial dims {list(w.shape[2:])}", operand="w")
    y = conv_transpose(x, w, op.stride, op.padding, op.dilation, op.output_padding, op.groups)
    return finish(y, out)


@reference_kernel(ConvTranspose3d)
def _conv_transpose3d(op: ConvTranspose3d, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x, w = inputs
    if x.ndim != 5:
        raise ShapeError(f"x must be [N, C, D, H, W], got {list(x.shape)}", operand="x")
    return finish(conv_transpose(x, w, op.stride, op.padding, op.dilation, op.output_padding, op.groups), out)


@reference_kernel(FusedConvBiasAct)
def _fused_conv_bias_act(op: FusedConvBiasAct, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    y = conv(inputs[0], inputs[1], op.stride, op.padding, op.dilation, op.groups, op.kernel_size)
    c_out = y.shape[1]
    bias = inputs[2]
    if bias.size != c_out:
        raise ShapeError(f"bias must hold C_out = {c_out} values, got shape {list(bias.shape)}", operand="bias")
    y = y + as_float(bias, y.dtype).reshape((1, c_out) + (1,) * (y.ndim - 2))
    if op.has_residual:
        residual = inputs[3]
        if residual.shape != y.shape:
            raise ShapeError(f"residual {list(residual.shape)} must match the conv output {list(y.shape)}", operand="residual")
        y = y + as_float(residual, y.dtype)
    if op.activation is not None:
        y = activation(op.activation, y)
    return finish(y, out)
