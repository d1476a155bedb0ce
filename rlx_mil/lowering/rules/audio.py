"""LogMel (part-2 spec 5.12): power spectrum, mel projection, log10, per-frame clamp, Whisper scaling.

Under fp16 the power spectrum would overflow once a bin's magnitude passes 256, so each frame is
first divided by its peak |value| `s` (clamped below at fp16's smallest normal so an all-zero
frame divides by a positive number): `log10(mel) = log10(mel / s^2) + 2 log10(s)`. The floor
`max(mel, 1e-10)` is applied in the log domain (`max(l, -10)`; 1e-10 is no fp16 number), after
a `log` with epsilon 0, so a bin whose scaled energy is exactly 0 becomes -inf and then the floor,
as in fp32. Bins whose scaled energy falls below fp16's range (about 7 decades under the frame's
peak) are not resolved; the per-frame clamp at max - 8 usually covers them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlx_mil.errors import DTypeError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.rules.norm import FP16_MIN_NORMAL, input_sizes
from rlx_mil.lowering.target import Precision

_INV_LN10 = 1.0 / math.log(10.0)


@lowering(
    notes=(
        "`slice_by_index` real/imaginary bins, `mul`/`add` power, `matmul` with the filters"
        " (transposed at conversion when known, else transpose_y), `maximum` floor, `log` times 1/ln 10,"
        " per-frame `reduce_max` - 8 `maximum`, `mul`/`add` (l + 4) / 4; fp16: each frame scaled by its"
        " peak |value| first and the floor taken in the log domain (no overflow)"
    ),
)
def lower_log_mel(op: ops.LogMel, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    for index, operand in ((0, "spectrum"), (1, "filters")):
        if ctx.input_shape(index).dtype is not DType.F32:
            raise ctx.fail(DTypeError, f"{operand} must be F32, got {ctx.input_shape(index).dtype.value}", operand)
    sizes, bank = input_sizes(ctx, 0), input_sizes(ctx, 1)
    if not sizes or sizes[-1] < 2 or sizes[-1] % 2:
        raise ctx.fail(ShapeError, f"spectrum must be [..., 2 * n_fft], got {list(sizes)}", "spectrum")
    n_fft = sizes[-1] // 2
    bins = n_fft // 2 + 1
    if len(bank) != 2 or bank[1] != bins:
        raise ctx.fail(ShapeError, f"filters must be [n_mels, {bins}], got {list(bank)}", "filters")
    n_mels = bank[0]
    rows = math.prod(sizes[:-1])
    spectrum = mb.reshape(x=ctx.var(0), shape=[rows, sizes[-1]], name=ctx.name("frames"))
    fp16 = ctx.precision is Precision.FP16
    if fp16:
        peak = mb.reduce_max(x=mb.abs(x=spectrum, name=ctx.name("abs")), axes=[-1], keep_dims=True,
                             name=ctx.name("peak"))
        scale = mb.maximum(x=peak, y=ctx.scalar(FP16_MIN_NORMAL), name=ctx.name("frame_scale"))
        spectrum = mb.real_div(x=spectrum, y=scale, name=ctx.name("scaled"))
    real = mb.slice_by_index(x=spectrum, begin=[0, 0], end=[rows, bins], name=ctx.name("real"))
    imag = mb.slice_by_index(x=spectrum, begin=[0, n_fft], end=[rows, n_fft + bins], name=ctx.name("imag"))
    power = mb.add(x=mb.mul(x=real, y=real, name=ctx.name("real_sq")),
                   y=mb.mul(x=imag, y=imag, name=ctx.name("imag_sq")), name=ctx.name("power"))
    filters = ctx.value(1)
    if filters is not None:
        projection = np.ascontiguousarray(np.asarray(filters, dtype=np.float32).reshape(n_mels, bins).T)
        mel = mb.matmul(x=power, y=ctx.const(projection, "filters_t"), name=ctx.name("mel"))
    else:
        mel = mb.matmul(x=power, y=ctx.var(1), transpose_y=True, name=ctx.name("mel"))
    if fp16:
        log_mel = mb.log(x=mel, epsilon=ctx.scalar(0.0), name=ctx.name("ln_scaled"))
        log_scale = mb.log(x=scale, epsilon=ctx.scalar(0.0), name=ctx.name("ln_scale"))
        shift = mb.mul(x=log_scale, y=ctx.scalar(2.0 * _INV_LN10), name=ctx.name("log_scale_sq"))
        level = mb.add(x=mb.mul(x=log_mel, y=ctx.scalar(_INV_LN10), name=ctx.name("log10_scaled")),
                       y=shift, name=ctx.name("log10_unfloored"))
        level = mb.maximum(x=level, y=ctx.scalar(-10.0), name=ctx.name("log10"))
    else:
        floored = mb.maximum(x=mel, y=ctx.scalar(1e-10), name=ctx.name("floored"))
        natural = mb.log(x=floored, epsilon=ctx.scalar(0.0), name=ctx.name("ln"))
        level = mb.mul(x=natural, y=ctx.scalar(_INV_LN10), name=ctx.name("log10"))
    top = mb.reduce_max(x=level, axes=[-1], keep_dims=True, name=ctx.name("frame_max"))
    bottom = mb.sub(x=top, y=ctx.scalar(8.0), name=ctx.name("frame_floor"))
    level = mb.maximum(x=level, y=bottom, name=ctx.name("clamped"))
    scaled = mb.add(x=mb.mul(x=level, y=ctx.scalar(0.25), name=ctx.name("quarter")), y=ctx.scalar(1.0),
                    name=ctx.name("features"))
    return mb.reshape(x=scaled, shape=[*sizes[:-1], n_mels], name=ctx.name())
