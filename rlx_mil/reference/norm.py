"""Reference kernels of the normalisations.

Each has a plain array function (`layer_norm`, `rms_norm`, `group_norm`) the fused kernels reuse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir.ops import (
    AdaLayerNorm,
    AdaNormKind,
    BatchNormInference,
    BinaryOp,
    FusedResidualLN,
    FusedResidualRmsNorm,
    GatedResidual,
    GroupNorm,
    LayerNorm,
    LayerNorm2d,
    RmsNorm,
)
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.elementwise import binary
from rlx_mil.reference.linalg import bias_vector
from rlx_mil.reference.registry import (
    as_vector,
    broadcast_sizes,
    finish,
    float_operands,
    reference_kernel,
    sizes_of,
)


def _last_axis_only(axis: int, rank: int) -> None:
    if axis not in (-1, rank - 1):
        raise AttributeValueError(f"normalization runs over the last axis; axis must be -1 or {rank - 1}, got {axis}")


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """Two-pass LayerNorm over the last axis (spec 6.1)."""
    (v,) = float_operands(x)
    h = v.shape[-1]
    g = as_vector(gamma, h, "gamma", v.dtype)
    b = as_vector(beta, h, "beta", v.dtype)
    dt = v.dtype.type
    mean = v.mean(axis=-1, keepdims=True)
    centred = v - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        return centred / np.sqrt(var + dt(eps)) * g + b


def rms_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """RmsNorm over the last axis with the beta add (spec 6.2)."""
    (v,) = float_operands(x)
    h = v.shape[-1]
    g = as_vector(gamma, h, "gamma", v.dtype)
    b = as_vector(beta, h, "beta", v.dtype)
    dt = v.dtype.type
    mean_sq = (v * v).mean(axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        return v / np.sqrt(mean_sq + dt(eps)) * g + b


def group_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, num_groups: int, eps: float) -> np.ndarray:
    """GroupNorm over contiguous channel blocks of `[N, C, *spatial]` (spec 6.3)."""
    if x.ndim < 2:
        raise ShapeError(f"x must be [N, C, ...], got {list(x.shape)}", operand="x")
    n, c = x.shape[:2]
    if num_groups < 1 or c % num_groups != 0:
        raise AttributeValueError(f"num_groups={num_groups} must divide the {c} channels")
    (v,) = float_operands(x)
    g = as_vector(gamma, c, "gamma", v.dtype)
    b = as_vector(beta, c, "beta", v.dtype)
    dt = v.dtype.type
    grouped = v.reshape(n, num_groups, -1)
    mean = grouped.mean(axis=-1, keepdims=True)
    centred = grouped - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        normed = (centred / np.sqrt(var + dt(eps))).reshape(v.shape)
    affine_shape = (1, c) + (1,) * (x.ndim - 2)
    return normed * g.reshape(affine_shape) + b.reshape(affine_shape)


def _matching_rows(y: np.ndarray, out: Shape) -> np.ndarray:
    """RmsNorm may be declared leading-flattened `[prod(leading), H]` (spec 6.2)."""
    sizes = sizes_of(out)
    if None not in sizes and tuple(sizes) != y.shape and math.prod(s or 0 for s in sizes) == y.size:
        if sizes and sizes[-1] == y.shape[-1]:
            return y.reshape(tuple(s or 0 for s in sizes))
    return y


@reference_kernel(LayerNorm)
def _layer_norm(op: LayerNorm, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    _last_axis_only(op.axis, inputs[0].ndim)
    return finish(layer_norm(inputs[0], inputs[1], inputs[2], op.eps), out)


@reference_kernel(RmsNorm)
def _rms_norm(op: RmsNorm, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    _last_axis_only(op.axis, inputs[0].ndim)
    return finish(_matching_rows(rms_norm(inputs[0], inputs[1], inputs[2], op.eps), out), out)


@reference_kernel(GroupNorm)
def _group_norm(op: GroupNorm, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(group_norm(inputs[0], inputs[1], inputs[2], op.num_groups, op.eps), out)


def _residual_sum(inputs: Sequence[np.ndarray], has_bias: bool) -> np.ndarray:
    x, residual = inputs[0], inputs[1]
    if x.shape != residual.shape:
        broadcast_sizes([x.shape, residual.shape], ["x", "residual"])
    total = binary(BinaryOp.ADD, x, residual)
    if has_bias:
        total = total + bias_vector(inputs[2], total.shape[-1], total.dtype)
    return total


@reference_kernel(FusedResidualLN)
def _fused_residual_ln(op: FusedResidualLN, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    total = _residual_sum(inputs, op.has_bias)
    return finish(layer_norm(total, inputs[-2], inputs[-1], op.eps), out)


@reference_kernel(FusedResidualRmsNorm)
def _fused_residual_rms_norm(op: FusedResidualRmsNorm, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    total = _residual_sum(inputs, op.has_bias)
    return finish(_matching_rows(rms_norm(total, inputs[-2], inputs[-1], op.eps), out), out)


# ------------------------------------------------------------------------------ part-2 spec section 5


@reference_kernel(BatchNormInference)
def _batch_norm_inference(op: BatchNormInference, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    """Channel = the LAST axis of x (upstream's rule, part-2 spec 9 Q29)."""
    (v,) = float_operands(inputs[0])
    if v.ndim < 1:
        raise ShapeError("x must have rank >= 1 (its last axis is the channel)", operand="x")
    c = v.shape[-1]
    gamma, beta, mean, var = (
        as_vector(a, c, name, v.dtype)
        for a, name in zip(inputs[1:], ("gamma", "beta", "running_mean", "running_var"), strict=True)
    )
    with np.errstate(all="ignore"):
        return finish((v - mean) / np.sqrt(var + v.dtype.type(op.eps)) * gamma + beta, out)


@reference_kernel(LayerNorm2d)
def _layer_norm_2d(op: LayerNorm2d, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    """Two-pass LayerNorm across C of `[N, C, H, W]` at each spatial position."""
    (v,) = float_operands(inputs[0])
    if v.ndim != 4:
        raise ShapeError(f"x must be [N, C, H, W], got {list(v.shape)}", operand="x")
    c = v.shape[1]
    gamma = as_vector(inputs[1], c, "gamma", v.dtype).reshape(1, c, 1, 1)
    beta = as_vector(inputs[2], c, "beta", v.dtype).reshape(1, c, 1, 1)
    mean = v.mean(axis=1, keepdims=True)
    centred = v - mean
    var = (centred * centred).mean(axis=1, keepdims=True)
    with np.errstate(all="ignore"):
        return finish(centred / np.sqrt(var + v.dtype.type(op.eps)) * gamma + beta, out)


def _fits(small: tuple[int, ...], target: tuple[int, ...], operand: str) -> None:
    if broadcast_sizes([target, small], ["x", operand]) != target:
        raise ShapeError(f"{operand} {list(small)} must broadcast to x {list(target)}", operand=operand)


@reference_kernel(AdaLayerNorm)
def _ada_layer_norm(op: AdaLayerNorm, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    """`n * (1 + scale) + shift`, n the affine-free LayerNorm or RmsNorm of the last axis."""
    v, scale, shift = float_operands(*inputs)
    if v.ndim < 1:
        raise ShapeError("x must have rank >= 1", operand="x")
    _fits(scale.shape, v.shape, "scale")
    _fits(shift.shape, v.shape, "shift")
    dt = v.dtype.type
    with np.errstate(all="ignore"):
        if op.norm is AdaNormKind.LAYER_NORM:
            centred = v - v.mean(axis=-1, keepdims=True)
            normed = centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + dt(op.eps))
        else:
            normed = v / np.sqrt((v * v).mean(axis=-1, keepdims=True) + dt(op.eps))
        return finish(normed * (dt(1) + scale) + shift, out)


@reference_kernel(GatedResidual)
def _gated_residual(op: GatedResidual, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x, y, gate = float_operands(*inputs)
    if y.shape != x.shape:
        raise ShapeError(f"y {list(y.shape)} must have x's shape {list(x.shape)}", operand="y")
    _fits(gate.shape, x.shape, "gate")
    with np.errstate(all="ignore"):
        return finish(x + gate * y, out)
