"""Reference leaves and element-wise ops against scalar `math` formulas and bit-level oracles."""

from __future__ import annotations

import itertools
import math
import struct
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from refgraph import run_kernel, run_op

from rlx_mil.errors import AttributeValueError
from rlx_mil.ir import DType
from rlx_mil.ir.ops import (
    Activation,
    ActivationKind,
    Binary,
    BinaryOp,
    Cast,
    CmpOp,
    Compare,
    Constant,
    Where,
)
from rlx_mil.reference import erf, round_to_bf16

A = ActivationKind


def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v)) if v > -700 else 0.0


SCALAR = {
    A.GELU: lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))),
    A.GELU_APPROX: lambda v: 0.5 * v * (1.0 + math.tanh(0.7978845608 * (v + 0.044715 * v**3))),
    A.SILU: lambda v: v * _sigmoid(v),
    A.RELU: lambda v: v if v > 0 else 0.0,
    A.SIGMOID: _sigmoid,
    A.TANH: math.tanh,
    A.EXP: lambda v: math.exp(v) if v < 700 else math.inf,
    A.LOG: lambda v: math.log(v) if v > 0 else (-math.inf if v == 0 else math.nan),
    A.SQRT: lambda v: math.sqrt(v) if v >= 0 else math.nan,
    A.RSQRT: lambda v: (1.0 / math.sqrt(v) if v > 0 else math.copysign(math.inf, v)) if v >= 0 else math.nan,
    A.NEG: lambda v: -v,
    A.ABS: abs,
    A.ROUND: lambda v: float(round(v)),  # Python's round is ties-to-even
    A.SIN: math.sin,
    A.COS: math.cos,
    A.TAN: math.tan,
    A.ATAN: math.atan,
    A.RECIP: lambda v: 1.0 / v if v != 0 else math.copysign(math.inf, v),
    A.FLOOR: lambda v: float(math.floor(v)),
    A.CEIL: lambda v: float(math.ceil(v)),
    A.SIGN: lambda v: float((v > 0) - (v < 0)),
    A.SOFTPLUS: lambda v: math.log1p(math.exp(v)),
    A.ELU: lambda v: v if v > 0 else math.expm1(v),
    A.ERF: math.erf,
    A.HARD_SWISH: lambda v: v * min(max(v + 3.0, 0.0), 6.0) / 6.0,
    A.HARD_SIGMOID: lambda v: min(max(v / 6.0 + 0.5, 0.0), 1.0),
    A.MISH: lambda v: v * math.tanh(math.log1p(math.exp(v))),
    A.SOFTSIGN: lambda v: v / (1.0 + abs(v)),
    A.LOG_SIGMOID: lambda v: math.log(_sigmoid(v)),
}

small_shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5)


@pytest.mark.parametrize("kind", list(ActivationKind))
@given(data=st.data())
def test_activation_matches_scalar_formula(kind: ActivationKind, data: st.DataObject) -> None:
    dtype = data.draw(st.sampled_from([np.float32, np.float16]))
    x = data.draw(hnp.arrays(dtype, small_shapes, elements=st.floats(-12, 12, width=16)))
    y = run_op(Activation(kind), [x], x.shape, DType.parse(x.dtype))
    assert y.dtype == x.dtype and y.shape == x.shape
    want = np.array([SCALAR[kind](float(v)) for v in x.ravel()], dtype=np.float64).reshape(x.shape)
    tol = 2e-3 if dtype == np.float16 else 2e-6
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(y.astype(np.float64), want.astype(dtype).astype(np.float64), rtol=tol, atol=tol, equal_nan=True)


def test_round_is_ties_to_even() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, -3.51], np.float32)
    y = run_op(Activation(A.ROUND), [x], x.shape)
    assert y.tolist() == [0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 3.0, -4.0]


def test_relu_maps_nan_to_zero_and_gelu_is_exact_erf() -> None:
    x = np.array([np.nan, -1.0, 2.0], np.float32)
    assert run_op(Activation(A.RELU), [x], [3]).tolist() == [0.0, 0.0, 2.0]
    # The tanh form differs from the erf form by up to ~5e-4; the reference must be the erf one.
    g = run_op(Activation(A.GELU), [np.array([-3.0, -1.0, 1.5], np.float32)], [3])
    want = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in (-3.0, -1.0, 1.5)]
    np.testing.assert_allclose(g, want, rtol=1e-7, atol=1e-9)


