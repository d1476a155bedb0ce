"""How the program holds IR values, and the conversions between holdings.

Floats are held in the program float (fp16 or fp32), every integer dtype as int32, Bool as
bool. The helpers convert between those holdings with the IR's Cast semantics (float -> int
truncates toward zero and saturates, NaN -> 0; -> Bool is `!= 0`); every rule module uses them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.errors import ShapeError
from rlx_mil.ir.dtype import DType
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.target import Precision

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




def broadcast_sizes(ctx: LowerContext, names: tuple[str, ...]) -> tuple[int, ...]:
    """NumPy broadcast of the node's input shapes; a ShapeError naming the operands if they
    do not broadcast or the result is not the declared shape."""
    shapes = [ctx.input_shape(i).sizes() for i in range(len(names))]
    try:
        result = tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        listed = ", ".join(f"{n} {list(s)}" for n, s in zip(names, shapes, strict=True))
        raise ctx.fail(ShapeError, f"operands do not broadcast: {listed}", names[-1]) from None
    declared = ctx.out_shape.sizes()
    if result != declared and not (result in ((), (1,)) and declared in ((), (1,))):
        raise ctx.fail(ShapeError, f"operands broadcast to {list(result)}, but the node declares {list(declared)}")
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



def may_hold_nan(ctx: LowerContext, i: int) -> bool:
    """Whether input `i` may hold NaN (a float tensor not known at conversion, or a constant with one)."""
    if not ctx.input_shape(i).dtype.is_float:
        return False
    value = ctx.value(i)
    if value is None:
        return True
    arr = np.asarray(value)
    return arr.dtype.kind == "f" and bool(np.isnan(arr).any())
