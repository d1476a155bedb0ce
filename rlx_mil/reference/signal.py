"""Reference kernels of Histogram, SplineActivation, Im2Col, PartitionedConv and Fft."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx_mil.ir.ops.signal import (
    ComplexNormSq,
    Conjugate,
    Fft,
    FftButterflyStage,
    Histogram,
    Im2Col,
    PartitionedConv,
    SplineActivation,
    WelchPeaks,
    im2col_out,
)
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import finish, float_operands, reference_kernel


def histogram_bins(op: Histogram, x: np.ndarray) -> np.ndarray:
    """Bucket of each in-range value: `floor((x - min) / (max - min) * bins)` in float32,
    `x == max` in the last bucket; out-of-range values and NaN are left out."""
    v = np.asarray(x, np.float32).reshape(-1)
    lo, hi = np.float32(op.min), np.float32(op.max)
    kept = v[(v >= lo) & (v <= hi)]
    with np.errstate(invalid="ignore"):
        at = np.floor((kept - lo) / (hi - lo) * np.float32(op.bins)).astype(np.int64)
    return np.minimum(at, op.bins - 1)


@reference_kernel(Histogram)
def _histogram(op: Histogram, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(np.bincount(histogram_bins(op, inputs[0]), minlength=op.bins).astype(np.float32), out)


def spline_basis_centers(op: SplineActivation) -> tuple[np.ndarray, np.float32]:
    """The float32 RBF centers and 1/h: centers `grid_min + g (grid_max - grid_min) / (G - 1)`."""
    g = op.num_basis
    span = np.float32(op.grid_max) - np.float32(op.grid_min)
    step = span / np.float32(max(g - 1, 1))
    centers = np.float32(op.grid_min) + np.arange(g, dtype=np.float32) * step
    return centers.astype(np.float32), np.float32(g - 1) / span


@reference_kernel(SplineActivation)
def _spline_activation(op: SplineActivation, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x, coeff = float_operands(*inputs)
    centers, inv_h = spline_basis_centers(op)
    z = (x[..., None] - centers) * inv_h
    with np.errstate(over="ignore", under="ignore"):
        return finish(np.sum(coeff * np.exp(-(z * z)), axis=-1), out)


@reference_kernel(Im2Col)
def _im2col(op: Im2Col, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = np.asarray(inputs[0])
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = op.kernel_size, op.stride, op.padding, op.dilation
    ho, wo = im2col_out(op, h, w)
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    cols = np.empty((n, ho, wo, c, kh, kw), x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[..., i, j] = padded[:, :, i * dh: i * dh + sh * (ho - 1) + 1: sh,
                                     j * dw: j * dw + sw * (wo - 1) + 1: sw].transpose(0, 2, 3, 1)
    return finish(cols.reshape(n * ho * wo, c * kh * kw), out)


@reference_kernel(PartitionedConv)
def _partitioned_conv(op: PartitionedConv, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x, ir = float_operands(*inputs)
    rows = x.reshape(-1, x.shape[-1])
    y = np.stack([np.convolve(row, ir) for row in rows]) if rows.shape[0] else np.zeros((0, x.shape[-1] + ir.size - 1))
    return finish(y.reshape((*x.shape[:-1], x.shape[-1] + ir.size - 1)), out)


@reference_kernel(Fft)
def _fft(op: Fft, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = np.asarray(inputs[0]).astype(np.float64)
    n = x.shape[-1] // 2
    z = x[..., :n] + 1j * x[..., n:]
    y = (np.fft.ifft(z, axis=-1) * n if op.inverse else np.fft.fft(z, axis=-1)) * op.norm.scale(n, op.inverse)
    return finish(np.concatenate([y.real, y.imag], axis=-1), out)


@reference_kernel(FftButterflyStage)
def _fft_butterfly_stage(op: FftButterflyStage, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    state = np.asarray(inputs[0], np.float32)
    gate, rev, tw_re, tw_im = (np.asarray(v, np.float32) for v in inputs[1:])
    stride = 1 << op.stage
    groups = op.n_fft // (2 * stride)
    z = state.reshape(state.shape[0], groups, 2, stride, 2)
    a, b = z[:, :, 0], z[:, :, 1]  # [B, groups, stride, 2]
    w_re, w_im = (t.reshape(1, groups, stride) for t in (tw_re, tw_im))
    bw_re = b[..., 0] * w_re - b[..., 1] * w_im
    bw_im = b[..., 0] * w_im + b[..., 1] * w_re
    top = np.stack([a[..., 0] + bw_re, a[..., 1] + bw_im], axis=-1)
    bot = np.stack([a[..., 0] - bw_re, a[..., 1] - bw_im], axis=-1)
    swap = (rev.reshape(1, groups, stride, 1) >= 0.5)
    first, second = np.where(swap, bot, top), np.where(swap, top, bot)
    active = gate.reshape(1, groups, stride, 1) != 0
    result = np.stack([np.where(active, first, a), np.where(active, second, b)], axis=2)
    return finish(result.reshape(state.shape), out)


@reference_kernel(ComplexNormSq)
def _complex_norm_sq(op: ComplexNormSq, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    z = np.asarray(inputs[0], np.float32)
    pairs = z.reshape((*z.shape[:-1], z.shape[-1] // 2, 2))
    return finish(pairs[..., 0] * pairs[..., 0] + pairs[..., 1] * pairs[..., 1], out)


@reference_kernel(Conjugate)
def _conjugate(op: Conjugate, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    z = np.array(inputs[0], np.float32)
    z[..., 1::2] = -z[..., 1::2]
    return finish(z, out)


def welch_psd(op: WelchPeaks, spectrum: np.ndarray) -> np.ndarray:
    """`[batch, n_fft / 2 + 1]` one-sided power averaged over segments, summed in float32 in
    upstream's order (segment by segment, `scale * 2 * |X|^2` inside, `scale * |X|^2` at the ends)."""
    x = np.asarray(spectrum, np.float32)
    n_fft = x.shape[1] // 2
    n_bins = n_fft // 2 + 1
    segs = x.reshape(-1, op.n_segments, 2 * n_fft)
    inv = np.float32(1.0 / op.n_segments)
    weight = np.full(n_bins, inv * np.float32(2.0), np.float32)
    weight[0] = inv
    weight[n_bins - 1] = inv if n_bins > 1 else weight[n_bins - 1]
    psd = np.zeros((segs.shape[0], n_bins), np.float32)
    for s in range(op.n_segments):
        re, im = segs[:, s, :n_bins], segs[:, s, n_fft:n_fft + n_bins]
        psd = psd + weight * (re * re + im * im)
    return psd


@reference_kernel(WelchPeaks)
def _welch_peaks(op: WelchPeaks, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    psd = welch_psd(op, inputs[0])
    taken = min(op.k, psd.shape[1])
    order = np.argsort(-psd, axis=1, kind="stable")[:, :taken]
    peaks = np.zeros((psd.shape[0], op.k, 2), np.float32)
    peaks[:, :taken, 0] = order
    peaks[:, :taken, 1] = np.take_along_axis(psd, order, axis=1)
    return finish(peaks.reshape(psd.shape[0], 2 * op.k), out)
