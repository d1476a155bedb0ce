"""Reference kernels of quantized compute: QMatMul, QConv2d, FakeQuantize (spec part 2, section 6).

Accumulation is exact integer arithmetic wrapped to i32 (upstream's release-build wrapping);
requantization is float32 `f32(acc) * mult` rounded half away from zero (upstream's
`f32::round`), offset by `out_zp` and saturated to I8. FakeQuantize computes in float32 with
the same rounding. A zero scale (an all-zero channel whose state gives no scale either) yields
zeros instead of 0/0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from rlx_mil.errors import AttributeValueError, EvaluationError
from rlx_mil.ir.ops import FakeQuantize, QConv2d, QMatMul, ScaleModeKind
from rlx_mil.ir.ops.qcompute import MIN_SCALE, Q_MAX
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import finish, reference_kernel


def round_half_away(v: np.ndarray) -> np.ndarray:
    """Round to nearest, ties away from zero; exact (v - trunc(v) is exact in floating point)."""
    whole = np.trunc(v)
    step = np.where(np.abs(v - whole) >= 0.5, np.sign(v), 0.0).astype(v.dtype)
    return whole + step


def wrap_i32(acc: np.ndarray) -> np.ndarray:
    return ((acc.astype(np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


def requantize(acc: np.ndarray, mult: float, out_zp: int) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        y = round_half_away(acc.astype(np.float32) * np.float32(mult)).astype(np.float64) + out_zp
    return np.clip(y, -128, 127).astype(np.int8)


@reference_kernel(QMatMul)
def _qmatmul(op: QMatMul, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x, w, bias = (np.asarray(a).astype(np.int64) for a in inputs)
    acc = wrap_i32((x - op.x_zp) @ (w - op.w_zp) + bias)
    return finish(requantize(acc, op.mult, op.out_zp), out)


def qconv_accumulate(x: np.ndarray, w: np.ndarray, op: QConv2d) -> np.ndarray:
    """Exact int64 sums of `(x - x_zp) * (w - w_zp)` (padded cells hold x_zp, i.e. add 0)."""
    n, c_in, _, _ = x.shape
    c_out, c_per_group, kh, kw = w.shape
    groups = op.groups
    (sh, sw), (ph, pw), (dh, dw) = op.stride, op.padding, op.dilation
    shifted = np.pad(x.astype(np.int64) - op.x_zp, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    span_h, span_w = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    windows = sliding_window_view(shifted, (span_h, span_w), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    weights = w.astype(np.int64) - op.w_zp
    per_group = c_out // groups
    parts = [
        np.einsum(
            "nchwij,ocij->nohw",
            windows[:, g * c_per_group:(g + 1) * c_per_group],
            weights[g * per_group:(g + 1) * per_group],
        )
        for g in range(groups)
    ]
    if c_in != c_per_group * groups:
        raise AttributeValueError(f"x has {c_in} channels; w expects {c_per_group} x groups={groups}")
    return np.concatenate(parts, axis=1) if n else np.zeros((0, c_out, 0, 0), np.int64)


@reference_kernel(QConv2d)
def _qconv2d(op: QConv2d, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x, w, bias = (np.asarray(a) for a in inputs)
    acc = qconv_accumulate(x, w, op) + bias.astype(np.int64)[None, :, None, None]
    return finish(requantize(wrap_i32(acc), op.mult, op.out_zp), out)


def fake_quantize_scales(op: FakeQuantize, x: np.ndarray, state: np.ndarray | None) -> np.ndarray:
    """The per-channel scale `s[c]` FakeQuantize uses (channel = index along `axis`)."""
    q = np.float32(Q_MAX[op.bits])
    rows = x.reshape(1, -1) if op.axis is None else np.moveaxis(x, op.axis, 0).reshape(x.shape[op.axis], -1)
    current = (np.abs(rows).max(axis=1) if rows.size else np.zeros(rows.shape[0], np.float32)) / q
    mode = op.scale_mode
    if mode.kind is ScaleModeKind.PER_BATCH:
        return np.maximum(current, np.float32(MIN_SCALE)).astype(np.float32)
    assert state is not None
    st = state.astype(np.float32).reshape(-1)
    if st.size != current.size:
        raise EvaluationError("FakeQuantize state has the wrong size", [f"{st.size} values for {current.size} channels"])
    if mode.kind is ScaleModeKind.FIXED:
        return np.maximum(st, np.float32(MIN_SCALE))
    decay = np.float32(mode.decay)
    blended = decay * st + (np.float32(1.0) - decay) * current
    return np.where(st <= 0, current, blended).astype(np.float32)


@reference_kernel(FakeQuantize)
def _fake_quantize(op: FakeQuantize, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = np.asarray(inputs[0]).astype(np.float32)
    scales = fake_quantize_scales(op, x, inputs[1] if len(inputs) == 2 else None)
    q = np.float32(Q_MAX[op.bits])
    shape = [1] * x.ndim
    if op.axis is not None:
        shape[op.axis] = x.shape[op.axis]
    s = scales.reshape(shape) if op.axis is not None else scales.reshape(())
    safe = np.where(s > 0, s, np.float32(1.0))
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.clip(round_half_away(x / safe), -q, q) * s
    return finish(y, out)
