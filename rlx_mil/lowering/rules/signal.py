"""Histogram, SplineActivation, Im2Col, PartitionedConv and Fft in MIL: comparisons and sums,
one `gather` of patches, a `conv` with the reversed response, and the DFT as one `linear`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlx_mil.errors import ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops.signal import im2col_out
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.rules.training import decomposed
from rlx_mil.reference.signal import spline_basis_centers

#: Largest N the DFT form takes: its [2N, 2N] matrix is 16 MB of fp32 at N = 1024.
FFT_MAX_N = 1024


def _fp32_source(var: Any) -> Any:
    """The fp32 program input behind a cast to fp16, so counting reads the values as fed."""
    source = getattr(var, "op", None)
    if source is not None and source.op_type == "cast" and str(source.x.dtype).endswith("fp32"):
        return source.x
    return var


@lowering(
    notes=(
        "flattened; bucket = floor((x - min) / (max - min) * bins) (`sub`, `real_div`, `mul`, `floor`,"
        " `cast`, `minimum` bins-1), in-range mask (`greater_equal`/`less_equal`: NaN and outliers drop),"
        " `equal` against the bucket ids, `logical_and`, `cast`, `reduce_sum`. An fp32 program input"
        " is counted in fp32 under fp16 precision."
    ),
)
def lower_histogram(op: ops.Histogram, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    x = _fp32_source(ctx.var(0))
    dtype = np.float32 if str(x.dtype).endswith("fp32") else ctx.float_dtype
    flat = mb.reshape(x=x, shape=np.asarray([-1], np.int32), name=ctx.name("flat"))
    lo, hi = dtype(op.min), dtype(op.max)
    t = mb.mul(x=mb.real_div(x=mb.sub(x=flat, y=lo, name=ctx.name("shift")), y=dtype(hi - lo), name=ctx.name("unit")),
               y=dtype(op.bins), name=ctx.name("scaled"))
    bucket = mb.cast(x=mb.floor(x=t, name=ctx.name("floor")), dtype="int32", name=ctx.name("bucket_int"))
    bucket = mb.minimum(x=bucket, y=np.int32(op.bins - 1), name=ctx.name("bucket"))
    inside = mb.logical_and(x=mb.greater_equal(x=flat, y=lo, name=ctx.name("ge")),
                            y=mb.less_equal(x=flat, y=hi, name=ctx.name("le")), name=ctx.name("inside"))
    ids = np.arange(op.bins, dtype=np.int32).reshape(1, -1)
    hit = mb.equal(x=mb.expand_dims(x=bucket, axes=[1], name=ctx.name("col")), y=ids, name=ctx.name("hit"))
    hit = mb.logical_and(x=hit, y=mb.expand_dims(x=inside, axes=[1], name=ctx.name("inside_col")), name=ctx.name("counted"))
    counts = mb.reduce_sum(x=mb.cast(x=hit, dtype="int32", name=ctx.name("ones")), axes=[0], keep_dims=False,
                           name=ctx.name("counts"))
    return mb.cast(x=counts, dtype=ctx.mil_float, name=ctx.name())


@lowering(
    notes=(
        "x[.., C, 1] minus the G centers (`expand_dims`, `sub`), times 1/h, `mul` by itself, `mul` -1,"
        " `exp`, `mul` by coeff [C, G], `reduce_sum` over G."
    ),
)
def lower_spline_activation(op: ops.SplineActivation, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    centers, inv_h = spline_basis_centers(op)
    z = mb.sub(x=mb.expand_dims(x=ctx.var(0), axes=[-1], name=ctx.name("col")), y=centers.astype(ctx.float_dtype),
               name=ctx.name("offset"))
    z = mb.mul(x=z, y=ctx.scalar(float(inv_h)), name=ctx.name("z"))
    basis = mb.exp(x=mb.mul(x=mb.mul(x=z, y=z, name=ctx.name("z2")), y=ctx.scalar(-1.0), name=ctx.name("neg")),
                   name=ctx.name("basis"))
    coeff = ctx.known_value(1)
    weights = ctx.const(coeff, "coeff") if coeff is not None else ctx.var(1)
    return mb.reduce_sum(x=mb.mul(x=basis, y=weights, name=ctx.name("weighted")), axes=[-1], keep_dims=False,
                         name=ctx.name())


@lowering(
    notes=(
        "`pad` with zeros, `reshape` to [N, C*Hp*Wp], one `gather` of every patch element (indices"
        " computed at conversion), `reshape` to [N*Ho*Wo, C*kH*kW]."
    ),
)
def lower_im2col(op: ops.Im2Col, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    n, c, h, w = ctx.input_shape(0).sizes()
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = op.kernel_size, op.stride, op.padding, op.dilation
    ho, wo = im2col_out(op, h, w)
    hp, wp = h + 2 * ph, w + 2 * pw
    x = ctx.var(0)
    if ph or pw:
        x = mb.pad(x=x, pad=np.asarray([0, 0, 0, 0, ph, ph, pw, pw], np.int32), mode="constant", name=ctx.name("padded"))
    flat = mb.reshape(x=x, shape=np.asarray([n, c * hp * wp], np.int32), name=ctx.name("flat"))
    rows = (np.arange(ho) * sh)[:, None, None, None, None] + (np.arange(kh) * dh)[None, None, None, :, None]
    cols = (np.arange(wo) * sw)[None, :, None, None, None] + (np.arange(kw) * dw)[None, None, None, None, :]
    chan = np.arange(c)[None, None, :, None, None]
    index = (chan * hp * wp + rows * wp + cols).reshape(ho * wo, c * kh * kw).astype(np.int32)
    patches = mb.gather(x=flat, indices=index, axis=1, name=ctx.name("patches"))
    return mb.reshape(x=patches, shape=np.asarray([n * ho * wo, c * kh * kw], np.int32), name=ctx.name())


@lowering(
    notes=(
        "the direct form, decomposed in IR: `Reshape` to [B, 1, L], `Conv` (1-D, padding M-1 on both"
        " sides) with the `Reverse`d response as its [1, 1, M] weight, `Reshape` back to [.., L + M - 1]."
    ),
)
def lower_partitioned_conv(op: ops.PartitionedConv, ctx: LowerContext) -> Any:
    sizes = ctx.input_shape(0).sizes()
    taps = ctx.input_shape(1).sizes()[0]
    rows = math.prod(sizes[:-1])

    def build(g: Graph, ins: list[int]) -> int:
        x = g.reshape(ins[0], [rows, 1, sizes[-1]])
        weight = g.reshape(g.reverse(ins[1], 0), [1, 1, taps])
        y = g.conv(x, weight, stride=[1], padding=[taps - 1], dilation=[1])
        return g.reshape(y, [*sizes[:-1], sizes[-1] + taps - 1])

    return decomposed(ctx, build)


def dft_matrix(n: int, inverse: bool, scale: float) -> np.ndarray:
    """`W [2N, 2N]` with `[re, im] @ W` the (scaled) DFT in the real-block layout."""
    k = np.arange(n)
    angle = 2 * np.pi * (np.outer(k, k) % n) / n
    cos, sin = np.cos(angle), np.sin(angle) * (-1.0 if inverse else 1.0)
    return np.block([[cos, -sin], [sin, cos]]) * scale


@lowering(
    notes=(
        f"the real-block layout as one `linear` with the [2N, 2N] DFT matrix (cosines and signed sines,"
        f" the norm's scale folded in; computed in float64 at conversion) for N <= {FFT_MAX_N}; larger N"
        " is refused by name. A C64 Fft (the interleaved form) is read as this one between `reshape` /"
        " `transpose` pairs that move the re, im lanes into blocks and back (ir/serde/complex.py)."
    ),
)
def lower_fft(op: ops.Fft, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    n = sizes[-1] // 2
    if n > FFT_MAX_N:
        raise ctx.fail(ShapeError, f"Fft of N = {n} points: the DFT form takes N <= {FFT_MAX_N}", "x")
    weight = dft_matrix(n, op.inverse, op.norm.scale(n, op.inverse))
    x = ctx.var(0)
    if len(sizes) > 3 or len(sizes) == 1:
        x = mb.reshape(x=x, shape=np.asarray([-1, 2 * n], np.int32), name=ctx.name("rows"))
    y = mb.linear(x=x, weight=weight.T.astype(ctx.float_dtype), name=ctx.name("dft"))
    if len(sizes) > 3 or len(sizes) == 1:
        y = mb.reshape(x=y, shape=np.asarray(sizes, np.int32), name=ctx.name())
    return y


@lowering(
    notes=(
        "`reshape` to [B, groups, 2, stride, 2], `slice_by_index` of the pair halves and re/im lanes,"
        " the complex product with the twiddles (`mul`, `sub`, `add`), `select` by rev >= 0.5 and"
        " gate != 0, `concat` and `reshape` back (gate/rev/twiddles read as [groups, stride])."
    ),
)
def lower_fft_butterfly_stage(op: ops.FftButterflyStage, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    batch, stride = sizes[0], 1 << op.stage
    groups = op.n_fft // (2 * stride)
    z = mb.reshape(x=ctx.var(0), shape=np.asarray([batch, groups, 2, stride, 2], np.int32), name=ctx.name("pairs"))

    def part(half: int, lane: int, tag: str) -> Any:
        piece = mb.slice_by_index(x=z, begin=np.asarray([0, 0, half, 0, lane], np.int32),
                                  end=np.asarray([batch, groups, half + 1, stride, lane + 1], np.int32),
                                  name=ctx.name(tag))
        return mb.reshape(x=piece, shape=np.asarray([batch, groups, stride], np.int32), name=ctx.name(f"{tag}_r"))

    def table(i: int, tag: str) -> Any:
        return mb.reshape(x=ctx.var(i), shape=np.asarray([1, groups, stride], np.int32), name=ctx.name(tag))

    a_re, a_im, b_re, b_im = part(0, 0, "a_re"), part(0, 1, "a_im"), part(1, 0, "b_re"), part(1, 1, "b_im")
    gate, rev, w_re, w_im = table(1, "gate"), table(2, "rev"), table(3, "w_re"), table(4, "w_im")
    bw_re = mb.sub(x=mb.mul(x=b_re, y=w_re, name=ctx.name("rr")), y=mb.mul(x=b_im, y=w_im, name=ctx.name("ii")),
                   name=ctx.name("bw_re"))
    bw_im = mb.add(x=mb.mul(x=b_re, y=w_im, name=ctx.name("ri")), y=mb.mul(x=b_im, y=w_re, name=ctx.name("ir")),
                   name=ctx.name("bw_im"))
    swap = mb.greater_equal(x=rev, y=ctx.scalar(0.5), name=ctx.name("swap"))
    active = mb.not_equal(x=gate, y=ctx.scalar(0.0), name=ctx.name("active"))
    lanes = []
    for lane, (a, bw, b) in enumerate(((a_re, bw_re, b_re), (a_im, bw_im, b_im))):
        top = mb.add(x=a, y=bw, name=ctx.name(f"top{lane}"))
        bot = mb.sub(x=a, y=bw, name=ctx.name(f"bot{lane}"))
        first = mb.select(cond=active, a=mb.select(cond=swap, a=bot, b=top, name=ctx.name(f"f{lane}")), b=a,
                          name=ctx.name(f"first{lane}"))
        second = mb.select(cond=active, a=mb.select(cond=swap, a=top, b=bot, name=ctx.name(f"s{lane}")), b=b,
                           name=ctx.name(f"second{lane}"))
        lanes.append((first, second))
    halves = [mb.stack(values=[lanes[0][h], lanes[1][h]], axis=3, name=ctx.name(f"half{h}")) for h in (0, 1)]
    stacked = mb.stack(values=halves, axis=2, name=ctx.name("stacked"))  # [B, groups, 2, stride, 2]
    return mb.reshape(x=stacked, shape=np.asarray(sizes, np.int32), name=ctx.name())


def _static_pairs(ctx: LowerContext) -> tuple[list[int], Any]:
    """The interleaved operand's sizes and its `[.., n, 2]` view."""
    from coremltools.converters.mil import Builder as mb

    shape = ctx.input_shape(0)
    if not shape.is_static:
        raise ctx.fail(ShapeError, f"interleaved complex x {shape} must be static", "x")
    sizes = list(shape.sizes())
    view = [*sizes[:-1], sizes[-1] // 2, 2]
    return sizes, mb.reshape(x=ctx.var(0), shape=np.asarray(view, np.int32), name=ctx.name("pairs"))


@lowering(
    notes=(
        "C64 as interleaved F32 pairs [.., 2n] (upstream's Core ML promotion): `reshape` to [.., n, 2],"
        " `mul` by itself, `reduce_sum` over the pair axis (re^2 + im^2)."
    ),
)
def lower_complex_norm_sq(op: ops.ComplexNormSq, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    _, pairs = _static_pairs(ctx)
    squares = mb.mul(x=pairs, y=pairs, name=ctx.name("squares"))
    return mb.reduce_sum(x=squares, axes=[-1], keep_dims=False, name=ctx.name())


@lowering(
    notes="C64 as interleaved F32 pairs [.., 2n]: `reshape` to [.., n, 2], `mul` by the const [1, -1], `reshape` back.",
)
def lower_conjugate(op: ops.Conjugate, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes, pairs = _static_pairs(ctx)
    signs = ctx.const(np.asarray([1.0, -1.0], np.float32), "signs")
    flipped = mb.mul(x=pairs, y=signs, name=ctx.name("flipped"))
    return mb.reshape(x=flipped, shape=np.asarray(sizes, np.int32), name=ctx.name())


#: Most one-sided bins WelchPeaks ranks: its pairwise comparison is [batch, bins, bins].
WELCH_MAX_BINS = 1025


@lowering(
    notes=(
        "the PSD: `reshape` to [B, S, 2N], `mul` by itself, `slice_by_index` of the re/im halves' first"
        " N/2+1 bins, `add`, `mul` by the one-sided weights / S, `reduce_sum` over S; the top-k as ranks:"
        " rank_i = #(p_j > p_i) + #(j < i, p_j == p_i) (`greater`, `equal`, a triangular const,"
        " `logical_or`, `cast`, `reduce_sum`), slot r takes the bin whose rank is r (`equal` with"
        " arange(k), `mul`, `reduce_sum`), `stack` (bin, power) and `reshape` to [B, 2k]. Ties go to the"
        " lower bin as upstream's insertion; N/2+1 <= 1025 bins (larger is refused by name)."
    ),
)
def lower_welch_peaks(op: ops.WelchPeaks, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    rows, width = ctx.input_shape(0).sizes()
    n_fft, batch = width // 2, rows // op.n_segments
    bins = n_fft // 2 + 1
    if bins > WELCH_MAX_BINS:
        raise ctx.fail(ShapeError, f"WelchPeaks of n_fft = {n_fft}: the rank form takes at most"
                                   f" {WELCH_MAX_BINS} one-sided bins", "spectrum")
    segs = mb.reshape(x=ctx.var(0), shape=np.asarray([batch, op.n_segments, width], np.int32), name=ctx.name("segs"))
    squares = mb.mul(x=segs, y=segs, name=ctx.name("squares"))

    def half(start: int, tag: str) -> Any:
        return mb.slice_by_index(x=squares, begin=np.asarray([0, 0, start], np.int32),
                                 end=np.asarray([batch, op.n_segments, start + bins], np.int32), name=ctx.name(tag))

    power = mb.add(x=half(0, "re2"), y=half(n_fft, "im2"), name=ctx.name("power"))
    weight = np.full(bins, 2.0 / op.n_segments, np.float64)
    weight[0] = weight[-1] = 1.0 / op.n_segments
    weighted = mb.mul(x=power, y=weight.astype(ctx.float_dtype), name=ctx.name("weighted"))
    psd = mb.reduce_sum(x=weighted, axes=[1], keep_dims=False, name=ctx.name("psd"))  # [B, bins]
    p_i = mb.expand_dims(x=psd, axes=[2], name=ctx.name("p_i"))
    p_j = mb.expand_dims(x=psd, axes=[1], name=ctx.name("p_j"))
    earlier = np.tril(np.ones((bins, bins), bool), k=-1)  # [i, j]: j < i
    ahead = mb.logical_or(
        x=mb.greater(x=p_j, y=p_i, name=ctx.name("greater")),
        y=mb.logical_and(x=mb.equal(x=p_j, y=p_i, name=ctx.name("tie")), y=earlier, name=ctx.name("tie_before")),
        name=ctx.name("ahead"))
    rank = mb.reduce_sum(x=mb.cast(x=ahead, dtype="int32", name=ctx.name("ahead_int")), axes=[2], keep_dims=True,
                         name=ctx.name("rank"))  # [B, bins, 1]
    slots = np.arange(op.k, dtype=np.int32).reshape(1, 1, -1)
    pick = mb.cast(x=mb.equal(x=rank, y=slots, name=ctx.name("is_slot")), dtype=ctx.mil_float,
                   name=ctx.name("pick"))  # [B, bins, k]
    ids = np.arange(bins, dtype=np.float64).reshape(1, -1, 1).astype(ctx.float_dtype)
    peak_bins = mb.reduce_sum(x=mb.mul(x=pick, y=ids, name=ctx.name("bin_terms")), axes=[1], keep_dims=False,
                              name=ctx.name("bins"))
    peak_power = mb.reduce_sum(x=mb.mul(x=pick, y=p_i, name=ctx.name("power_terms")), axes=[1], keep_dims=False,
                               name=ctx.name("powers"))
    pairs = mb.stack(values=[peak_bins, peak_power], axis=2, name=ctx.name("pairs"))
    return mb.reshape(x=pairs, shape=np.asarray([batch, 2 * op.k], np.int32), name=ctx.name())
