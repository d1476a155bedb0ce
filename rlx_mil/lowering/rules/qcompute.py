"""Quantized compute: QMatMul, QConv2d, FakeQuantize (spec part 2, section 6).

QMatMul and QConv2d accumulate in int32 inside the program (MIL `matmul` on int32; the
convolution as an im2col `gather` of the zero-point-shifted input, a zero cell standing for
every padded position, then an int32 batched `matmul` per group), so the accumulator is
exact and wraps like upstream's i32 on every target and precision. Requantization is float
math in the program precision: in fp32 it is upstream's `f32(acc) * mult`; under fp16 the
accumulator is split into 11-bit digits before the multiply so it cannot overflow, and the
result may differ by one step where `acc * mult` lies within fp16 rounding of a .5 tie.
Rounding is half away from zero, spelled with floor/ceil/select (MIL `round` leaves ties to
the compute unit).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.ir import ops
from rlx_mil.ir.ops import ScaleModeKind
from rlx_mil.ir.ops.qcompute import MIN_SCALE, Q_MAX
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.target import Precision

_SPLIT = 2048


def round_half_away(ctx: LowerContext, v: Any, suffix: str) -> Any:
    """Nearest integer, ties away from zero (v - trunc(v) is exact)."""
    from coremltools.converters.mil import Builder as mb

    negative = mb.less(x=v, y=ctx.scalar(0.0), name=ctx.name(f"{suffix}_neg"))
    up = mb.ceil(x=v, name=ctx.name(f"{suffix}_ceil"))
    down = mb.floor(x=v, name=ctx.name(f"{suffix}_floor"))
    whole = mb.select(cond=negative, a=up, b=down, name=ctx.name(f"{suffix}_trunc"))
    fraction = mb.sub(x=v, y=whole, name=ctx.name(f"{suffix}_frac"))
    above = mb.greater_equal(x=fraction, y=ctx.scalar(0.5), name=ctx.name(f"{suffix}_up"))
    below = mb.less_equal(x=fraction, y=ctx.scalar(-0.5), name=ctx.name(f"{suffix}_down"))
    up_step = mb.cast(x=above, dtype=ctx.mil_float, name=ctx.name(f"{suffix}_step_up"))
    down_step = mb.cast(x=below, dtype=ctx.mil_float, name=ctx.name(f"{suffix}_step_down"))
    step = mb.sub(x=up_step, y=down_step, name=ctx.name(f"{suffix}_step"))
    return mb.add(x=whole, y=step, name=ctx.name(suffix))


def _scaled(ctx: LowerContext, acc: Any, mult: float) -> Any:
    """`acc * mult` in the program float (acc int32).

    Under fp16, |acc| is split into three 11-bit digits (each exact in fp16) whose weights
    `|mult| * 2^(11 d)` are capped at the largest fp16: a digit >= 1 with a capped weight
    means |acc * mult| is beyond that anyway, so the result saturates instead of overflowing
    to inf * 0 = NaN."""
    from coremltools.converters.mil import Builder as mb

    if ctx.precision is Precision.FP32:
        as_float = mb.cast(x=acc, dtype=ctx.mil_float, name=ctx.name("acc_float"))
        return mb.mul(x=as_float, y=ctx.scalar(mult), name=ctx.name("scaled"))
    largest = float(np.finfo(np.float16).max)
    bounded = mb.maximum(x=acc, y=np.int32(-(2**31) + 1), name=ctx.name("acc_bounded"))
    negative = mb.less(x=bounded, y=np.int32(0), name=ctx.name("acc_negative"))
    flipped = mb.sub(x=np.int32(0), y=bounded, name=ctx.name("acc_flipped"))
    rest = mb.select(cond=negative, a=flipped, b=bounded, name=ctx.name("acc_magnitude"))
    total: Any = None
    for digit in range(3):
        if digit < 2:
            high = mb.floor_div(x=rest, y=np.int32(_SPLIT), name=ctx.name(f"acc_high{digit}"))
            low = mb.sub(x=rest, y=mb.mul(x=high, y=np.int32(_SPLIT), name=ctx.name(f"acc_shift{digit}")),
                         name=ctx.name(f"acc_digit{digit}"))
        else:
            high, low = None, rest
        weight = min(abs(mult) * float(_SPLIT) ** digit, largest)
        term = mb.mul(x=mb.cast(x=low, dtype=ctx.mil_float, name=ctx.name(f"acc_digit{digit}_float")),
                      y=ctx.scalar(weight), name=ctx.name(f"scaled_digit{digit}"))
        total = term if total is None else mb.add(x=total, y=term, name=ctx.name(f"scaled_sum{digit}"))
        rest = high
    sign = mb.cast(x=negative, dtype=ctx.mil_float, name=ctx.name("acc_sign_bit"))
    factor = mb.sub(x=ctx.scalar(1.0), y=mb.mul(x=sign, y=ctx.scalar(2.0), name=ctx.name("acc_sign2")),
                    name=ctx.name("acc_sign"))
    if mult < 0:
        factor = mb.mul(x=factor, y=ctx.scalar(-1.0), name=ctx.name("mult_sign"))
    return mb.mul(x=total, y=factor, name=ctx.name("scaled"))


def requantize(ctx: LowerContext, acc: Any, mult: float, out_zp: int) -> Any:
    """`clip(round_half_away(acc * mult) + out_zp, -128, 127)` as int32."""
    from coremltools.converters.mil import Builder as mb

    rounded = round_half_away(ctx, _scaled(ctx, acc, mult), "rounded")
    shifted = mb.add(x=rounded, y=ctx.scalar(float(out_zp)), name=ctx.name("offset"))
    clipped = mb.clip(x=shifted, alpha=ctx.scalar(-128.0), beta=ctx.scalar(127.0), name=ctx.name("saturated"))
    return mb.cast(x=clipped, dtype="int32", name=ctx.name())


def _shifted(ctx: LowerContext, i: int, zero_point: int, suffix: str) -> Any:
    """Input `i` (I8 codes, held int32) minus its zero point; constants are shifted here."""
    from coremltools.converters.mil import Builder as mb

    value = ctx.value(i)
    if value is not None:
        return ctx.const(np.asarray(value).astype(np.int64) - zero_point, suffix)
    if zero_point == 0:
        return ctx.var(i)
    return mb.sub(x=ctx.var(i), y=np.int32(zero_point), name=ctx.name(suffix))


@lowering(
    notes=(
        "int32 `matmul` of the zero-point-shifted codes plus the bias (exact, wraps like i32),"
        " then requantization in the program float with ties away from zero; under fp16 the"
        " result may be one step off near a tie."
    ),
)
def lower_qmatmul(op: ops.QMatMul, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    x = _shifted(ctx, 0, op.x_zp, "x_shifted")
    w = _shifted(ctx, 1, op.w_zp, "w_shifted")
    acc = mb.matmul(x=x, y=w, name=ctx.name("acc_raw"))
    acc = mb.add(x=acc, y=ctx.var(2), name=ctx.name("acc"))
    return requantize(ctx, acc, op.mult, op.out_zp)


def _patch_indices(c: int, h: int, w: int, op: ops.QConv2d) -> tuple[np.ndarray, int, int]:
    """For every output position and (c, i, j) tap, the flat index into `x.reshape(C*H*W)`
    (C*H*W for a padded cell, which holds 0 after the shift)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = op.kernel_size, op.stride, op.padding, op.dilation
    out_h = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    rows = (np.arange(out_h) * sh - ph)[:, None, None, None, None] + (np.arange(kh) * dh)[None, None, None, :, None]
    cols = (np.arange(out_w) * sw - pw)[None, :, None, None, None] + (np.arange(kw) * dw)[None, None, None, None, :]
    chans = np.arange(c)[None, None, :, None, None]
    rows, cols, chans = np.broadcast_arrays(rows, cols, chans)
    inside = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)
    flat = np.where(inside, chans * h * w + rows * w + cols, c * h * w)
    return flat.reshape(out_h * out_w, c * kh * kw).astype(np.int32), out_h, out_w


