"""Signal and feature ops: Histogram, SplineActivation (KAN), Im2Col, PartitionedConv and the
real-block Fft. Newest upstream JSON only; the contract is upstream's `op.rs` documentation,
decisions in docs/upstream-ops-3.md."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import AttributeValueError, DTypeError, ShapeError
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import BinaryArityOp, Op, UnaryOp, collect_ops, fix_f32
from rlx_mil.ir.serde.codecs import BOOL, F32, U32, USIZE, USIZE_VEC, EnumCodec, struct_form, unit_form
from rlx_mil.ir.serde.versions import NEWEST
from rlx_mil.ir.shape import Dim, Shape, Static
from rlx_mil.ir.shape_checks import conflict, require_float, require_rank


class FftNorm(enum.Enum):
    """Backward: unscaled both ways; Forward: the inverse scaled by 1/N; Ortho: 1/sqrt(N) both."""

    BACKWARD = "Backward"
    FORWARD = "Forward"
    ORTHO = "Ortho"

    def scale(self, n: int, inverse: bool) -> float:
        if self is FftNorm.ORTHO:
            return 1.0 / math.sqrt(n)
        return 1.0 / n if self is FftNorm.FORWARD and inverse else 1.0


@dataclass(frozen=True)
class Histogram(UnaryOp):
    """Counts of `x` in `bins` equal-width buckets over `[min, max]` (F32 `[bins]`); values outside
    (and NaN) are dropped, `x == max` lands in the last bucket."""

    type_name: ClassVar[str] = "Histogram"
    bins: int
    min: float
    max: float

    def __post_init__(self) -> None:
        super().__post_init__()
        fix_f32(self, "min", "max")


@dataclass(frozen=True)
class SplineActivation(BinaryArityOp):
    """KAN spline: `y[.., c] = sum_g coeff[c, g] * exp(-((x[.., c] - center_g) * inv_h)^2)`."""

    type_name: ClassVar[str] = "SplineActivation"
    num_basis: int
    grid_min: float
    grid_max: float

    def __post_init__(self) -> None:
        super().__post_init__()
        fix_f32(self, "grid_min", "grid_max")

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "coeff")


@dataclass(frozen=True)
class Im2Col(UnaryOp):
    """NCHW patches: `[N, C, H, W]` -> `[N * Ho * Wo, C * kH * kW]` (rows n, ho, wo; columns c,
    kh, kw), zero padding."""

    type_name: ClassVar[str] = "Im2Col"
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]


@dataclass(frozen=True)
class PartitionedConv(BinaryArityOp):
    """The full linear convolution of `x [.., L]` with `ir [M]`: `[.., L + M - 1]`. `block` only
    sizes upstream's overlap-save partitions; the value is the direct convolution."""

    type_name: ClassVar[str] = "PartitionedConv"
    block: int

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "ir")


@dataclass(frozen=True)
class Fft(UnaryOp):
    """1-D DFT along the last axis in the real-block layout `[re_0..re_{N-1}, im_0..im_{N-1}]`:
    `X[k] = sum_n x[n] exp(-+2 pi i n k / N)` (+ for the inverse), scaled per `norm`."""

    type_name: ClassVar[str] = "Fft"
    inverse: bool
    norm: FftNorm


@dataclass(frozen=True)
class FftButterflyStage(Op):
    """One radix-2 stage on interleaved complex `state [batch, n_fft * 2]` (or `[batch, n_fft, 2]`):
    with `stride = 2^stage`, butterfly `f = group * stride + j` pairs element
    `a = group * 2 * stride + j` with `b = a + stride`; where `gate[f] != 0` it writes
    `(a + w b, a - w b)` (swapped where `rev[f] >= 0.5`, `w = tw_re[f] + i tw_im[f]`), else copies."""

    type_name: ClassVar[str] = "FftButterflyStage"
    stage: int
    n_fft: int

    def arity(self) -> int | None:
        return 5

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("state", "gate", "rev", "tw_re", "tw_im")


@dataclass(frozen=True)
class ComplexNormSq(UnaryOp):
    """`|z|^2 = re^2 + im^2` of C64 values held as interleaved F32 pairs: `[.., 2n]` -> `[.., n]`
    (upstream's Core ML promotion of a C64 `[.., n]`)."""

    type_name: ClassVar[str] = "ComplexNormSq"