def test_erf_is_accurate_everywhere() -> None:
    xs = np.concatenate([np.linspace(-7, 7, 20001), [0.0, -0.0, 1e-300, 1.9999999, 2.0, 2.0000001, 30.0]])
    got = erf(xs)
    want = np.array([math.erf(v) for v in xs])
    assert np.max(np.abs(got - want)) < 3e-15
    assert erf(np.array([np.inf, -np.inf])).tolist() == [1.0, -1.0]
    assert np.isnan(erf(np.array([np.nan])))[0]


# ------------------------------------------------------------------------------ binary


def _broadcast_loop(fn, *arrays: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Apply a scalar function over the NumPy broadcast of `arrays`, index by index."""
    out_shape = np.broadcast_shapes(*(a.shape for a in arrays))
    out = np.empty(out_shape, dtype=object)
    for idx in itertools.product(*(range(n) for n in out_shape)):
        picked = []
        for a in arrays:
            offset = len(out_shape) - a.ndim
            src = tuple(0 if a.shape[d] == 1 else idx[offset + d] for d in range(a.ndim))
            picked.append(a[src].item())
        out[idx] = fn(*picked)
    return out


def _scalar_binary(op: BinaryOp):  # type: ignore[no-untyped-def]
    def div(a: float, b: float) -> float:
        if b == 0:
            return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1, b)
        return a / b

    def fmax(a: float, b: float) -> float:
        return b if math.isnan(a) else a if math.isnan(b) else max(a, b)

    def fmin(a: float, b: float) -> float:
        return b if math.isnan(a) else a if math.isnan(b) else min(a, b)

    def power(a: float, b: float) -> float:
        try:
            r = a**b
        except (OverflowError, ZeroDivisionError):
            return math.inf
        return math.nan if isinstance(r, complex) else float(r)

    def fmod(a: float, b: float) -> float:
        return math.nan if b == 0 or math.isnan(a) or math.isnan(b) else math.fmod(a, b)

    def to_i64(v: float) -> int:
        return 0 if math.isnan(v) else max(-(2**63), min(2**63 - 1, math.trunc(v)))

    def shift(a: float, b: float, left: bool) -> float:
        amount = 0 if math.isnan(b) or b < 0 else min(math.trunc(b), 2**32 - 1) % 64
        value = to_i64(a)
        if left:
            value = ((value << amount) + 2**63) % 2**64 - 2**63
        else:
            value >>= amount
        return float(value)

    return {
        BinaryOp.ADD: lambda a, b: a + b, BinaryOp.SUB: lambda a, b: a - b,
        BinaryOp.MUL: lambda a, b: a * b, BinaryOp.DIV: div, BinaryOp.MAX: fmax,
        BinaryOp.MIN: fmin, BinaryOp.POW: power, BinaryOp.MOD: fmod, BinaryOp.ATAN2: math.atan2,
        BinaryOp.BIT_AND: lambda a, b: float(to_i64(a) & to_i64(b)),
        BinaryOp.BIT_OR: lambda a, b: float(to_i64(a) | to_i64(b)),
        BinaryOp.BIT_XOR: lambda a, b: float(to_i64(a) ^ to_i64(b)),
        BinaryOp.SHL: lambda a, b: shift(a, b, True), BinaryOp.SHR: lambda a, b: shift(a, b, False),
    }[op]


@pytest.mark.parametrize("op", list(BinaryOp))
@given(data=st.data())
def test_binary_broadcasts_like_numpy(op: BinaryOp, data: st.DataObject) -> None:
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=4))
    lo = 0.25 if op is BinaryOp.POW else -8
    elems = st.floats(lo, 8, width=32) | st.sampled_from([0.0, np.nan] if op is not BinaryOp.POW else [1.0])
    a = data.draw(hnp.arrays(np.float32, shapes.input_shapes[0], elements=elems))
    b = data.draw(hnp.arrays(np.float32, shapes.input_shapes[1], elements=elems))
    y = run_op(Binary(op), [a, b], shapes.result_shape)
    want = _broadcast_loop(_scalar_binary(op), a.astype(np.float64), b.astype(np.float64)).astype(np.float64)
    np.testing.assert_allclose(y, want.astype(np.float32), rtol=3e-6, atol=1e-30, equal_nan=True)


def test_max_min_ignore_nan_and_division_is_ieee() -> None:
    a = np.array([np.nan, 1.0, np.nan, 0.0, 1.0, -1.0], np.float32)
    b = np.array([2.0, np.nan, np.nan, 0.0, 0.0, 0.0], np.float32)
    mx = run_op(Binary(BinaryOp.MAX), [a, b], [6])
    mn = run_op(Binary(BinaryOp.MIN), [a, b], [6])
    assert mx[:2].tolist() == [2.0, 1.0] and np.isnan(mx[2])
    assert mn[:2].tolist() == [2.0, 1.0]
    d = run_op(Binary(BinaryOp.DIV), [a, b], [6])
    assert np.isnan(d[3]) and d[4] == np.inf and d[5] == -np.inf
    p = run_op(Binary(BinaryOp.POW), [np.array([-8.0, -2.0], np.float32), np.array([1 / 3, 2.0], np.float32)], [2])
    assert np.isnan(p[0]) and p[1] == 4.0


def test_binary_output_takes_declared_dtype() -> None:
    a = np.array([1.5, 2.25], np.float16)
    b = np.array([0.25, 0.5], np.float16)
    y = run_op(Binary(BinaryOp.MUL), [a, b], [2], DType.F16)
    assert y.dtype == np.float16 and y.tolist() == [0.375, 1.125]
    ints = run_op(Binary(BinaryOp.ADD), [np.array([2**40, 3], np.int64), np.array([1, -5], np.int64)], [2], DType.I64)
    assert ints.dtype == np.int64 and ints.tolist() == [2**40 + 1, -2]


@pytest.mark.parametrize("op", list(CmpOp))
@given(data=st.data())
def test_compare_gives_bool(op: CmpOp, data: st.DataObject) -> None:
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=1, max_dims=3, max_side=4))
    elems = st.sampled_from([-1.0, 0.0, 0.5, 2.0, np.nan])
    a = data.draw(hnp.arrays(np.float32, shapes.input_shapes[0], elements=elems))
    b = data.draw(hnp.arrays(np.float32, shapes.input_shapes[1], elements=elems))
    y = run_op(Compare(op), [a, b], shapes.result_shape, DType.BOOL)
    fn = {
        CmpOp.EQ: lambda x, z: x == z, CmpOp.NE: lambda x, z: x != z, CmpOp.LT: lambda x, z: x < z,
        CmpOp.LE: lambda x, z: x <= z, CmpOp.GT: lambda x, z: x > z, CmpOp.GE: lambda x, z: x >= z,
    }[op]
    assert y.dtype == np.bool_
    assert y.tolist() == _broadcast_loop(fn, a, b).astype(bool).tolist()


@given(data=st.data())
def test_where_broadcasts_all_three(data: st.DataObject) -> None:
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=1, max_dims=3, max_side=4))
    cond = data.draw(hnp.arrays(np.float32, shapes.input_shapes[0], elements=st.sampled_from([0.0, 1.0, -2.0, 0.5])))
    t = data.draw(hnp.arrays(np.float32, shapes.input_shapes[1], elements=st.floats(-5, 5, width=32)))
    f = data.draw(hnp.arrays(np.float32, shapes.input_shapes[2], elements=st.floats(-5, 5, width=32)))
    y = run_op(Where(), [cond, t, f], shapes.result_shape)
    want = _broadcast_loop(lambda c, a, b: a if c != 0 else b, cond, t, f).astype(np.float32)
    np.testing.assert_array_equal(y, want)


def test_where_accepts_bool_condition() -> None:
    cond = np.array([[True], [False]])
    y = run_op(Where(), [cond, np.array([1.0, 2.0], np.float32), np.float32(-1.0).reshape(1)], [2, 2])
    assert y.tolist() == [[1.0, 2.0], [-1.0, -1.0]]


# ------------------------------------------------------------------------------ cast


def _bf16_oracle(v: float) -> float:
    """Nearest bfloat16 (8 significant bits), ties to even, by exact rational arithmetic."""
    if v == 0 or not math.isfinite(v):
        return v
    exponent = math.frexp(v)[1] - 1  # v = m * 2^exponent with 1 <= |m| < 2
    exponent = max(exponent, -126)  # subnormal spacing below the smallest normal
    ulp = Fraction(2) ** (exponent - 7)
    q = Fraction(v) / ulp
    lower = math.floor(q)
    frac = q - lower
    n = lower + 1 if frac > Fraction(1, 2) or (frac == Fraction(1, 2) and lower % 2 == 1) else lower
    return float(n * ulp)


@given(st.lists(st.floats(-(2.0**127), 2.0**127, width=32), min_size=1, max_size=20))
def test_bf16_rounding_matches_exact_oracle(values: list[float]) -> None:
    x = np.array(values, np.float32)
    got = round_to_bf16(x)
    want = np.array([_bf16_oracle(float(v)) for v in x], np.float64)
    assert got.astype(np.float64).tolist() == want.tolist()


def test_bf16_rounding_ties_to_even() -> None:
    # 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
    # 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1 + 2**-8 + 2**-20], np.float32)
    assert round_to_bf16(x).tolist() == [1.0, 1 + 2**-6, -1.0, 1 + 2**-7]


def test_cast_semantics() -> None:
    x = np.array([2.7, -2.7, 0.0, np.nan, 1e10, -1e10, 0.4], np.float32)
    assert run_op(Cast(DType.I32), [x], [7], DType.I32).tolist() == [2, -2, 0, 0, 2**31 - 1, -(2**31), 0]
    assert run_op(Cast(DType.I8), [x], [7], DType.I8).tolist() == [2, -2, 0, 0, 127, -128, 0]
    assert run_op(Cast(DType.U8), [x], [7], DType.U8).tolist() == [2, 0, 0, 0, 255, 0, 0]
    assert run_op(Cast(DType.BOOL), [x], [7], DType.BOOL).tolist() == [True, True, False, True, True, True, True]
    h = run_op(Cast(DType.F16), [np.array([1 + 2**-11, 1 + 3 * 2**-11, 70000.0], np.float32)], [3], DType.F16)
    assert h.dtype == np.float16
    want = [struct.unpack("<e", struct.pack("<e", v))[0] for v in (1 + 2**-11, 1 + 3 * 2**-11)]
    assert h[:2].tolist() == want == [1.0, 1 + 2**-9]
    assert h[2] == np.inf
    b = run_op(Cast(DType.BF16), [np.array([1 + 2**-8, 3.0], np.float32)], [2], DType.BF16)
    assert b.dtype == np.float32 and b.tolist() == [1.0, 3.0]
    back = run_op(Cast(DType.F32), [np.array([True, False])], [2], DType.F32)
    assert back.tolist() == [1.0, 0.0]
    wrapped = run_op(Cast(DType.I8), [np.array([300, -129, 5], np.int64)], [3], DType.I8)
    assert wrapped.tolist() == [44, 127, 5]  # int -> int wraps like Rust `as`


# ------------------------------------------------------------------------------ constant


@pytest.mark.parametrize(
    ("dtype", "fmt", "values"),
    [
        (DType.F32, "f", [1.5, -2.0, 0.1]),
        (DType.F64, "d", [1e-300, -3.25, 7.0]),
        (DType.F16, "e", [0.5, -65504.0, 2.0**-24]),
        (DType.I8, "b", [-128, 127, 5]),
        (DType.I16, "h", [-30000, 2, 3]),
        (DType.I32, "i", [-(2**31), 7, 2**31 - 1]),
        (DType.I64, "q", [-(2**62), 1, 2**62]),
        (DType.U8, "B", [0, 200, 255]),
        (DType.U32, "I", [2**32 - 1, 0, 9]),
    ],
)
def test_constant_decodes_little_endian(dtype: DType, fmt: str, values: list[float]) -> None:
    data = struct.pack("<" + fmt * len(values), *values)
    y = run_kernel(Constant(data), [], [3], dtype)
    assert y.dtype == dtype.numpy
    want = list(struct.unpack("<" + fmt * len(values), data))
    assert y.tolist() == pytest.approx(want, rel=1e-7) if dtype.is_float else y.tolist() == want


def test_constant_bf16_bool_and_shape() -> None:
    bf = run_kernel(Constant(bytes([0x80, 0x3F, 0xC0, 0xBF, 0x49, 0x40, 0, 0])), [], [2, 2], DType.BF16)
    assert bf.tolist() == [[1.0, -1.5], [3.140625, 0.0]]
    flags = run_kernel(Constant(bytes([0, 1, 2, 0])), [], [4], DType.BOOL)
    assert flags.tolist() == [False, True, True, False]
    with pytest.raises(AttributeValueError, match="data holds 3 bytes"):
        run_kernel(Constant(b"\x00\x00\x80"), [], [1], DType.F32)
