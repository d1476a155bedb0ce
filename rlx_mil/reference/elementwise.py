"""Reference kernels of the element-wise ops: activations, casts, binary, compare, select."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rlx_mil.ir.ops import (
    Activation,
    ActivationKind,
    Binary,
    BinaryOp,
    Cast,
    CmpOp,
    Compare,
    Where,
)
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.integer import integer_activation, integer_binary
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
        unary = {
            ActivationKind.TANH: np.tanh, ActivationKind.EXP: np.exp, ActivationKind.LOG: np.log,
            ActivationKind.SQRT: np.sqrt, ActivationKind.NEG: np.negative, ActivationKind.ABS: np.abs,
            ActivationKind.SIN: np.sin, ActivationKind.COS: np.cos, ActivationKind.TAN: np.tan,
            ActivationKind.ATAN: np.arctan,
        }
        return np.asarray(unary[kind](v))


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
        return np.power(a, b)


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
