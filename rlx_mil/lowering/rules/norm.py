"""Normalization family: LayerNorm, RmsNorm, GroupNorm and the fused residual forms (spec 6).

Precision. Under fp32 the rules emit the plain formulas (LayerNorm and GroupNorm through MIL's
`layer_norm`, whose variance is the population variance with `epsilon` added inside the square
root, exactly spec 6.1). Under fp16 those formulas overflow: `x*x` or `(x-mean)^2` exceeds
65504 once |x| passes 256, which real activations do. Computing the norm in an fp32 island
(cast up, normalise, cast down) does not work here: Core ML's `add_fp16_cast` pass, run for
FLOAT16 compute precision, re-casts every fp32 op of the island back to fp16. So under fp16
the rules use scale invariance instead: with `s` = max|x| over the normalised elements,

    norm(x; eps) = norm(x / s; eps / s^2)

and `x / s` lies in [-1, 1], so every square and every sum stays far below the fp16 limit.
`eps / s^2` is formed as `(sqrt(eps) / s)^2` so that a tiny eps (1e-12 is not an fp16 number,
its square root is) survives, and `s` is clamped below at `max(2^-14, sqrt(eps)/128)` so an
all-zero row divides by a positive number and `(sqrt(eps)/s)^2 <= 16384` cannot overflow. A
final guard of 2^-24 inside the reciprocal square root keeps an all-zero row with eps == 0
finite (it yields beta where the fp32 formula gives NaN).

RmsNorm under fp16 takes the same idea further, in 7 ops plus the affine (9 with a gamma, where
the plain formula takes 4-5 and the version above 12). The row is padded with one element
`c = sqrt(H*eps)` (`pad`), so that

    sum(padded^2) = sum(x^2) + H*eps = H * (mean(x^2) + eps)

then, with `s = max|padded|` (`abs`, `reduce_max`) and `p = padded / s` (`real_div`),
`y = p[:H] * rsqrt(sum(p^2)) * sqrt(H)` (`reduce_sum_square`, `rsqrt`, `slice_by_size`, `mul`;
sqrt(H) is folded into a known gamma). Safety: every `|p| <= 1` and one element of `p` is
exactly +-1, so `1 <= sum(p^2) <= H + 1` — no overflow while H + 1 <= 65504 (longer rows take
the 12-op form) and no division by zero; the padding element makes `s >= c > 0` even for an
all-zero row, which then gives beta. `c` is clamped below at 2^-14 (fp16's smallest normal), so
an eps below 2^-28 / H acts as 2^-28 / H — below the resolution of fp16 inputs anyway.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlx_mil.errors import AttributeValueError, DTypeError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.target import Precision

#: Smallest normal fp16 number: the lower clamp of the per-row scale.
FP16_MIN_NORMAL = 2.0**-14
#: Smallest positive fp16 number: keeps 1/sqrt(0) finite for all-zero rows with eps == 0.
FP16_RSQRT_GUARD = 2.0**-24
#: Largest row length whose padded sum of squares (each term <= 1) stays below fp16's maximum.
FP16_SUM_LIMIT = 65504


# ---------------------------------------------------------------------------------- checks




def require_float(ctx: LowerContext, index: int, operand: str) -> None:
    dtype = ctx.input_shape(index).dtype
    if not dtype.is_float:
        raise ctx.fail(DTypeError, f"{operand} must be a float tensor, got {dtype.value}", operand)


def input_sizes(ctx: LowerContext, index: int) -> tuple[int, ...]:
    return ctx.input_shape(index).sizes()


def _check_last_axis(ctx: LowerContext, axis: int, rank: int) -> None:
    if axis not in (-1, rank - 1):
        raise ctx.fail(AttributeValueError, f"normalization runs over the last axis; axis must be -1 or {rank - 1}, got {axis}"
        )


def _check_eps(ctx: LowerContext, eps: float, attr: str = "eps") -> None:
    if not math.isfinite(eps) or eps < 0:
        raise ctx.fail(AttributeValueError, f"{attr} must be a finite value >= 0, got {eps}")


def _check_vector(ctx: LowerContext, index: int, length: int, operand: str) -> None:
    require_float(ctx, index, operand)
    sizes = input_sizes(ctx, index)
    if math.prod(sizes) != length:
        raise ctx.fail(ShapeError, f"{operand} must hold {length} values, got shape {list(sizes)}", operand)


def _check_matches_declared(ctx: LowerContext, sizes: tuple[int, ...], *, flattened_ok: bool) -> None:
    """The declared output is x's shape; RmsNorm may also be declared `[prod(leading), H]`."""
    want = ctx.out_shape.sizes()
    if want == sizes:
        return
    if flattened_ok and sizes and want == (math.prod(sizes[:-1]), sizes[-1]):
        return
    raise ctx.fail(ShapeError, f"declared shape {list(want)} does not match the normalised input {list(sizes)}")


