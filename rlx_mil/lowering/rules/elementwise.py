"""Element-wise ops: Activation, Cast, Binary, Compare, Where (spec section 4); StopGradient, Fma,
Clamp (spec part 2, section 3).

Values are held as the driver holds them (rlx_mil/lowering/holding.py: floats in the program
float, integers as int32, Bool as bool, converted with the IR's Cast semantics).

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
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.holding import (
    INT_RANGES,
    broadcast_sizes,
    broadcast_to,
    convert,
    join,
    kind_of,
    may_hold_nan,
    to_bool,
    to_float,
    to_int32,
)
from rlx_mil.lowering.registry import lowering

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


def _nan_ignoring(ctx: LowerContext, combine: Callable[..., Any], a: Any, b: Any) -> Any:
    """fmax/fmin: a NaN operand yields the other operand (NaN only when both are NaN).
    MIL maximum/minimum leave NaN to the compute unit, so NaNs are routed with select."""
    from coremltools.converters.mil import Builder as mb

    result = combine(x=a, y=b, name=ctx.name("raw"))
    if may_hold_nan(ctx, 1):
        b_nan = mb.not_equal(x=b, y=b, name=ctx.name("rhs_nan"))
        result = mb.select(cond=b_nan, a=a, b=result, name=ctx.name("rhs_nan_pick"))
    if may_hold_nan(ctx, 0):
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


_BIT_TABLES = {
    BinaryOp.BIT_AND: np.bitwise_and, BinaryOp.BIT_OR: np.bitwise_or, BinaryOp.BIT_XOR: np.bitwise_xor,
}


def _bool_bitwise(ctx: LowerContext, kind: BinaryOp, a: Any, b: Any) -> Any:
    """Bitwise ops of 0/1 are the logical ops; 1 << (0 or 1) stays non-zero, 1 >> 1 is 0."""
    from coremltools.converters.mil import Builder as mb

    if kind is BinaryOp.SHL:
        return broadcast_to(ctx, a, ctx.out_shape.sizes(), "shifted") if tuple(a.shape) != ctx.out_shape.sizes() else a
    if kind is BinaryOp.SHR:
        return mb.logical_and(x=a, y=mb.logical_not(x=b, name=ctx.name("no_shift")), name=ctx.name())
    logical = {BinaryOp.BIT_AND: mb.logical_and, BinaryOp.BIT_OR: mb.logical_or, BinaryOp.BIT_XOR: mb.logical_xor}
    return logical[kind](x=a, y=b, name=ctx.name())


def _int_bitwise(ctx: LowerContext, kind: BinaryOp, a: Any, b: Any) -> Any:
    """And/Or/Xor of int32 two's-complement values, nibble by nibble: each operand's nibble j is
    floor_div(x, 16^j) mod 16 (floor division is the arithmetic shift), the pair looks up the
    16 x 16 table of the op by `gather`, and the results add up with weights 16^j, the top
    nibble signed. Exact for every int32."""
    from coremltools.converters.mil import Builder as mb

    codes = np.arange(16)
    table = ctx.const(_BIT_TABLES[kind](codes[:, None], codes[None, :]).reshape(-1).astype(np.int32), "nibble_table")
    total = None
    for j in range(8):
        scale = np.int32(16**j)
        nibbles = []
        for var, side in ((a, "lhs"), (b, "rhs")):
            shifted = mb.floor_div(x=var, y=scale, name=ctx.name(f"{side}_shift{j}")) if j else var
            nibbles.append(mb.mod(x=shifted, y=np.int32(16), name=ctx.name(f"{side}_nibble{j}")))
        index = mb.add(x=mb.mul(x=nibbles[0], y=np.int32(16), name=ctx.name(f"row{j}")), y=nibbles[1], name=ctx.name(f"pair{j}"))
        value = mb.gather(x=table, indices=index, axis=0, name=ctx.name(f"nibble{j}"))
        if j == 7:
            # The top nibble carries the sign: 8..15 stand for -8..-1.
            negative = mb.cast(x=mb.greater_equal(x=value, y=np.int32(8), name=ctx.name("top_neg")), dtype="int32", name=ctx.name("top_neg_int"))
            value = mb.sub(x=value, y=mb.mul(x=negative, y=np.int32(16), name=ctx.name("top_wrap")), name=ctx.name("top_signed"))
        term = mb.mul(x=value, y=scale, name=ctx.name(f"term{j}")) if j else value
        total = term if total is None else mb.add(x=total, y=term, name=ctx.name(f"sum{j}") if j < 7 else ctx.name())
    return total


def _int_shift(ctx: LowerContext, kind: BinaryOp, a: Any, b: Any) -> Any:
    """Shifts of int32 values by s = max(b, 0) mod 64 (upstream's sat_u32(b) mod 64): Shl
    multiplies by 2^s wrapped to 32 bits (0 once s >= 32, the low bits of the 64-bit result), Shr
    floor-divides by 2^s (the arithmetic shift) and gives the sign (-1 or 0) once s >= 31. The
    powers come from a 64-entry table by `gather`."""
    from coremltools.converters.mil import Builder as mb

    amount = mb.mod(x=mb.maximum(x=b, y=np.int32(0), name=ctx.name("amount_pos")), y=np.int32(64), name=ctx.name("amount"))
    if kind is BinaryOp.SHL:
        powers = np.array([(1 << s) if s < 32 else 0 for s in range(64)], dtype=np.int64)
        factors = ctx.const(((powers + 2**31) % 2**32 - 2**31).astype(np.int32), "shl_factors")
        factor = mb.gather(x=factors, indices=amount, axis=0, name=ctx.name("factor"))
        return mb.mul(x=a, y=factor, name=ctx.name())
    divisors = ctx.const(np.array([(1 << s) if s < 31 else 1 for s in range(64)], dtype=np.int32), "shr_divisors")
    divisor = mb.gather(x=divisors, indices=amount, axis=0, name=ctx.name("divisor"))
    quotient = mb.floor_div(x=a, y=divisor, name=ctx.name("quotient"))
    negative = mb.cast(x=mb.less(x=a, y=np.int32(0), name=ctx.name("negative")), dtype="int32", name=ctx.name("negative_int"))
    # -1 / 0 at the full broadcast shape (MIL select takes its shape from the branches).
    sign = mb.sub(x=mb.mul(x=quotient, y=np.int32(0), name=ctx.name("zero_like")), y=negative, name=ctx.name("sign"))
    wide = mb.greater_equal(x=amount, y=np.int32(31), name=ctx.name("all_shifted"))
    return mb.select(cond=wide, a=sign, b=quotient, name=ctx.name())


@lowering(
    notes=(
        "add, sub, mul, real_div, pow with NumPy broadcasting. Max/Min: maximum/minimum plus"
        " not_equal(x,x)+select per operand that may hold NaN, giving fmax/fmin (NaN-ignoring)."
        " Pow with a constant exponent: 2 -> mul, other integers -> sign-corrected pow(|x|, n)."
        " Mod (C fmod, the sign of a) = a - sign(a/b)*floor(|a/b|)*b (int32: truncating division);"
        " Atan2 = atan(a/b) + select quadrant fix (+-pi), 0 at the origin. BitAnd/BitOr/BitXor on int"
        " operands: exact nibble by nibble (floor_div/mod by 16^j, a 16x16 `gather` table, weighted sum);"
        " Shl/Shr on int operands: mul by 2^s / floor_div by 2^s from a 64-entry power table (s = max(b, 0)"
        " mod 64; Shl wraps, Shr gives the sign past 30); on Bool operands the logical ops. On float"
        " operands (64-bit integer conversions) they are refused by name: MIL has no bitwise ops or int64."
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
    if op.op in _NO_CORE_ML_BINARY and a_dt is DType.BOOL and b_dt is DType.BOOL and out_dt is DType.BOOL:
        return _bool_bitwise(ctx, op.op, a, b)
    if op.op in _NO_CORE_ML_BINARY and kind_of(out_dt) == "int" and not a_dt.is_float and not b_dt.is_float:
        ai, bi = to_int32(ctx, a, a_dt, "lhs_int"), to_int32(ctx, b, b_dt, "rhs_int")
        if op.op in (BinaryOp.SHL, BinaryOp.SHR):
            result = _int_shift(ctx, op.op, ai, bi)
        else:
            result = _int_bitwise(ctx, op.op, ai, bi)
        return convert(ctx, result, DType.I32, out_dt, suffix="out")
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
            f"Binary {op.op.value} on float operands (bitwise/shift of saturating 64-bit integer"
            " conversions, wrapping at 2^64) has no Core ML form: MIL has no bitwise or shift ops and no"
            " 64-bit integers; integer and Bool operands lower exactly"
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


# ------------------------------------------------------------------ StopGradient / Fma / Clamp


@lowering(notes="No op: the input, in the declared dtype (autodiff only).")
def lower_stop_gradient(op: ops.StopGradient, ctx: LowerContext) -> Any:
    sizes = ctx.input_shape(0).sizes()
    if sizes != ctx.out_shape.sizes():
        raise ctx.fail(ShapeError, f"the input is {list(sizes)}, but the node declares {list(ctx.out_shape.sizes())}")
    return convert(ctx, ctx.var(0), ctx.input_shape(0).dtype, ctx.out_shape.dtype, suffix="out")


@lowering(
    notes=(
        "`mul` then `add` with NumPy broadcasting: two roundings where upstream rounds once (spec"
        " part 2, 3.2; a few ulp). Integer operands with an integer result stay int32 and wrap."
    ),
)
def lower_fma(op: ops.Fma, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    broadcast_sizes(ctx, ("a", "b", "c"))
    out_dt = ctx.out_shape.dtype
    dtypes = [ctx.input_shape(i).dtype for i in range(3)]
    if kind_of(out_dt) == "int" and not any(d.is_float for d in dtypes):
        a, b, c = (to_int32(ctx, ctx.var(i), d, f"{name}_int") for i, (d, name) in enumerate(zip(dtypes, "abc", strict=True)))
        product = mb.mul(x=a, y=b, name=ctx.name("product"))
        return convert(ctx, mb.add(x=product, y=c, name=ctx.name("sum")), DType.I32, out_dt, suffix="out")
    a, b, c = (to_float(ctx, ctx.var(i), d, f"{name}_float") for i, (d, name) in enumerate(zip(dtypes, "abc", strict=True)))
    product = mb.mul(x=a, y=b, name=ctx.name("product"))
    return convert(ctx, mb.add(x=product, y=c, name=ctx.name("sum")), DType.F32, out_dt, suffix="out")


@lowering(
    notes=(
        "`maximum` then `minimum` with the bounds; a NaN input (which `maximum` leaves to the"
        " compute unit) becomes fmin(min, max) by `select`, as NaN-ignoring fmax/fmin give."
        " Integer data clamps in int32 to the truncated bounds saturated into the dtype (the same"
        " result as clamping in float and casting back); Bool data clamps in float."
    ),
)
def lower_clamp(op: ops.Clamp, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    src, out_dt = ctx.input_shape(0).dtype, ctx.out_shape.dtype
    if ctx.input_shape(0).sizes() != ctx.out_shape.sizes():
        raise ctx.fail(ShapeError, f"the input is {list(ctx.input_shape(0).sizes())}, but the node declares {list(ctx.out_shape.sizes())}")
    lo, hi = float(np.float32(op.min)), float(np.float32(op.max))
    if kind_of(src) == "int" and kind_of(out_dt) == "int":
        low, high = INT_RANGES[out_dt]
        bound_lo = np.int32(min(max(int(np.trunc(lo)), low), high))
        bound_hi = np.int32(min(max(int(np.trunc(hi)), low), high))
        x = convert(ctx, ctx.var(0), src, out_dt, suffix="x_int")
        raised = mb.maximum(x=x, y=bound_lo, name=ctx.name("raised"))
        return mb.minimum(x=raised, y=bound_hi, name=ctx.name())
    x = to_float(ctx, ctx.var(0), src, "x_float")
    raised = mb.maximum(x=x, y=ctx.scalar(lo), name=ctx.name("raised"))
    result = mb.minimum(x=raised, y=ctx.scalar(hi), name=ctx.name("clamped"))
    if may_hold_nan(ctx, 0):
        is_number = mb.equal(x=x, y=x, name=ctx.name("is_number"))
        result = mb.select(cond=is_number, a=result, b=ctx.scalar(min(lo, hi)), name=ctx.name("nan_fixed"))
    return convert(ctx, result, DType.F32, out_dt, suffix="out")
