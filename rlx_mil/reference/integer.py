"""Integer arithmetic of the IR (docs/op-coverage.md, "Integer and low-precision float
semantics"): when every operand is an integer (or Bool) and the result is an integer,
Add/Sub/Mul/Max/Min/Div, the bitwise ops and shifts, and Neg/Abs/Relu/Round are computed exactly and the result wraps
modulo 2^bits into the declared dtype, as NumPy's integer arithmetic does. Div truncates
toward zero; a division by zero gives 0. Everything else on integers (Pow, Sqrt, a float
operand...) is computed in float and converted with Cast semantics (truncate, saturate)."""

from __future__ import annotations

import numpy as np

from rlx_mil.ir.dtype import DType
from rlx_mil.ir.ops import ActivationKind, BinaryOp

EXACT_BINARY = (BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL, BinaryOp.MAX, BinaryOp.MIN, BinaryOp.DIV)
#: Bitwise ops and shifts: native 64-bit integer operations on integer operands (spec part 2, 3.12).
BIT_BINARY = (BinaryOp.BIT_AND, BinaryOp.BIT_OR, BinaryOp.BIT_XOR, BinaryOp.SHL, BinaryOp.SHR)
EXACT_ACTIVATIONS = (ActivationKind.NEG, ActivationKind.ABS, ActivationKind.RELU, ActivationKind.ROUND)


def _is_integer(a: np.ndarray) -> bool:
    return a.dtype.kind in "biu"


def truncating_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b rounded toward zero, 0 where b == 0 (int64 operands)."""
    safe = np.where(b == 0, 1, b)
    quotient = np.abs(a) // np.abs(safe)
    quotient = np.where((a < 0) != (safe < 0), -quotient, quotient)
    return np.where(b == 0, 0, quotient)


def bitwise_i64(op: BinaryOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`op` on int64 operands: shifts take `sat_u32(b) mod 64` (a negative amount is 0); Shl
    wraps, Shr is arithmetic."""
    bitwise = {BinaryOp.BIT_AND: np.bitwise_and, BinaryOp.BIT_OR: np.bitwise_or, BinaryOp.BIT_XOR: np.bitwise_xor}
    if op in bitwise:
        return bitwise[op](a, b)
    amount = np.clip(b, 0, 2**32 - 1) % 64
    return np.left_shift(a, amount) if op is BinaryOp.SHL else np.right_shift(a, amount)


def integer_binary(op: BinaryOp, lhs: np.ndarray, rhs: np.ndarray, out: DType) -> np.ndarray | None:
    """The exact integer result of `op` wrapped into `out`, or None if float math applies."""
    if not (out.is_int and _is_integer(lhs) and _is_integer(rhs) and op in (*EXACT_BINARY, *BIT_BINARY)):
        return None
    a, b = lhs.astype(np.int64), rhs.astype(np.int64)
    with np.errstate(over="ignore"):
        if op in BIT_BINARY:
            result = bitwise_i64(op, a, b)
        elif op is BinaryOp.DIV:
            result = truncating_divide(a, b)
        else:
            combine = {BinaryOp.ADD: np.add, BinaryOp.SUB: np.subtract, BinaryOp.MUL: np.multiply,
                       BinaryOp.MAX: np.maximum, BinaryOp.MIN: np.minimum}[op]
            result = combine(a, b)
        return result.astype(out.numpy)


def integer_activation(kind: ActivationKind, x: np.ndarray, out: DType) -> np.ndarray | None:
    """The exact integer result of `kind` wrapped into `out`, or None if float math applies."""
    if not (out.is_int and _is_integer(x) and kind in EXACT_ACTIVATIONS):
        return None
    v = x.astype(np.int64)
    with np.errstate(over="ignore"):
        if kind is ActivationKind.NEG:
            v = -v
        elif kind is ActivationKind.ABS:
            v = np.abs(v)
        elif kind is ActivationKind.RELU:
            v = np.maximum(v, 0)
        return v.astype(out.numpy)