# ---------------------------------------------------------------------------------- pieces


def _affine_vector(ctx: LowerContext, index: int, length: int, shape: list[int], suffix: str) -> tuple[Any, np.ndarray | None]:
    """gamma/beta reshaped to `shape` for broadcasting: (var, its value when known)."""
    from coremltools.converters.mil import Builder as mb

    value = ctx.known_value(index)
    if value is not None:
        arr = np.asarray(value, dtype=np.float32).reshape(shape).astype(ctx.float_dtype)
        return None, arr
    var = ctx.var(index)
    if list(var.shape) != shape:
        var = mb.reshape(x=var, shape=shape, name=ctx.name(f"{suffix}_shape"))
    return var, None


def _apply_affine(
    ctx: LowerContext, y: Any, gamma_index: int, beta_index: int, length: int, shape: list[int], scale: float = 1.0
) -> Any:
    """`y * scale * gamma + beta`, leaving out a multiply by ones or an add of zeros known at
    conversion; a known gamma takes `scale` in (one product, rounded once)."""
    from coremltools.converters.mil import Builder as mb

    gamma_value = ctx.known_value(gamma_index)
    if gamma_value is not None:
        product = np.asarray(gamma_value, dtype=np.float64).reshape(shape) * scale
        if not np.all(product == 1):
            y = mb.mul(x=y, y=product.astype(ctx.float_dtype), name=ctx.name("scale"))
    else:
        if scale != 1.0:
            y = mb.mul(x=y, y=ctx.scalar(scale), name=ctx.name("unscale"))
        gamma_var, _ = _affine_vector(ctx, gamma_index, length, shape, "gamma")
        y = mb.mul(x=y, y=gamma_var, name=ctx.name("scale"))
    beta_var, beta_val = _affine_vector(ctx, beta_index, length, shape, "beta")
    if beta_var is not None:
        y = mb.add(x=y, y=beta_var, name=ctx.name("shift"))
    elif beta_val is not None and np.any(beta_val != 0):
        y = mb.add(x=y, y=beta_val, name=ctx.name("shift"))
    return y


def _fp16_scaled(ctx: LowerContext, x: Any, eps: float, axis: int = -1) -> tuple[Any, Any]:
    """(x / s, (sqrt(eps) / s)^2) with s the clamped per-row max|x| over `axis`."""
    from coremltools.converters.mil import Builder as mb

    sqrt_eps = math.sqrt(eps)
    floor = max(FP16_MIN_NORMAL, sqrt_eps / 128.0)
    peak = mb.reduce_max(x=mb.abs(x=x, name=ctx.name("abs")), axes=[axis], keep_dims=True, name=ctx.name("peak"))
    scale = mb.maximum(x=peak, y=ctx.scalar(floor), name=ctx.name("row_scale"))
    scaled = mb.real_div(x=x, y=scale, name=ctx.name("scaled"))
    root_eps = mb.real_div(x=ctx.scalar(sqrt_eps), y=scale, name=ctx.name("root_eps"))
    eps_term = mb.square(x=root_eps, name=ctx.name("eps_scaled"))
    return scaled, eps_term


