"""Element-wise ops: Activation, Cast, Binary, Compare, Where (spec section 4).

Values are held as the driver holds them: floats in the program float (fp16 or fp32), every
integer dtype as int32, Bool as bool. The helpers below convert between those holdings with the
IR's Cast semantics (float -> int truncates toward zero and saturates, NaN -> 0; -> Bool is
`!= 0`); the other rule modules use them too.

Core ML leaves several element-wise corner cases to the compute unit (how `round` breaks ties,
whether `maximum` propagates NaN, how `cast` turns a fraction into an int). Where the spec
fixes them, the lowering spells them out with exact ops (floor, compare, select) instead of
trusting the unit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlx_mil.errors import ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.ops import ActivationKind, BinaryOp, CmpOp
from rlx_mil.lower.context import LowerContext
from rlx_mil.lower.registry import declare_unsupported, lowering
from rlx_mil.lower.target import Precision

# Value range of each integer dtype as the program holds it (int32). I64 and U32 values
# beyond int32 cannot be held, so they saturate at the int32 range.
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
INT_RANGES: dict[DType, tuple[int, int]] = {
    DType.I8: (-(2**7), 2**7 - 1),
    DType.U8: (0, 2**8 - 1),
    DType.I16: (-(2**15), 2**15 - 1),
    DType.I32: (_INT32_MIN, _INT32_MAX),
    DType.I64: (_INT32_MIN, _INT32_MAX),
    DType.U32: (0, _INT32_MAX),
}


def join(suffix: str, part: str) -> str:
    """Op-name suffix `part` under a caller's `suffix` ("" = the node's own name)."""
    return f"{suffix}_{part}" if suffix else part


def kind_of(dtype: DType) -> str:
    """How the program holds values of `dtype`: "float", "int" or "bool"."""
    if dtype.is_float:
        return "float"
    if dtype is DType.BOOL:
        return "bool"
    return "int"


def shape_error(ctx: LowerContext, message: str, operand: str | None = None) -> ShapeError:
    """A ShapeError naming this node, its op and (optionally) the operand at fault."""
    node = ctx.node
    return ShapeError(message, node=node.id, op=ctx.op.type_name, name=node.name, operand=operand)


def broadcast_sizes(ctx: LowerContext, names: tuple[str, ...]) -> tuple[int, ...]:
    """NumPy broadcast of the node's input shapes; a ShapeError naming the operands if they
    do not broadcast or the result is not the declared shape."""
    shapes = [ctx.input_shape(i).sizes() for i in range(len(names))]
    try:
        result = tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        listed = ", ".join(f"{n} {list(s)}" for n, s in zip(names, shapes, strict=True))
        raise shape_error(ctx, f"operands do not broadcast: {listed}", names[-1]) from None
    declared = ctx.out_shape.sizes()
    if result != declared and not (result in ((), (1,)) and declared in ((), (1,))):
        raise shape_error(ctx, f"operands broadcast to {list(result)}, but the node declares {list(declared)}")
    return result


def broadcast_to(ctx: LowerContext, var: Any, sizes: tuple[int, ...], suffix: str) -> Any:
    """`var` materialised at `sizes` (NumPy broadcasting): reshape to the rank, tile the
    size-1 dims that grow."""
    from coremltools.converters.mil import Builder as mb

    have = tuple(int(d) for d in var.shape)
    padded = (1,) * (len(sizes) - len(have)) + have
    if padded != have:
        var = mb.reshape(x=var, shape=np.asarray(padded, dtype=np.int32), name=ctx.name(join(suffix, "rank")))
    reps = [w if h == 1 and w != 1 else 1 for h, w in zip(padded, sizes, strict=True)]
    if all(r == 1 for r in reps):
        return var
    return mb.tile(x=var, reps=np.asarray(reps, dtype=np.int32), name=ctx.name(suffix))


# ------------------------------------------------------------------------------ conversions


def to_float(ctx: LowerContext, var: Any, dtype: DType, suffix: str = "to_float") -> Any:
    """`var` (holding IR `dtype` values) in the program float."""
    from coremltools.converters.mil import Builder as mb

    if dtype.is_float:
        return var
    return mb.cast(x=var, dtype=ctx.mil_float, name=ctx.name(suffix))


def to_int32(ctx: LowerContext, var: Any, dtype: DType, suffix: str = "to_int") -> Any:
    """`var` as int32 with Cast semantics (floats truncate toward zero and saturate)."""
    return convert(ctx, var, dtype, DType.I32, suffix=suffix)


def to_bool(ctx: LowerContext, var: Any, dtype: DType, suffix: str = "to_bool") -> Any:
    """`var != 0` as bool (NaN counts as non-zero, as in NumPy)."""
    from coremltools.converters.mil import Builder as mb

    if dtype is DType.BOOL:
        return var
    zero = np.int32(0) if kind_of(dtype) == "int" else ctx.scalar(0.0)
    return mb.not_equal(x=var, y=zero, name=ctx.name(suffix))


def convert(
    ctx: LowerContext, var: Any, src: DType, dst: DType, *, round_floats: bool = False, suffix: str = "cast"
) -> Any:
    """Convert `var` holding `src` values to the holding of `dst`, with the IR's Cast semantics.

    `round_floats` makes float -> F16/BF16 round to that type even when the program holds
    floats in a wider type (what a Cast node asks for); rules that merely hand a computed
    float on leave it off.
    """
    from coremltools.converters.mil import Builder as mb

    src_kind, dst_kind = kind_of(src), kind_of(dst)
    if dst_kind == "bool":
        return to_bool(ctx, var, src, suffix=suffix)
    if dst_kind == "float":
        if src_kind == "float":
            return _round_float(ctx, var, src, dst, suffix) if round_floats else var
        if dst is DType.F16 and ctx.precision is Precision.FP32 and round_floats:
            # Integers above 2048 are not all fp16 values: go through fp16 for the rounding.
            half = mb.cast(x=var, dtype="fp16", name=ctx.name(join(suffix, "fp16")))
            return mb.cast(x=half, dtype="fp32", name=ctx.name(suffix))
        as_float = mb.cast(x=var, dtype=ctx.mil_float, name=ctx.name(suffix))
        if dst is DType.BF16 and round_floats:
            return _round_to_bf16(ctx, as_float, suffix)
        return as_float
    # dst is an integer type
    if src_kind == "bool":
        return mb.cast(x=var, dtype="int32", name=ctx.name(suffix))
    if src_kind == "int":
        return _wrap_int(ctx, var, INT_RANGES[src], INT_RANGES[dst], suffix)
    return _float_to_int(ctx, var, INT_RANGES[dst], suffix)


def _round_float(ctx: LowerContext, var: Any, src: DType, dst: DType, suffix: str) -> Any:
    from coremltools.converters.mil import Builder as mb

    if dst is DType.F16 and src is not DType.F16 and ctx.precision is Precision.FP32:
        half = mb.cast(x=var, dtype="fp16", name=ctx.name(join(suffix, "fp16")))
        return mb.cast(x=half, dtype="fp32", name=ctx.name(suffix))
    if dst is DType.BF16 and src is not DType.BF16:
        return _round_to_bf16(ctx, var, suffix)
    # F32/F64 targets, or F16 in an fp16 program: the held value already is of that type.
    return var


def _round_to_bf16(ctx: LowerContext, var: Any, suffix: str) -> Any:
    """Round to the nearest bfloat16 (ties to even) with Veltkamp splitting: for
    c = x * (2^s + 1), c - (c - x) is x rounded to (p - s) significant bits under IEEE
    round-to-nearest arithmetic in the program float (p = 24 for fp32, 11 for fp16; bfloat16
    keeps 8). Large magnitudes are scaled by a power of two first so c cannot overflow; inf
    and NaN pass through unchanged."""
    from coremltools.converters.mil import Builder as mb

    if ctx.precision is Precision.FP32:
        splitter, big, scale = 2.0**16 + 1, 2.0**100, 2.0**-32
    else:
        splitter, big, scale = 2.0**3 + 1, 2.0**12, 2.0**-4
    magnitude = mb.abs(x=var, name=ctx.name(join(suffix, "abs")))
    is_big = mb.greater_equal(x=magnitude, y=ctx.scalar(big), name=ctx.name(join(suffix, "big")))
    shrunk = mb.mul(x=var, y=ctx.scalar(scale), name=ctx.name(join(suffix, "shrunk")))
    scaled = mb.select(cond=is_big, a=shrunk, b=var, name=ctx.name(join(suffix, "scaled")))
    c = mb.mul(x=scaled, y=ctx.scalar(splitter), name=ctx.name(join(suffix, "split")))
    low = mb.sub(x=c, y=scaled, name=ctx.name(join(suffix, "low")))
    high = mb.sub(x=c, y=low, name=ctx.name(join(suffix, "high")))
    grown = mb.mul(x=high, y=ctx.scalar(1.0 / scale), name=ctx.name(join(suffix, "grown")))
    rounded = mb.select(cond=is_big, a=grown, b=high, name=ctx.name(join(suffix, "unscaled")))
    finite = mb.equal(x=rounded, y=rounded, name=ctx.name(join(suffix, "not_nan")))
    return mb.select(cond=finite, a=rounded, b=var, name=ctx.name(suffix))


def _wrap_int(ctx: LowerContext, var: Any, src: tuple[int, int], dst: tuple[int, int], suffix: str) -> Any:
    """Int -> narrower int as NumPy's astype: wrap modulo 2^bits. I64/U32 are held as int32,
    so a destination as wide as int32 cannot wrap; values outside int32 saturate there."""
    from coremltools.converters.mil import Builder as mb

    lo, hi = dst
    if src[0] >= lo and src[1] <= hi:
        return var
    width = hi - lo + 1
    if width >= 2**31:
        if src[0] < lo:
            var = mb.maximum(x=var, y=np.int32(lo), name=ctx.name(join(suffix, "lo")))
        if src[1] > hi:
            var = mb.minimum(x=var, y=np.int32(hi), name=ctx.name(join(suffix, "hi")))
        return var
    # r = x mod width in [0, width), whatever sign convention the device's mod has; no
    # intermediate leaves int32.
    rem = mb.mod(x=var, y=np.int32(width), name=ctx.name(join(suffix, "mod")))
    negative = mb.less(x=rem, y=np.int32(0), name=ctx.name(join(suffix, "neg")))
    shifted = mb.add(x=rem, y=np.int32(width), name=ctx.name(join(suffix, "shift")))
    rem = mb.select(cond=negative, a=shifted, b=rem, name=ctx.name(join(suffix, "rem")))
    if lo == 0:
        return rem
    over = mb.greater(x=rem, y=np.int32(hi), name=ctx.name(join(suffix, "over")))
    wrapped = mb.sub(x=rem, y=np.int32(width), name=ctx.name(join(suffix, "wrapped")))
    return mb.select(cond=over, a=wrapped, b=rem, name=ctx.name(join(suffix, "signed")))


def _float_to_int(ctx: LowerContext, var: Any, bounds: tuple[int, int], suffix: str) -> Any:
    """Truncate toward zero, NaN -> 0, saturate at `bounds`, then cast to int32. Spelled out
    because Core ML does not pin down how `cast` treats fractions or out-of-range values."""
    from coremltools.converters.mil import Builder as mb

    lo, hi = bounds
    fdtype = ctx.float_dtype
    finfo = np.finfo(fdtype)
    # Largest/smallest finite values of the program float inside [lo, hi].
    hi_f = fdtype(min(float(hi), float(finfo.max)))
    if float(hi_f) > hi:
        hi_f = np.nextafter(hi_f, fdtype(-np.inf))
    lo_f = fdtype(max(float(lo), float(finfo.min)))
    if float(lo_f) < lo:
        lo_f = np.nextafter(lo_f, fdtype(np.inf))

    negative = mb.less(x=var, y=ctx.scalar(0.0), name=ctx.name(join(suffix, "neg")))
    up = mb.ceil(x=var, name=ctx.name(join(suffix, "ceil")))
    down = mb.floor(x=var, name=ctx.name(join(suffix, "floor")))
    truncated = mb.select(cond=negative, a=up, b=down, name=ctx.name(join(suffix, "trunc")))
    is_number = mb.equal(x=truncated, y=truncated, name=ctx.name(join(suffix, "not_nan")))
    cleaned = mb.select(cond=is_number, a=truncated, b=ctx.scalar(0.0), name=ctx.name(join(suffix, "nan0")))
    clipped = mb.clip(x=cleaned, alpha=fdtype(lo_f), beta=fdtype(hi_f), name=ctx.name(join(suffix, "clip")))
    result = mb.cast(x=clipped, dtype="int32", name=ctx.name(suffix))
    # A bound the float cannot hold exactly: everything beyond the nearest float saturates.
    if float(hi_f) < hi:
        over = mb.greater(x=cleaned, y=fdtype(hi_f), name=ctx.name(join(suffix, "over")))
        result = mb.select(cond=over, a=np.int32(hi), b=result, name=ctx.name(join(suffix, "sat_hi")))
    if float(lo_f) > lo:
        under = mb.less(x=cleaned, y=fdtype(lo_f), name=ctx.name(join(suffix, "under")))
        result = mb.select(cond=under, a=np.int32(lo), b=result, name=ctx.name(join(suffix, "sat_lo")))
    return result


# ------------------------------------------------------------------------------ Activation


def _round_half_even(ctx: LowerContext, x: Any, suffix: str) -> Any:
    """Ties to even. MIL `round` breaks ties differently per compute unit, so exact halves are
    detected (x - floor(x) == 0.5 is exact in floating point) and rounded as 2*round(x/2): for
    a tie x = n + 0.5, x/2 ends in .25 or .75 and is never itself a tie."""
    from coremltools.converters.mil import Builder as mb

    nearest = mb.round(x=x, name=ctx.name(join(suffix, "round")))
    half = mb.mul(x=x, y=ctx.scalar(0.5), name=ctx.name(join(suffix, "half")))
    half_rounded = mb.round(x=half, name=ctx.name(join(suffix, "half_round")))
    even = mb.mul(x=half_rounded, y=ctx.scalar(2.0), name=ctx.name(join(suffix, "even")))
    floor = mb.floor(x=x, name=ctx.name(join(suffix, "floor")))
    fraction = mb.sub(x=x, y=floor, name=ctx.name(join(suffix, "frac")))
    tie = mb.equal(x=fraction, y=ctx.scalar(0.5), name=ctx.name(join(suffix, "tie")))
    return mb.select(cond=tie, a=even, b=nearest, name=ctx.name(suffix))


def float_activation(ctx: LowerContext, kind: ActivationKind, x: Any, suffix: str = "") -> Any:
    """Activation `kind` of a var held in the program float."""
    from coremltools.converters.mil import Builder as mb

    if kind is ActivationKind.ROUND:
        return _round_half_even(ctx, x, suffix)
    name = ctx.name(suffix)
    zero = ctx.scalar(0.0)
    simple: dict[ActivationKind, Callable[..., Any]] = {
        ActivationKind.SILU: mb.silu, ActivationKind.SIGMOID: mb.sigmoid,
        ActivationKind.TANH: mb.tanh, ActivationKind.EXP: mb.exp, ActivationKind.SQRT: mb.sqrt,
        ActivationKind.ABS: mb.abs, ActivationKind.SIN: mb.sin, ActivationKind.COS: mb.cos,
        ActivationKind.TAN: mb.tan, ActivationKind.ATAN: mb.atan, ActivationKind.FLOOR: mb.floor,
        ActivationKind.CEIL: mb.ceil, ActivationKind.SIGN: mb.sign, ActivationKind.SOFTPLUS: mb.softplus,
        ActivationKind.ERF: mb.erf, ActivationKind.SOFTSIGN: mb.softsign,
    }
    if kind in simple:
        return simple[kind](x=x, name=name)
    if kind is ActivationKind.GELU:
        return mb.gelu(x=x, mode="EXACT", name=name)
    if kind is ActivationKind.GELU_APPROX:
        return mb.gelu(x=x, mode="TANH_APPROXIMATION", name=name)
    if kind is ActivationKind.RELU:
        # The IR's Relu maps NaN to 0 (fmax(x, 0)); how MIL relu/maximum treat NaN differs by
        # compute unit, a comparison-and-select does not.
        positive = mb.greater(x=x, y=zero, name=ctx.name(join(suffix, "positive")))
        return mb.select(cond=positive, a=x, b=zero, name=name)
    # MIL log adds an epsilon (1e-45 by default); the IR wants the exact log(0) = -inf.
    if kind is ActivationKind.LOG:
        return mb.log(x=x, epsilon=zero, name=name)
    if kind is ActivationKind.RSQRT:
        # 1/sqrt(x), not MIL rsqrt: rsqrt computes 1/sqrt(x + epsilon), which turns -0 into +0
        # (rsqrt(-0) must be -inf) and, with its default epsilon, is not exact at all.
        root = mb.sqrt(x=x, name=ctx.name(join(suffix, "sqrt")))
        return mb.real_div(x=ctx.scalar(1.0), y=root, name=name)
    if kind is ActivationKind.NEG:
        # mul by -1 (not 0 - x) so that -(+0) is -0.
        return mb.mul(x=x, y=ctx.scalar(-1.0), name=name)
    return _newer_activation(ctx, kind, x, suffix, name)


def _newer_activation(ctx: LowerContext, kind: ActivationKind, x: Any, suffix: str, name: str) -> Any:
    """The kinds the newest upstream added that MIL has no single op for."""
    from coremltools.converters.mil import Builder as mb

    if kind is ActivationKind.RECIP:
        # real_div, not MIL inverse: inverse adds an epsilon, so 1/0 would not be inf.
        return mb.real_div(x=ctx.scalar(1.0), y=x, name=name)
    if kind is ActivationKind.ELU:
        return mb.elu(x=x, alpha=ctx.scalar(1.0), name=name)
    if kind is ActivationKind.HARD_SIGMOID:
        return mb.sigmoid_hard(x=x, alpha=ctx.scalar(1.0 / 6.0), beta=ctx.scalar(0.5), name=name)
    if kind is ActivationKind.HARD_SWISH:
        shifted = mb.add(x=x, y=ctx.scalar(3.0), name=ctx.name(join(suffix, "plus3")))
        gate = mb.clip(x=shifted, alpha=ctx.scalar(0.0), beta=ctx.scalar(6.0), name=ctx.name(join(suffix, "relu6")))
        scaled = mb.mul(x=gate, y=ctx.scalar(1.0 / 6.0), name=ctx.name(join(suffix, "gate")))
        return mb.mul(x=x, y=scaled, name=name)
    if kind is ActivationKind.MISH:
        soft = mb.softplus(x=x, name=ctx.name(join(suffix, "softplus")))
        return mb.mul(x=x, y=mb.tanh(x=soft, name=ctx.name(join(suffix, "tanh"))), name=name)
    if kind is ActivationKind.LOG_SIGMOID:
        # log(sigmoid(x)) = -softplus(-x), without the underflow of log(sigmoid(x)).
        negated = mb.mul(x=x, y=ctx.scalar(-1.0), name=ctx.name(join(suffix, "neg")))
        soft = mb.softplus(x=negated, name=ctx.name(join(suffix, "softplus")))
        return mb.mul(x=soft, y=ctx.scalar(-1.0), name=name)
    raise ctx.unsupported(f"activation {kind.value} has no lowering")


_EXACT_ON_INTS = (ActivationKind.NEG, ActivationKind.ABS, ActivationKind.RELU, ActivationKind.ROUND)


def activation_var(ctx: LowerContext, kind: ActivationKind, x: Any, src: DType, dst: DType, suffix: str = "") -> Any:
    """Activation `kind` of `x` (holding `src` values), converted to the holding of `dst`."""
    from coremltools.converters.mil import Builder as mb

    if kind_of(src) != "float" and kind_of(dst) == "int" and kind in _EXACT_ON_INTS:
        xi = to_int32(ctx, x, src, suffix=join(suffix, "int"))
        if kind is ActivationKind.NEG:
            y = mb.mul(x=xi, y=np.int32(-1), name=ctx.name(suffix))
        elif kind is ActivationKind.ABS:
            y = mb.abs(x=xi, name=ctx.name(suffix))
        elif kind is ActivationKind.RELU:
            y = mb.maximum(x=xi, y=np.int32(0), name=ctx.name(suffix))
        else:
            return convert(ctx, xi, src if kind_of(src) == "int" else DType.I32, dst, suffix=join(suffix, "out"))
        # -(-128) and |-128| leave the I8 range: wrap back into it, as NumPy does.
        return convert(ctx, y, DType.I32, dst, suffix=join(suffix, "out"))
    xf = to_float(ctx, x, src, suffix=join(suffix, "float"))
    y = float_activation(ctx, kind, xf, suffix)
    return convert(ctx, y, DType.F32, dst, suffix=join(suffix, "out"))


@lowering(
    ops.Activation, family="elementwise",
    notes=(
        "gelu(EXACT) / gelu(TANH_APPROXIMATION), silu, sigmoid, tanh, exp, sqrt, abs, sin, cos, tan,"
        " atan; log with epsilon=0 (exact log(0)=-inf); Rsqrt = real_div(1, sqrt) (IEEE at 0 and -0);"
        " Neg = mul by -1; Relu = greater + select (NaN -> 0 on every compute unit);"
        " Round = round + tie detection (floor/sub/equal/select) so halves go to even on every"
        " compute unit. Newest kinds: floor, ceil, sign, softplus, erf, softsign; Recip = real_div(1, x);"
        " Elu = elu(alpha=1); HardSigmoid = sigmoid_hard(1/6, 0.5); HardSwish = x*clip(x+3, 0, 6)/6;"
        " Mish = x*tanh(softplus); LogSigmoid = -softplus(-x). Integer inputs:"
        " Neg/Abs/Relu/Round exact in int32, the rest via float. Same on every target."
    ),
)
def lower_activation(op: ops.Activation, ctx: LowerContext) -> Any:
    return activation_var(ctx, op.kind, ctx.var(0), ctx.input_shape(0).dtype, ctx.out_shape.dtype)


# ------------------------------------------------------------------------------ Cast


@lowering(
    ops.Cast, family="elementwise",
    notes=(
        "float->int: floor/ceil/select truncation, NaN->0, clip + select saturation, cast int32;"
        " ->Bool: not_equal 0; int->narrower int: wraps modulo 2^bits like NumPy (mod/select;"
        " every int dtype is held as int32 on every target, so I64/U32 saturate at the int32"
        " range instead); ->F16 in an fp32"
        " program: cast fp16 then fp32 (real rounding); ->BF16: Veltkamp split (mul/sub) rounding"
        " to 8 significant bits; F16 in an fp16 program and F32/F64: no op."
    ),
)
def lower_cast(op: ops.Cast, ctx: LowerContext) -> Any:
    return convert(ctx, ctx.var(0), ctx.input_shape(0).dtype, op.to, round_floats=True, suffix="")


# ------------------------------------------------------------------------------ Binary


def _may_hold_nan(ctx: LowerContext, i: int) -> bool:
    if not ctx.input_shape(i).dtype.is_float:
        return False
    value = ctx.value(i)
    if value is None:
        return True
    arr = np.asarray(value)
    return arr.dtype.kind == "f" and bool(np.isnan(arr).any())


def _nan_ignoring(ctx: LowerContext, combine: Callable[..., Any], a: Any, b: Any) -> Any:
    """fmax/fmin: a NaN operand yields the other operand (NaN only when both are NaN).
    MIL maximum/minimum leave NaN to the compute unit, so NaNs are routed with select."""
    from coremltools.converters.mil import Builder as mb

    result = combine(x=a, y=b, name=ctx.name("raw"))
    if _may_hold_nan(ctx, 1):
        b_nan = mb.not_equal(x=b, y=b, name=ctx.name("rhs_nan"))
        result = mb.select(cond=b_nan, a=a, b=result, name=ctx.name("rhs_nan_pick"))
    if _may_hold_nan(ctx, 0):
        a_nan = mb.not_equal(x=a, y=a, name=ctx.name("lhs_nan"))
        result = mb.select(cond=a_nan, a=b, b=result, name=ctx.name("lhs_nan_pick"))
    return result


def _const_exponent(ctx: LowerContext) -> float | None:
    value = ctx.value(1)
    if value is None:
        return None
    arr = np.asarray(value, dtype=np.float64)
    if arr.size == 0 or not np.all(arr == arr.flat[0]):
        return None
    # Broadcasting a larger exponent tensor changes the result shape: only scalars qualify.
    if np.broadcast_shapes(ctx.input_shape(0).sizes(), arr.shape) != ctx.input_shape(0).sizes():
        return None
    return float(arr.flat[0])


def _float_pow(ctx: LowerContext, a: Any, b: Any) -> Any:
    """`pow`, with constant exponents specialised: x*x for 2 and sign-corrected |x|^n for other
    integer n (a negative base with an integer exponent is well defined, but Core ML's pow may
    compute it through log)."""
    from coremltools.converters.mil import Builder as mb

    n = _const_exponent(ctx)
    if n is None:
        return mb.pow(x=a, y=b, name=ctx.name())
    if n == 1.0:
        return mb.identity(x=a, name=ctx.name())
    if n == 2.0:
        return mb.mul(x=a, y=a, name=ctx.name())
    exponent = ctx.scalar(n)
    if not n.is_integer():
        return mb.pow(x=a, y=exponent, name=ctx.name())
    magnitude = mb.abs(x=a, name=ctx.name("abs"))
    powered = mb.pow(x=magnitude, y=exponent, name=ctx.name("abs_pow"))
    if int(n) % 2 == 0:
        return powered
    negative = mb.less(x=a, y=ctx.scalar(0.0), name=ctx.name("negative"))
    flipped = mb.mul(x=powered, y=ctx.scalar(-1.0), name=ctx.name("flipped"))
    return mb.select(cond=negative, a=flipped, b=powered, name=ctx.name())


def _int_trunc_div(ctx: LowerContext, a: Any, b: Any) -> Any:
    """Integer division rounding toward zero (the IR divides, then truncates), exactly in
    int32: floor_div, plus one where the remainder is non-zero and the signs differ; a
    division by zero gives 0 (the divisor is made 1 there first: Core ML leaves it undefined)."""
    from coremltools.converters.mil import Builder as mb

    by_zero = mb.equal(x=b, y=np.int32(0), name=ctx.name("by_zero"))
    b = mb.select(cond=by_zero, a=np.int32(1), b=b, name=ctx.name("safe_rhs"))
    q = mb.floor_div(x=a, y=b, name=ctx.name("floor_div"))
    rem = mb.sub(x=a, y=mb.mul(x=q, y=b, name=ctx.name("q_times_b")), name=ctx.name("rem"))
    inexact = mb.not_equal(x=rem, y=np.int32(0), name=ctx.name("inexact"))
    a_neg = mb.less(x=a, y=np.int32(0), name=ctx.name("lhs_neg"))
    b_neg = mb.less(x=b, y=np.int32(0), name=ctx.name("rhs_neg"))
    signs_differ = mb.logical_xor(x=a_neg, y=b_neg, name=ctx.name("signs_differ"))
    fix = mb.logical_and(x=inexact, y=signs_differ, name=ctx.name("fix"))
    quotient = mb.add(x=q, y=mb.cast(x=fix, dtype="int32", name=ctx.name("fix_int")), name=ctx.name("quotient"))
    return mb.select(cond=by_zero, a=np.int32(0), b=quotient, name=ctx.name())


_INT_EXACT_BINARY = (BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL, BinaryOp.MAX, BinaryOp.MIN, BinaryOp.DIV, BinaryOp.MOD)
_NO_CORE_ML_BINARY = (BinaryOp.BIT_AND, BinaryOp.BIT_OR, BinaryOp.BIT_XOR, BinaryOp.SHL, BinaryOp.SHR)


def _fmod(ctx: LowerContext, a: Any, b: Any) -> Any:
    """C fmod `a - trunc(a / b) * b` (the sign of a; MIL mod is floor-mod, the sign of b)."""
    from coremltools.converters.mil import Builder as mb

    quotient = mb.real_div(x=a, y=b, name=ctx.name("quotient"))
    magnitude = mb.floor(x=mb.abs(x=quotient, name=ctx.name("quotient_abs")), name=ctx.name("quotient_floor"))
    truncated = mb.mul(x=mb.sign(x=quotient, name=ctx.name("quotient_sign")), y=magnitude, name=ctx.name("trunc"))
    return mb.sub(x=a, y=mb.mul(x=truncated, y=b, name=ctx.name("multiple")), name=ctx.name())


def _atan2(ctx: LowerContext, a: Any, b: Any) -> Any:
    """atan(a / b) moved into the quadrant of (b, a); b = 0 gives +-pi/2 through a/0 = +-inf,
    and atan2(0, 0) = 0."""
    from coremltools.converters.mil import Builder as mb

    base = mb.atan(x=mb.real_div(x=a, y=b, name=ctx.name("ratio")), name=ctx.name("atan"))
    zero = ctx.scalar(0.0)
    upper = mb.greater_equal(x=a, y=zero, name=ctx.name("upper_half"))
    plus = mb.add(x=base, y=ctx.scalar(np.pi), name=ctx.name("plus_pi"))
    minus = mb.sub(x=base, y=ctx.scalar(np.pi), name=ctx.name("minus_pi"))
    turned = mb.select(cond=upper, a=plus, b=minus, name=ctx.name("turned"))
    left = mb.less(x=b, y=zero, name=ctx.name("left_half"))
    angle = mb.select(cond=left, a=turned, b=base, name=ctx.name("angle"))
    origin = mb.logical_and(
        x=mb.equal(x=a, y=zero, name=ctx.name("a_zero")), y=mb.equal(x=b, y=zero, name=ctx.name("b_zero")),
        name=ctx.name("origin"),
    )
    return mb.select(cond=origin, a=zero, b=angle, name=ctx.name())


def _int_fmod(ctx: LowerContext, a: Any, b: Any) -> Any:
    from coremltools.converters.mil import Builder as mb

    q = _int_trunc_div(ctx, a, b)
    rem = mb.sub(x=a, y=mb.mul(x=q, y=b, name=ctx.name("multiple")), name=ctx.name("rem"))
    # fmod by 0 is NaN, which the integer result holds as 0 (Cast semantics), as the reference.
    by_zero = mb.equal(x=b, y=np.int32(0), name=ctx.name("by_zero"))
    return mb.select(cond=by_zero, a=np.int32(0), b=rem, name=ctx.name())


@lowering(
    ops.Binary, family="elementwise",
    notes=(
        "add, sub, mul, real_div, pow with NumPy broadcasting. Max/Min: maximum/minimum plus"
        " not_equal(x,x)+select per operand that may hold NaN, giving fmax/fmin (NaN-ignoring)."
        " Pow with a constant exponent: 2 -> mul, other integers -> sign-corrected pow(|x|, n)."
        " Mod (C fmod, the sign of a) = a - sign(a/b)*floor(|a/b|)*b (int32: truncating division);"
        " Atan2 = atan(a/b) + select quadrant fix (+-pi), 0 at the origin. BitAnd/BitOr/BitXor/Shl/Shr"
        " are rejected (MIL has no bitwise ops)."
        " Integer operands with an integer result stay int32 and wrap into the declared dtype (Div"
        " truncates toward zero via floor_div + fix-up, x/0 = 0 by select); mixed int/float compute"
        " in float and convert to the declared dtype."
    ),
)
def lower_binary(op: ops.Binary, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    broadcast_sizes(ctx, ("lhs", "rhs"))
    a_dt, b_dt, out_dt = ctx.input_shape(0).dtype, ctx.input_shape(1).dtype, ctx.out_shape.dtype
    a, b = ctx.var(0), ctx.var(1)
    if kind_of(out_dt) == "int" and not a_dt.is_float and not b_dt.is_float and op.op in _INT_EXACT_BINARY:
        ai, bi = to_int32(ctx, a, a_dt, "lhs_int"), to_int32(ctx, b, b_dt, "rhs_int")
        int_ops: dict[BinaryOp, Callable[..., Any]] = {
            BinaryOp.ADD: mb.add, BinaryOp.SUB: mb.sub, BinaryOp.MUL: mb.mul,
            BinaryOp.MAX: mb.maximum, BinaryOp.MIN: mb.minimum,
        }
        if op.op is BinaryOp.DIV:
            result = _int_trunc_div(ctx, ai, bi)
        elif op.op is BinaryOp.MOD:
            result = _int_fmod(ctx, ai, bi)
        else:
            result = int_ops[op.op](x=ai, y=bi, name=ctx.name())
        return convert(ctx, result, DType.I32, out_dt, suffix="out")

    af, bf = to_float(ctx, a, a_dt, "lhs_float"), to_float(ctx, b, b_dt, "rhs_float")
    if op.op is BinaryOp.MAX:
        result = _nan_ignoring(ctx, mb.maximum, af, bf)
    elif op.op is BinaryOp.MIN:
        result = _nan_ignoring(ctx, mb.minimum, af, bf)
    elif op.op is BinaryOp.POW:
        result = _float_pow(ctx, af, bf)
    elif op.op is BinaryOp.MOD:
        result = _fmod(ctx, af, bf)
    elif op.op is BinaryOp.ATAN2:
        result = _atan2(ctx, af, bf)
    elif op.op in _NO_CORE_ML_BINARY:
        raise ctx.unsupported(
            f"Binary {op.op.value} (bitwise/shift on i64 conversions) has no Core ML form: MIL has no"
            " bitwise or shift ops"
        )
    else:
        float_ops: dict[BinaryOp, Callable[..., Any]] = {
            BinaryOp.ADD: mb.add, BinaryOp.SUB: mb.sub, BinaryOp.MUL: mb.mul, BinaryOp.DIV: mb.real_div,
        }
        result = float_ops[op.op](x=af, y=bf, name=ctx.name())
    return convert(ctx, result, DType.F32, out_dt, suffix="out")


# ------------------------------------------------------------------------------ Compare / Where


def common_operands(ctx: LowerContext, indices: tuple[int, ...], suffix: str) -> list[Any]:
    """The vars of inputs `indices` in one MIL dtype: the program float if any is a float, else
    int32 (bool operands become 0/1)."""
    dtypes = [ctx.input_shape(i).dtype for i in indices]
    if any(d.is_float for d in dtypes):
        return [to_float(ctx, ctx.var(i), d, f"{suffix}{i}_float") for i, d in zip(indices, dtypes, strict=True)]
    return [to_int32(ctx, ctx.var(i), d, f"{suffix}{i}_int") for i, d in zip(indices, dtypes, strict=True)]


@lowering(
    ops.Compare, family="elementwise",
    notes=(
        "equal / not_equal / less / less_equal / greater / greater_equal (bool result) with"
        " NumPy broadcasting; mixed operands compare in float, int/bool operands in int32."
    ),
)
def lower_compare(op: ops.Compare, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    broadcast_sizes(ctx, ("lhs", "rhs"))
    a, b = common_operands(ctx, (0, 1), "operand")
    compare: dict[CmpOp, Callable[..., Any]] = {
        CmpOp.EQ: mb.equal, CmpOp.NE: mb.not_equal, CmpOp.LT: mb.less,
        CmpOp.LE: mb.less_equal, CmpOp.GT: mb.greater, CmpOp.GE: mb.greater_equal,
    }
    result = compare[op.op](x=a, y=b, name=ctx.name())
    return convert(ctx, result, DType.BOOL, ctx.out_shape.dtype, suffix="out")


@lowering(
    ops.Where, family="elementwise",
    notes=(
        "select with 3-way NumPy broadcasting; a non-bool cond becomes not_equal(cond, 0);"
        " branches are converted to the declared dtype first."
    ),
)
def lower_where(op: ops.Where, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    out_sizes = broadcast_sizes(ctx, ("cond", "on_true", "on_false"))
    out_dt = ctx.out_shape.dtype
    cond = to_bool(ctx, ctx.var(0), ctx.input_shape(0).dtype, "cond")
    on_true = convert(ctx, ctx.var(1), ctx.input_shape(1).dtype, out_dt, suffix="on_true")
    on_false = convert(ctx, ctx.var(2), ctx.input_shape(2).dtype, out_dt, suffix="on_false")
    branches = tuple(int(d) for d in np.broadcast_shapes(ctx.input_shape(1).sizes(), ctx.input_shape(2).sizes()))
    if branches != out_sizes:
        # MIL select takes its result shape from the two branches only; a cond that is larger
        # than both needs a branch broadcast to the full shape.
        on_false = broadcast_to(ctx, on_false, out_sizes, "on_false_full")
    return mb.select(cond=cond, a=on_true, b=on_false, name=ctx.name())


# Ops of this family without a rule yet; conversion names the op and the reason.
declare_unsupported(ops.StopGradient, "not lowered yet (an identity: MIL `identity`)")
declare_unsupported(ops.Fma, "not lowered yet (MIL `mul` + `add`, two roundings)")
declare_unsupported(ops.Clamp, "not lowered yet (NaN-ignoring `maximum`/`minimum`)")