@dataclass(frozen=True)
class Conjugate(UnaryOp):
    """The complex conjugate of interleaved F32 pairs `[.., 2n]`: each odd (imaginary) lane negated."""

    type_name: ClassVar[str] = "Conjugate"


@dataclass(frozen=True)
class WelchPeaks(UnaryOp):
    """Top-`k` bins of the Welch PSD of block-layout segment spectra `[batch * n_segments, 2 * n_fft]`:
    the one-sided power (`|X|^2`, doubled except at DC and Nyquist) averaged over each row's
    `n_segments` segments; `[batch, 2k]` interleaved `(bin, power)`, power descending, ties to the
    lower bin, slots past `n_fft / 2 + 1` bins left 0 (upstream's `welch_peaks_block_f32`)."""

    type_name: ClassVar[str] = "WelchPeaks"
    k: int
    n_segments: int


# -------------------------------------------------------------------------------- shape rules


def _interleaved(op: Op, x: Shape) -> int:
    """n of an interleaved `[.., 2n]` F32 operand (C64 `[.., n]` promoted as upstream's Core ML does)."""
    if x.dtype is not DType.F32:
        raise DTypeError(f"{op.type_name} takes C64 as interleaved F32 pairs [.., 2n]; got {x.dtype.value}",
                         operand="x")
    require_rank(x, "x", minimum=1)
    last: Dim = x.dims[-1]
    if not isinstance(last, Static) or last.size < 2 or last.size % 2:
        raise ShapeError(f"the last dim of x {x} must be 2n (re, im pairs)", operand="x")
    return last.size // 2