def normalize_last_axis(ctx: LowerContext, x: Any, eps: float, *, center: bool, axis: int = -1) -> Any:
    """x normalised over its last axis (or `axis`), no affine: LayerNorm's
    `(x-mean)/sqrt(var+eps)` when `center`, else RmsNorm's `x/sqrt(mean(x^2)+eps)`. fp16-safe
    under fp16 precision."""
    from coremltools.converters.mil import Builder as mb

    if ctx.precision is Precision.FP32:
        if center:
            return mb.layer_norm(x=x, axes=[axis], epsilon=ctx.scalar(eps), name=ctx.name("normed"))
        mean_sq = mb.reduce_mean(x=mb.square(x=x, name=ctx.name("sq")), axes=[axis], keep_dims=True, name=ctx.name("mean_sq"))
        inv_rms = mb.rsqrt(x=mean_sq, epsilon=ctx.scalar(eps), name=ctx.name("inv_rms"))
        return mb.mul(x=x, y=inv_rms, name=ctx.name("normed"))

    scaled, eps_term = _fp16_scaled(ctx, x, eps, axis)
    if center:
        mean = mb.reduce_mean(x=scaled, axes=[axis], keep_dims=True, name=ctx.name("mean"))
        scaled = mb.sub(x=scaled, y=mean, name=ctx.name("centred"))
    mean_sq = mb.reduce_mean(x=mb.square(x=scaled, name=ctx.name("sq")), axes=[axis], keep_dims=True, name=ctx.name("mean_sq"))
    denom = mb.add(x=mean_sq, y=eps_term, name=ctx.name("var_eps"))
    inv = mb.rsqrt(x=denom, epsilon=ctx.scalar(FP16_RSQRT_GUARD), name=ctx.name("inv_std"))
    return mb.mul(x=scaled, y=inv, name=ctx.name("normed"))


def _layer_norm_affine(ctx: LowerContext, x: Any, eps: float, gamma_index: int, beta_index: int, length: int) -> Any:
    """LayerNorm over the last axis with the affine; under fp32 (and in the Neural Engine
    form) constant gamma/beta go straight into MIL's `layer_norm` (which only takes them as
    consts)."""
    from coremltools.converters.mil import Builder as mb

    gamma, beta = ctx.known_value(gamma_index), ctx.known_value(beta_index)
    if ctx.options.neural_engine and (gamma is None or beta is None):
        normed = mb.layer_norm(x=x, axes=[-1], epsilon=_layer_norm_eps(ctx, eps), name=ctx.name("normed"))
        return _apply_affine(ctx, normed, gamma_index, beta_index, length, [length])
    if (ctx.precision is Precision.FP32 or ctx.options.neural_engine) and gamma is not None and beta is not None:
        return mb.layer_norm(
            x=x, axes=[-1],
            gamma=np.asarray(gamma, dtype=np.float32).reshape(length).astype(ctx.float_dtype),
            beta=np.asarray(beta, dtype=np.float32).reshape(length).astype(ctx.float_dtype),
            epsilon=_layer_norm_eps(ctx, eps), name=ctx.name(),
        )
    normed = normalize_last_axis(ctx, x, eps, center=True)
    return _apply_affine(ctx, normed, gamma_index, beta_index, length, [length])


def _rms_norm_fp16(ctx: LowerContext, x: Any, eps: float, length: int) -> Any:
    """`x / sqrt(mean(x^2) + eps) / sqrt(H)` in 7 fp16-safe ops (module docstring): the row
    padded with c = sqrt(H*eps) folds eps into the sum and keeps the row scale positive."""
    from coremltools.converters.mil import Builder as mb

    sizes = [int(d) for d in x.shape]
    extra = max(math.sqrt(length * eps), FP16_MIN_NORMAL)
    padded = mb.pad(x=x, pad=[0, 1], mode="constant", constant_val=ctx.scalar(extra), name=ctx.name("padded"))
    peak = mb.reduce_max(x=mb.abs(x=padded, name=ctx.name("abs")), axes=[-1], keep_dims=True, name=ctx.name("peak"))
    scaled = mb.real_div(x=padded, y=peak, name=ctx.name("scaled"))
    sum_sq = mb.reduce_sum_square(x=scaled, axes=[-1], keep_dims=True, name=ctx.name("sum_sq"))
    inv = mb.rsqrt(x=sum_sq, name=ctx.name("inv_norm"))
    row = mb.slice_by_size(x=scaled, begin=[0] * len(sizes), size=sizes, name=ctx.name("row"))
    return mb.mul(x=row, y=inv, name=ctx.name("normed"))


