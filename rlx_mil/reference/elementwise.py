"""Reference kernels of the element-wise ops: activations, casts, binary, compare, select,
StopGradient, Fma, Clamp."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from rlx_mil.ir.ops import (
    Activation,
    ActivationKind,
    Binary,
    BinaryOp,
    Cast,
    Clamp,
    CmpOp,
    Compare,
    Fma,
    StopGradient,
    Where,
)
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.integer import bitwise_i64, integer_activation, integer_binary
from rlx_mil.reference.registry import (
    broadcast_sizes,
    finish,
    float_operands,
    reference_kernel,
    to_dtype,
)
from rlx_mil.reference.special import erf

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_GELU_TANH_C = 0.7978845608  # sqrt(2/pi) as the spec writes it
_GELU_TANH_CUBIC = 0.044715


def activation(kind: ActivationKind, x: np.ndarray) -> np.ndarray:
    """Spec 4.1, in float32 (float64 for float64 or wide-integer inputs)."""
    (v,) = float_operands(x)
    dt = v.dtype.type
    with np.errstate(all="ignore"):
        if kind is ActivationKind.GELU:
            w = v.astype(np.float64)
            return (0.5 * w * (1.0 + erf(w * _SQRT_HALF))).astype(v.dtype)
        if kind is ActivationKind.GELU_APPROX:
            inner = dt(_GELU_TANH_C) * (v + dt(_GELU_TANH_CUBIC) * v * v * v)
            return dt(0.5) * v * (dt(1) + np.tanh(inner))
        if kind is ActivationKind.SILU:
            return v / (dt(1) + np.exp(-v))
        if kind is ActivationKind.SIGMOID:
            return dt(1) / (dt(1) + np.exp(-v))
        if kind is ActivationKind.RELU:
            # NaN-ignoring max, like Binary Max (CPU maps NaN to 0).
            return np.fmax(v, dt(0))
        if kind is ActivationKind.RSQRT:
            return dt(1) / np.sqrt(v)
        if kind is ActivationKind.ROUND:
            return np.rint(v)  # ties to even
        if kind is ActivationKind.ERF:
            return erf(v.astype(np.float64)).astype(v.dtype)
        newer = _NEWER_ACTIVATIONS.get(kind)
        if newer is not None:
            return np.asarray(newer(v), dtype=v.dtype)
        unary = {
            ActivationKind.TANH: np.tanh, ActivationKind.EXP: np.exp, ActivationKind.LOG: np.log,
            ActivationKind.SQRT: np.sqrt, ActivationKind.NEG: np.negative, ActivationKind.ABS: np.abs,
            ActivationKind.SIN: np.sin, ActivationKind.COS: np.cos, ActivationKind.TAN: np.tan,
            ActivationKind.ATAN: np.arctan,
        }
        return np.asarray(unary[kind](v))


def _softplus(v: np.ndarray) -> np.ndarray:
    return np.logaddexp(v.dtype.type(0), v)


# The activation kinds the newest upstream added (spec part 2, section 1.4).
_NEWER_ACTIVATIONS: dict[ActivationKind, Callable[[np.ndarray], np.ndarray]] = {
    ActivationKind.RECIP: lambda v: v.dtype.type(1) / v,
    ActivationKind.FLOOR: np.floor,
    ActivationKind.CEIL: np.ceil,
    ActivationKind.SIGN: np.sign,
    ActivationKind.SOFTPLUS: _softplus,
    ActivationKind.ELU: lambda v: np.where(v > 0, v, np.expm1(v)),
    ActivationKind.HARD_SWISH: lambda v: v * np.clip(v + 3, 0, 6) / v.dtype.type(6),
    ActivationKind.HARD_SIGMOID: lambda v: np.clip(v / v.dtype.type(6) + v.dtype.type(0.5), 0, 1),
    ActivationKind.MISH: lambda v: v * np.tanh(_softplus(v)),
    ActivationKind.SOFTSIGN: lambda v: v / (1 + np.abs(v)),
    ActivationKind.LOG_SIGMOID: lambda v: np.minimum(v, 0) - np.log1p(np.exp(-np.abs(v))),
}


@reference_kernel(Activation)
def _activation(op: Activation, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    exact = integer_activation(op.kind, inputs[0], out.dtype)
    return exact if exact is not None else finish(activation(op.kind, inputs[0]), out)


@reference_kernel(Cast)
def _cast(op: Cast, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return to_dtype(inputs[0], op.to)


def binary(op: BinaryOp, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    broadcast_sizes([lhs.shape, rhs.shape], ["lhs", "rhs"])
    a, b = float_operands(lhs, rhs)
    with np.errstate(all="ignore"):
        if op is BinaryOp.ADD:
            return a + b
        if op is BinaryOp.SUB:
            return a - b
        if op is BinaryOp.MUL:
            return a * b
        if op is BinaryOp.DIV:
            return a / b
        if op is BinaryOp.MAX:
            return np.fmax(a, b)
        if op is BinaryOp.MIN:
            return np.fmin(a, b)
        if op is BinaryOp.POW:
            return np.power(a, b)
        if op is BinaryOp.MOD:
            return np.fmod(a, b)  # C fmod: the sign of the dividend
        if op is BinaryOp.ATAN2:
            return np.arctan2(a, b)
        return _integer_binary(op, a, b).astype(a.dtype)


def saturate_i64(v: np.ndarray) -> np.ndarray:
    """Truncate toward zero, saturate to the i64 range, NaN -> 0 (Rust `as i64`)."""
    t = np.trunc(np.nan_to_num(v.astype(np.float64), nan=0.0))
    return np.clip(t, -(2.0**63), np.nextafter(2.0**63, 0)).astype(np.int64)


def _integer_binary(op: BinaryOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bitwise ops and shifts on i64 conversions of the operands (spec part 2, 3.12): shifts
    take `sat_u32(b) mod 64` (negative or NaN amounts are 0); Shl wraps, Shr is arithmetic."""
    ai = saturate_i64(a)
    if op in (BinaryOp.BIT_AND, BinaryOp.BIT_OR, BinaryOp.BIT_XOR):
        return bitwise_i64(op, ai, saturate_i64(b))
    # sat_u32 of the amount: NaN and negatives give 0 (then mod 64, in bitwise_i64).
    amount = np.clip(np.trunc(np.nan_to_num(b.astype(np.float64), nan=0.0)), 0, 2.0**32 - 1).astype(np.int64)
    return bitwise_i64(op, ai, amount)