@shape_rule(ComplexNormSq)
def _complex_norm_sq(op: ComplexNormSq, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    n = _interleaved(op, ins[0])
    return Shape((*ins[0].dims[:-1], Static(n)), DType.F32)


@shape_rule(Conjugate)
def _conjugate(op: Conjugate, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    _interleaved(op, ins[0])
    return ins[0]


@shape_rule(Histogram)
def _histogram(op: Histogram, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    if not isinstance(op.bins, int) or isinstance(op.bins, bool) or op.bins < 1:
        raise AttributeValueError(f"bins must be an integer >= 1, got {op.bins!r}")
    if not (math.isfinite(op.min) and math.isfinite(op.max) and op.max > op.min):
        raise AttributeValueError(f"need finite min < max, got [{op.min}, {op.max}]")
    require_float(ins[0], "x", op.type_name)
    return Shape((Static(op.bins),), DType.F32)


@shape_rule(SplineActivation)
def _spline_activation(op: SplineActivation, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, coeff = ins
    if not isinstance(op.num_basis, int) or isinstance(op.num_basis, bool) or op.num_basis < 1:
        raise AttributeValueError(f"num_basis must be an integer >= 1, got {op.num_basis!r}")
    if not (math.isfinite(op.grid_min) and math.isfinite(op.grid_max) and op.grid_max > op.grid_min):
        raise AttributeValueError(f"need finite grid_min < grid_max, got [{op.grid_min}, {op.grid_max}]")
    require_rank(x, "x", minimum=1)
    require_float(x, "x", op.type_name)
    require_rank(coeff, "coeff", exact=(2,))
    if conflict(coeff.dims[0], x.dims[-1]) or conflict(coeff.dims[1], Static(op.num_basis)):
        raise ShapeError(f"coeff {coeff} must be [C = {x.dims[-1]}, num_basis = {op.num_basis}]", operand="coeff")
    return x


def _pairs(op: Im2Col) -> tuple[tuple[int, int, int, int], ...]:
    values = (op.kernel_size, op.stride, op.padding, op.dilation)
    names = ("kernel_size", "stride", "padding", "dilation")
    for value, name in zip(values, names, strict=True):
        if len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise AttributeValueError(f"{name} must be two integers (H, W), got {list(value)}")
        if name != "padding" and min(value) < 1:
            raise AttributeValueError(f"{name} must be >= 1, got {list(value)}")
        if name == "padding" and min(value) < 0:
            raise AttributeValueError(f"padding must be >= 0, got {list(value)}")
    return tuple(zip(*values, strict=True))  # (k, s, p, d) per spatial axis


def im2col_out(op: Im2Col, height: int, width: int) -> tuple[int, int]:
    outs = []
    for size, (k, s, p, d) in zip((height, width), _pairs(op), strict=True):
        span = size + 2 * p - d * (k - 1) - 1
        if span < 0:
            raise ShapeError(f"the dilated kernel {k} (dilation {d}) does not fit the padded size {size + 2 * p}",
                             operand="x")
        outs.append(span // s + 1)
    return outs[0], outs[1]


@shape_rule(Im2Col)
def _im2col(op: Im2Col, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    require_rank(x, "x", exact=(4,))
    _pairs(op)
    if not x.is_static:
        raise ShapeError(f"x {x} must be static", operand="x")
    n, c, h, w = x.sizes()
    ho, wo = im2col_out(op, h, w)
    return Shape((Static(n * ho * wo), Static(c * op.kernel_size[0] * op.kernel_size[1])), x.dtype)


@shape_rule(PartitionedConv)
def _partitioned_conv(op: PartitionedConv, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, ir = ins
    if not isinstance(op.block, int) or isinstance(op.block, bool) or op.block < 1:
        raise AttributeValueError(f"block must be an integer >= 1, got {op.block!r}")
    require_rank(x, "x", minimum=1)
    require_rank(ir, "ir", exact=(1,))
    require_float(x, "x", op.type_name)
    if ir.dtype is not x.dtype:
        raise DTypeError(f"ir is {ir.dtype.value} but x is {x.dtype.value}", operand="ir")
    length, taps = x.dims[-1], ir.dims[0]
    if not (isinstance(length, Static) and isinstance(taps, Static)) or taps.size < 1:
        raise ShapeError(f"x {x} and ir {ir} need static, non-empty lengths", operand="ir")
    return Shape((*x.dims[:-1], Static(length.size + taps.size - 1)), x.dtype)


@shape_rule(Fft)
def _fft(op: Fft, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    if not isinstance(op.norm, FftNorm):
        raise AttributeValueError(f"norm must be an FftNorm, got {op.norm!r}")
    if x.dtype not in (DType.F32, DType.F64):
        raise DTypeError(f"Fft takes the F32/F64 real-block layout, got {x.dtype.value} (a C64 graph's"
                         " interleaved Fft is read into that layout)", operand="x")
    require_rank(x, "x", minimum=1)
    last: Dim = x.dims[-1]
    if not isinstance(last, Static) or last.size < 2 or last.size % 2:
        raise ShapeError(f"the last dim of x {x} must be 2N (N real parts, then N imaginary parts)", operand="x")
    return x


@shape_rule(FftButterflyStage)
def _fft_butterfly_stage(op: FftButterflyStage, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    state = ins[0]
    n = op.n_fft
    if not isinstance(n, int) or isinstance(n, bool) or n < 2 or n & (n - 1):
        raise AttributeValueError(f"n_fft must be a power of two >= 2, got {n!r}")
    if not isinstance(op.stage, int) or isinstance(op.stage, bool) or not 0 <= op.stage or 2 << op.stage > n:
        raise AttributeValueError(f"stage must satisfy 2^(stage+1) <= n_fft = {n}, got {op.stage!r}")
    if state.dtype is not DType.F32:
        raise DTypeError(f"state must be F32, got {state.dtype.value}", operand="state")
    shapes = ((Static(n * 2),), (Static(n), Static(2)))
    if state.rank not in (2, 3) or any(conflict(a, b) for a, b in zip(state.dims[1:], shapes[state.rank - 2], strict=True)):
        raise ShapeError(f"state {state} must be [batch, {2 * n}] or [batch, {n}, 2]", operand="state")
    for shape, role in zip(ins[1:], ("gate", "rev", "tw_re", "tw_im"), strict=True):
        if shape.rank != 1 or conflict(shape.dims[0], Static(n // 2)) or not shape.dtype.is_float:
            raise ShapeError(f"{role} {shape} must be float [n_fft / 2 = {n // 2}]", operand=role)
    return state


@shape_rule(WelchPeaks)
def _welch_peaks(op: WelchPeaks, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    for name in ("k", "n_segments"):
        value = getattr(op, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise AttributeValueError(f"{name} must be an integer >= 1, got {value!r}")
    if x.dtype is not DType.F32:
        raise DTypeError(f"WelchPeaks takes an F32 spectrum, got {x.dtype.value}", operand="spectrum")
    require_rank(x, "spectrum", exact=(2,))
    if not x.is_static or x.sizes()[1] % 2 or x.sizes()[0] % op.n_segments:
        raise ShapeError(f"spectrum {x} must be static [batch * n_segments ({op.n_segments}), 2 * n_fft]",
                         operand="spectrum")
    return Shape((Static(x.sizes()[0] // op.n_segments), Static(2 * op.k)), DType.F32)


# -------------------------------------------------------------------------------- builder


def _pair(value: int | Sequence[int]) -> tuple[int, ...]:
    return (value, value) if isinstance(value, int) else tuple(value)


class SignalBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def histogram(self, x: int, bins: int, min: float, max: float, *, name: str | None = None) -> int:
        """Counts of `x` in `bins` equal buckets over `[min, max]`."""
        return self.add_node(Histogram(bins, min, max), [x], name=name)

    def spline_activation(self, x: int, coeff: int, num_basis: int, grid_min: float, grid_max: float, *,
                          name: str | None = None) -> int:
        """Per-channel Gaussian-RBF spline with coefficients `coeff [C, num_basis]`."""
        return self.add_node(SplineActivation(num_basis, grid_min, grid_max), [x, coeff], name=name)

    def im2col(self, x: int, kernel_size: int | Sequence[int], stride: int | Sequence[int] = 1,
               padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, *, name: str | None = None) -> int:
        """`[N * Ho * Wo, C * kH * kW]` patches of NCHW `x`."""
        op = Im2Col(_pair(kernel_size), _pair(stride), _pair(padding), _pair(dilation))
        return self.add_node(op, [x], name=name)

    def partitioned_conv(self, x: int, ir: int, block: int = 64, *, name: str | None = None) -> int:
        """The full linear convolution of `x` (last axis) with `ir`."""
        return self.add_node(PartitionedConv(block), [x, ir], name=name)

    def fft_butterfly_stage(self, state: int, gate: int, rev: int, tw_re: int, tw_im: int, stage: int, n_fft: int,
                            *, name: str | None = None) -> int:
        """One gated radix-2 butterfly stage of interleaved complex `state`."""
        return self.add_node(FftButterflyStage(stage, n_fft), [state, gate, rev, tw_re, tw_im], name=name)

    def fft(self, x: int, inverse: bool = False, norm: FftNorm | str = FftNorm.BACKWARD, *,
            name: str | None = None) -> int:
        """DFT of the real-block `[.., 2N]` `x` along its last axis."""
        return self.add_node(Fft(inverse, norm if isinstance(norm, FftNorm) else FftNorm(norm)), [x], name=name)

    def complex_norm_sq(self, z: int, *, name: str | None = None) -> int:
        """`re^2 + im^2` of interleaved complex `z [.., 2n]`: `[.., n]`."""
        return self.add_node(ComplexNormSq(), [z], name=name)

    def conjugate(self, z: int, *, name: str | None = None) -> int:
        """The conjugate of interleaved complex `z [.., 2n]`."""
        return self.add_node(Conjugate(), [z], name=name)

    def welch_peaks(self, spectrum: int, k: int, n_segments: int, *, name: str | None = None) -> int:
        """`[batch, 2k]` (bin, power) top-k of the Welch PSD of `[batch * n_segments, 2 * n_fft]` spectra."""
        return self.add_node(WelchPeaks(k, n_segments), [spectrum], name=name)


#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (newest upstream only).
JSON_FORMS = (
    struct_form(Histogram, ("bins", USIZE), ("min", F32), ("max", F32), since=NEWEST),
    struct_form(SplineActivation, ("num_basis", U32), ("grid_min", F32), ("grid_max", F32), since=NEWEST),
    struct_form(Im2Col, ("kernel_size", USIZE_VEC), ("stride", USIZE_VEC), ("padding", USIZE_VEC),
                ("dilation", USIZE_VEC), since=NEWEST),
    struct_form(PartitionedConv, ("block", USIZE), since=NEWEST),
    struct_form(Fft, ("inverse", BOOL), ("norm", EnumCodec(FftNorm, "FftNorm")), since=NEWEST),
    struct_form(FftButterflyStage, ("stage", U32), ("n_fft", U32), since=NEWEST),
    unit_form(ComplexNormSq, since=NEWEST),
    unit_form(Conjugate, since=NEWEST),
    struct_form(WelchPeaks, ("k", USIZE), ("n_segments", USIZE), since=NEWEST),
)