def _layer_norm_eps(ctx: LowerContext, eps: float) -> Any:
    """`layer_norm`'s epsilon: under fp16 at least fp16's smallest number, so that a tiny eps
    does not round to 0 (an all-zero row would divide by 0)."""
    return ctx.scalar(max(eps, FP16_RSQRT_GUARD) if ctx.precision is Precision.FP16 else eps)


def _rms_norm_pair(ctx: LowerContext, x: Any, eps: float, length: int) -> Any:
    """The Neural Engine's RmsNorm (Anemll): MIL's `layer_norm` over `[x, -x]`, whose mean is
    zero and whose variance is mean(x^2), then the first half. The device's own layer norm
    keeps it fp16-safe; the graph has 4 ops."""
    from coremltools.converters.mil import Builder as mb

    sizes = [int(d) for d in x.shape]
    negated = mb.mul(x=x, y=ctx.scalar(-1.0), name=ctx.name("negated"))
    pair = mb.concat(values=[x, negated], axis=-1, name=ctx.name("pair"))
    normed = mb.layer_norm(x=pair, axes=[-1], epsilon=_layer_norm_eps(ctx, eps), name=ctx.name("pair_normed"))
    return mb.slice_by_size(x=normed, begin=[0] * len(sizes), size=sizes, name=ctx.name("normed"))


def _rms_norm_affine(ctx: LowerContext, x: Any, eps: float, gamma_index: int, beta_index: int, length: int) -> Any:
    if ctx.options.neural_engine:
        return _apply_affine(ctx, _rms_norm_pair(ctx, x, eps, length), gamma_index, beta_index, length, [length])
    if ctx.precision is Precision.FP32 or length + 1 > FP16_SUM_LIMIT:
        normed = normalize_last_axis(ctx, x, eps, center=False)
        return _apply_affine(ctx, normed, gamma_index, beta_index, length, [length])
    normed = _rms_norm_fp16(ctx, x, eps, length)
    return _apply_affine(ctx, normed, gamma_index, beta_index, length, [length], scale=math.sqrt(length))


def _to_declared(ctx: LowerContext, y: Any) -> Any:
    from coremltools.converters.mil import Builder as mb

    want = list(ctx.out_shape.sizes())
    if list(y.shape) != want:
        y = mb.reshape(x=y, shape=want, name=ctx.name("rows"))
    return y


def _check_row_norm(ctx: LowerContext, axis: int | None, eps: float, *, flattened_ok: bool) -> int:
    """Checks shared by LayerNorm/RmsNorm (x = input 0, gamma/beta = the last two); returns H."""
    require_float(ctx, 0, "x")
    sizes = input_sizes(ctx, 0)
    if not sizes:
        raise ctx.fail(ShapeError, "x must have rank >= 1 (normalised over its last axis)", "x")
    if axis is not None:
        _check_last_axis(ctx, axis, len(sizes))
    _check_eps(ctx, eps)
    length = sizes[-1]
    _check_vector(ctx, ctx.num_inputs - 2, length, "gamma")
    _check_vector(ctx, ctx.num_inputs - 1, length, "beta")
    _check_matches_declared(ctx, sizes, flattened_ok=flattened_ok)
    return length


# ---------------------------------------------------------------------------------- rules


@lowering(
    notes=(
        "fp32: `layer_norm` over the last axis (const gamma/beta folded in, else `mul`/`add`);"
        " fp16: overflow-safe decomposition scaled by the row's max|x| (`reduce_max`, `real_div`,"
        " `reduce_mean`, `rsqrt`); axis must be the last"
    ),
)
def lower_layer_norm(op: ops.LayerNorm, ctx: LowerContext) -> Any:
    length = _check_row_norm(ctx, op.axis, op.eps, flattened_ok=False)
    return _layer_norm_affine(ctx, ctx.var(0), op.eps, 1, 2, length)