@reference_kernel(Binary)
def _binary(op: Binary, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    broadcast_sizes([inputs[0].shape, inputs[1].shape], ["lhs", "rhs"])
    exact = integer_binary(op.op, inputs[0], inputs[1], out.dtype)
    return exact if exact is not None else finish(binary(op.op, inputs[0], inputs[1]), out)


_COMPARE = {
    CmpOp.EQ: np.equal, CmpOp.NE: np.not_equal, CmpOp.LT: np.less,
    CmpOp.LE: np.less_equal, CmpOp.GT: np.greater, CmpOp.GE: np.greater_equal,
}


@reference_kernel(Compare)
def _compare(op: Compare, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    broadcast_sizes([inputs[0].shape, inputs[1].shape], ["lhs", "rhs"])
    a, b = float_operands(inputs[0], inputs[1])
    return finish(_COMPARE[op.op](a, b), out)


@reference_kernel(Where)
def _where(op: Where, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    cond, on_true, on_false = inputs
    broadcast_sizes([cond.shape, on_true.shape, on_false.shape], ["cond", "on_true", "on_false"])
    # Each branch converts to the declared dtype with Cast semantics, then one is picked.
    return np.where(cond != 0, to_dtype(on_true, out.dtype), to_dtype(on_false, out.dtype))


@reference_kernel(StopGradient)
def _stop_gradient(op: StopGradient, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(inputs[0], out)


@reference_kernel(Fma)
def _fma(op: Fma, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    """`a * b + c` rounded once (spec part 2, 3.2): the product of two f32 is exact in f64.
    Integer operands with an integer result wrap into the declared dtype, as Mul and Add do."""
    a, b, c = inputs
    broadcast_sizes([a.shape, b.shape, c.shape], ["a", "b", "c"])
    if out.dtype.is_int and all(v.dtype.kind in "biu" for v in inputs):
        with np.errstate(over="ignore"):
            exact = a.astype(np.int64) * b.astype(np.int64) + c.astype(np.int64)
        return finish(exact, out)
    wide = [v.astype(np.float64) for v in inputs]
    with np.errstate(all="ignore"):
        return finish(wide[0] * wide[1] + wide[2], out)


@reference_kernel(Clamp)
def _clamp(op: Clamp, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    """`fmin(fmax(x, min), max)` (spec part 2, 3.3): NaN becomes `fmin(min, max)`; integer data
    is clamped in float and converted back with Cast semantics."""
    (v,) = float_operands(inputs[0])
    dt = v.dtype.type
    return finish(np.fmin(np.fmax(v, dt(np.float32(op.min))), dt(np.float32(op.max))), out)