@lowering(
    notes=(
        "im2col: `gather` of the x_zp-shifted input (padded cells read an appended 0, i.e."
        " they hold x_zp), int32 batched `matmul` per group, bias add, then requantization as"
        " QMatMul (fp16 may be one step off near a tie)."
    ),
)
def lower_qconv2d(op: ops.QConv2d, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    n, c, h, w = ctx.input_shape(0).sizes()
    c_out, c_group, kh, kw = ctx.input_shape(1).sizes()
    groups = int(op.groups)
    taps = c_group * kh * kw
    indices, out_h, out_w = _patch_indices(c, h, w, op)
    x = _shifted(ctx, 0, op.x_zp, "x_shifted")
    flat = mb.reshape(x=x, shape=np.asarray([n, c * h * w], np.int32), name=ctx.name("x_flat"))
    zero = ctx.const(np.zeros((n, 1), np.int32), "pad_cell")
    flat = mb.concat(values=[flat, zero], axis=1, name=ctx.name("x_padded"))
    patches = mb.gather(x=flat, indices=ctx.const(indices, "taps"), axis=1, name=ctx.name("patches"))
    patches = mb.reshape(x=patches, shape=np.asarray([n, out_h * out_w, groups, taps], np.int32), name=ctx.name("patch_groups"))
    patches = mb.transpose(x=patches, perm=[0, 2, 1, 3], name=ctx.name("patches_by_group"))
    weights = _shifted(ctx, 1, op.w_zp, "w_shifted")
    weights = mb.reshape(x=weights, shape=np.asarray([groups, c_out // groups, taps], np.int32), name=ctx.name("w_groups"))
    acc = mb.matmul(x=patches, y=weights, transpose_y=True, name=ctx.name("acc_raw"))
    acc = mb.transpose(x=acc, perm=[0, 1, 3, 2], name=ctx.name("acc_channels"))
    acc = mb.reshape(x=acc, shape=np.asarray([n, c_out, out_h, out_w], np.int32), name=ctx.name("acc_nchw"))
    bias = mb.reshape(x=ctx.var(2), shape=np.asarray([1, c_out, 1, 1], np.int32), name=ctx.name("bias"))
    acc = mb.add(x=acc, y=bias, name=ctx.name("acc"))
    return requantize(ctx, acc, op.mult, op.out_zp)


@lowering(
    notes=(
        "`reduce_max` of |x| per channel (PerBatch/EMA) or the state input (Fixed/EMA) gives"
        " the scale; `x / s` rounded half away from zero (floor/ceil/select), `clip` to"
        " ±q_max, times s. EMA computes the blended scale but cannot write the state back"
        " (the op's only output is y)."
    ),
)
def lower_fake_quantize(op: ops.FakeQuantize, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    q = float(Q_MAX[op.bits])
    x = ctx.var(0)
    rank = len(sizes)
    axes = [d for d in range(rank) if d != op.axis]
    kind = op.scale_mode.kind
    scale: Any = None
    if kind is not ScaleModeKind.FIXED:
        magnitude = mb.abs(x=x, name=ctx.name("magnitude"))
        peak = mb.reduce_max(x=magnitude, axes=axes, keep_dims=True, name=ctx.name("peak")) if axes else magnitude
        scale = mb.mul(x=peak, y=ctx.scalar(1.0 / q), name=ctx.name("current"))
    if kind is not ScaleModeKind.PER_BATCH:
        shape = [1] * rank
        if op.axis is not None:
            shape[op.axis] = sizes[op.axis]
        state = mb.reshape(x=ctx.var(1), shape=np.asarray(shape or [1], np.int32), name=ctx.name("state"))
        if kind is ScaleModeKind.EMA:
            decay = float(op.scale_mode.decay or 0.0)
            kept = mb.mul(x=state, y=ctx.scalar(decay), name=ctx.name("ema_kept"))
            fresh = mb.mul(x=scale, y=ctx.scalar(1.0 - decay), name=ctx.name("ema_fresh"))
            blended = mb.add(x=kept, y=fresh, name=ctx.name("ema_blend"))
            unset = mb.less_equal(x=state, y=ctx.scalar(0.0), name=ctx.name("ema_unset"))
            scale = mb.select(cond=unset, a=scale, b=blended, name=ctx.name("ema_scale"))
        else:
            scale = state
    if kind is not ScaleModeKind.EMA:
        scale = mb.maximum(x=scale, y=ctx.scalar(MIN_SCALE), name=ctx.name("scale_floor"))
    # A zero scale (possible in fp16, where 1e-12 underflows, or for EMA) only occurs with an
    # all-zero channel: dividing by 1 there gives the reference's zeros.
    positive = mb.greater(x=scale, y=ctx.scalar(0.0), name=ctx.name("scale_positive"))
    divisor = mb.select(cond=positive, a=scale, b=ctx.scalar(1.0), name=ctx.name("divisor"))
    ratio = mb.real_div(x=x, y=divisor, name=ctx.name("ratio"))
    steps = round_half_away(ctx, ratio, "steps")
    steps = mb.clip(x=steps, alpha=ctx.scalar(-q), beta=ctx.scalar(q), name=ctx.name("steps_clipped"))
    return mb.mul(x=steps, y=scale, name=ctx.name())