@lowering(
    notes=(
        "no MIL rms_norm: fp32 `square`/`reduce_mean`/`rsqrt(epsilon)`/`mul`; fp16 7 ops: the row"
        " padded with sqrt(H*eps), scaled by its max|x| (`pad`, `abs`, `reduce_max`, `real_div`),"
        " `reduce_sum_square`, `rsqrt`, `slice_by_size`, `mul` (no overflow, all-zero rows give beta);"
        " gamma (times sqrt(H) under fp16) multiplies unless all ones, beta is added unless all zeros;"
        " a leading-flattened declared shape gets a `reshape`"
    ),
)
def lower_rms_norm(op: ops.RmsNorm, ctx: LowerContext) -> Any:
    length = _check_row_norm(ctx, op.axis, op.eps, flattened_ok=True)
    return _to_declared(ctx, _rms_norm_affine(ctx, ctx.var(0), op.eps, 1, 2, length))


@lowering(
    notes=(
        "`reshape` [N, G, rest] -> last-axis norm (fp32 `layer_norm`, fp16 scaled decomposition)"
        " -> `reshape` [N, C, spatial] -> per-channel `mul`/`add` -> `reshape` to x's shape;"
        " x is [N, C, *spatial] with C % G == 0"
    ),
)
def lower_group_norm(op: ops.GroupNorm, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    require_float(ctx, 0, "x")
    sizes = input_sizes(ctx, 0)
    if len(sizes) < 2:
        raise ctx.fail(ShapeError, f"x must be [N, C, *spatial], got {list(sizes)}", "x")
    batch, channels = sizes[0], sizes[1]
    groups = op.num_groups
    if groups < 1 or channels % groups != 0:
        raise ctx.fail(AttributeValueError, f"num_groups={groups} must divide the {channels} channels")
    _check_eps(ctx, op.eps)
    _check_vector(ctx, 1, channels, "gamma")
    _check_vector(ctx, 2, channels, "beta")
    _check_matches_declared(ctx, sizes, flattened_ok=False)

    per_group = math.prod(sizes) // (batch * groups) if batch * groups else 0
    grouped = mb.reshape(x=ctx.var(0), shape=[batch, groups, per_group], name=ctx.name("groups"))
    normed = normalize_last_axis(ctx, grouped, op.eps, center=True)
    # The affine runs on an [N, C, spatial] view: one [C, 1] weight shape serves any spatial rank.
    if len(sizes) == 2:
        view, affine_shape = list(sizes), [channels]
    else:
        view, affine_shape = [batch, channels, math.prod(sizes[2:])], [channels, 1]
    normed = mb.reshape(x=normed, shape=view, name=ctx.name("ungroup"))
    y = _apply_affine(ctx, normed, 1, 2, channels, affine_shape)
    if view != list(sizes):
        y = mb.reshape(x=y, shape=list(sizes), name=ctx.name())
    return y


def _residual_sum(ctx: LowerContext, has_bias: bool) -> Any:
    from coremltools.converters.mil import Builder as mb

    require_float(ctx, 1, "residual")
    x_sizes = input_sizes(ctx, 0)
    res_sizes = input_sizes(ctx, 1)
    try:
        summed = tuple(np.broadcast_shapes(x_sizes, res_sizes))
    except ValueError:
        raise ctx.fail(ShapeError, f"residual {list(res_sizes)} does not broadcast against x {list(x_sizes)}", "residual"
        ) from None
    if summed != x_sizes:
        raise ctx.fail(ShapeError, f"x + residual has shape {list(summed)}, not x's {list(x_sizes)}", "residual")
    total = mb.add(x=ctx.var(0), y=ctx.var(1), name=ctx.name("residual_sum"))
    if has_bias:
        _check_vector(ctx, 2, x_sizes[-1], "bias")
        bias = ctx.known_value(2)
        bias_arg = (
            np.asarray(bias, dtype=np.float32).reshape(x_sizes[-1]).astype(ctx.float_dtype)
            if bias is not None
            else ctx.var(2)
        )
        if bias is None and len(input_sizes(ctx, 2)) != 1:
            bias_arg = mb.reshape(x=bias_arg, shape=[x_sizes[-1]], name=ctx.name("bias_shape"))
        total = mb.add(x=total, y=bias_arg, name=ctx.name("biased"))
    return total


@lowering(
    notes=(
        "`add` x + residual (+ `add` bias), then LayerNorm as for LayerNorm (fp16: scaled"
        " decomposition); 4 inputs, or 5 with has_bias"
    ),
)
def lower_fused_residual_ln(op: ops.FusedResidualLN, ctx: LowerContext) -> Any:
    length = _check_row_norm(ctx, None, op.eps, flattened_ok=False)
    total = _residual_sum(ctx, op.has_bias)
    return _layer_norm_affine(ctx, total, op.eps, ctx.num_inputs - 2, ctx.num_inputs - 1, length)


@lowering(
    notes=(
        "`add` x + residual (+ `add` bias), then RmsNorm as for RmsNorm (beta added, fp16-safe);"
        " 4 inputs, or 5 with has_bias"
    ),
)
def lower_fused_residual_rms_norm(op: ops.FusedResidualRmsNorm, ctx: LowerContext) -> Any:
    length = _check_row_norm(ctx, None, op.eps, flattened_ok=True)
    total = _residual_sum(ctx, op.has_bias)
    return _to_declared(ctx, _rms_norm_affine(ctx, total, op.eps, ctx.num_inputs - 2, ctx.num_inputs - 1, length))


# ---------------------------------------------------------------------------------- part-2 spec section 5


def _float_operand(ctx: LowerContext, index: int, operand: str, shape: list[int] | None = None) -> Any:
    """Input `index` as an inline const (known at conversion, reshaped to `shape`) or its var."""
    from coremltools.converters.mil import Builder as mb

    require_float(ctx, index, operand)
    value = ctx.known_value(index)
    if value is not None:
        arr = np.asarray(value, dtype=np.float32)
        return (arr.reshape(shape) if shape is not None else arr).astype(ctx.float_dtype)
    var = ctx.var(index)
    if shape is not None and list(var.shape) != shape:
        var = mb.reshape(x=var, shape=shape, name=ctx.name(f"{operand}_shape"))
    return var


@lowering(
    notes=(
        "channel = last axis (upstream's rule, not axis 1, so MIL `batch_norm` does not apply):"
        " with Param/Constant statistics the scale gamma/sqrt(var+eps) is folded at conversion (in fp32)"
        " and the rule emits `sub` mean, `mul` scale, `add` beta; run-time statistics add `rsqrt(epsilon)`"
        " and a `mul` by gamma. Subtracting the mean first keeps fp16 free of cancellation"
    ),
)
def lower_batch_norm_inference(op: ops.BatchNormInference, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    require_float(ctx, 0, "x")
    sizes = input_sizes(ctx, 0)
    if not sizes:
        raise ctx.fail(ShapeError, "x must have rank >= 1 (its last axis is the channel)", "x")
    _check_eps(ctx, op.eps)
    channels = sizes[-1]
    roles = ("gamma", "beta", "running_mean", "running_var")
    for index, operand in enumerate(roles, start=1):
        _check_vector(ctx, index, channels, operand)
    _check_matches_declared(ctx, sizes, flattened_ok=False)
    gamma, var = ctx.known_value(1), ctx.known_value(4)
    centred = mb.sub(x=ctx.var(0), y=_float_operand(ctx, 3, "running_mean", [channels]), name=ctx.name("centred"))
    if gamma is not None and var is not None:
        g = np.asarray(gamma, dtype=np.float32).reshape(channels)
        v = np.asarray(var, dtype=np.float32).reshape(channels)
        with np.errstate(all="ignore"):
            scale = (g / np.sqrt(v + np.float32(op.eps))).astype(ctx.float_dtype)
        scaled = mb.mul(x=centred, y=scale, name=ctx.name("scaled"))
    else:
        inv_std = mb.rsqrt(x=_float_operand(ctx, 4, "running_var", [channels]), epsilon=ctx.scalar(op.eps),
                           name=ctx.name("inv_std"))
        normed = mb.mul(x=centred, y=inv_std, name=ctx.name("normed"))
        scaled = mb.mul(x=normed, y=_float_operand(ctx, 1, "gamma", [channels]), name=ctx.name("scaled"))
    return mb.add(x=scaled, y=_float_operand(ctx, 2, "beta", [channels]), name=ctx.name())


@lowering(
    notes=(
        "fp32: `layer_norm` with axes=[1] (two-pass population variance, as the reference); fp16:"
        " the overflow-safe scaled decomposition along axis 1; gamma/beta as [1, C, 1, 1] `mul`/`add`"
        " (left out when ones/zeros); x is [N, C, H, W]"
    ),
)
def lower_layer_norm_2d(op: ops.LayerNorm2d, ctx: LowerContext) -> Any:
    require_float(ctx, 0, "x")
    sizes = input_sizes(ctx, 0)
    if len(sizes) != 4:
        raise ctx.fail(ShapeError, f"x must be [N, C, H, W], got {list(sizes)}", "x")
    _check_eps(ctx, op.eps)
    channels = sizes[1]
    _check_vector(ctx, 1, channels, "gamma")
    _check_vector(ctx, 2, channels, "beta")
    _check_matches_declared(ctx, sizes, flattened_ok=False)
    normed = normalize_last_axis(ctx, ctx.var(0), op.eps, center=True, axis=1)
    return _apply_affine(ctx, normed, 1, 2, channels, [1, channels, 1, 1])


def _check_broadcasts_to(ctx: LowerContext, index: int, target: tuple[int, ...], operand: str) -> None:
    sizes = input_sizes(ctx, index)
    try:
        fits = tuple(np.broadcast_shapes(target, sizes)) == target
    except ValueError:
        fits = False
    if not fits:
        raise ctx.fail(ShapeError, f"{operand} {list(sizes)} must broadcast to x {list(target)}", operand)


@lowering(
    notes=(
        "the norm without affine as LayerNorm/RmsNorm lower it (fp32 `layer_norm` or"
        " `square`/`reduce_mean`/`rsqrt`; fp16 the scaled decomposition), then `mul` by 1 + scale (`add`,"
        " folded when scale is known) and `add` shift; scale/shift broadcast NumPy-style"
    ),
)
def lower_ada_layer_norm(op: ops.AdaLayerNorm, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    require_float(ctx, 0, "x")
    sizes = input_sizes(ctx, 0)
    if not sizes:
        raise ctx.fail(ShapeError, "x must have rank >= 1 (normalised over its last axis)", "x")
    _check_eps(ctx, op.eps)
    _check_broadcasts_to(ctx, 1, sizes, "scale")
    _check_broadcasts_to(ctx, 2, sizes, "shift")
    _check_matches_declared(ctx, sizes, flattened_ok=False)
    normed = normalize_last_axis(ctx, ctx.var(0), op.eps, center=op.norm is ops.AdaNormKind.LAYER_NORM)
    scale = ctx.known_value(1)
    if scale is not None:
        factor: Any = (np.float32(1) + np.asarray(scale, dtype=np.float32)).astype(ctx.float_dtype)
    else:
        factor = mb.add(x=_float_operand(ctx, 1, "scale"), y=ctx.scalar(1.0), name=ctx.name("one_plus_scale"))
    modulated = mb.mul(x=normed, y=factor, name=ctx.name("modulated"))
    return mb.add(x=modulated, y=_float_operand(ctx, 2, "shift"), name=ctx.name())


@lowering(
    notes="`mul` gate * y, `add` x; gate broadcasts NumPy-style",
)
def lower_gated_residual(op: ops.GatedResidual, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    require_float(ctx, 0, "x")
    sizes = input_sizes(ctx, 0)
    if input_sizes(ctx, 1) != sizes:
        raise ctx.fail(ShapeError, f"y {list(input_sizes(ctx, 1))} must have x's shape {list(sizes)}", "y")
    _check_broadcasts_to(ctx, 2, sizes, "gate")
    gated = mb.mul(x=_float_operand(ctx, 2, "gate"), y=_float_operand(ctx, 1, "y"), name=ctx.name("gated"))
    return mb.add(x=ctx.var(0), y=gated, name=ctx.name())
