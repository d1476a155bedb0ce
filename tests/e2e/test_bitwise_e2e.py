"""End-to-end: Binary BitAnd/BitOr/BitXor/Shl/Shr on integer and Bool operands (spec part 2, 3.12),
which lower exactly (nibble tables, power-of-two mul/floor_div); float operands stay refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rlx_mil
from e2e.factory import Feeds, e2e_settings, rng_for, seeds
from rlx_mil.errors import UnsupportedOpError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import BinaryOp
from rlx_mil.reference import evaluate

BITWISE = (BinaryOp.BIT_AND, BinaryOp.BIT_OR, BinaryOp.BIT_XOR)
SHIFTS = (BinaryOp.SHL, BinaryOp.SHR)
pairs = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=1, max_dims=3, max_side=4)
INT32_EDGES = np.array([0, 1, -1, 2**31 - 1, -(2**31), 0x55555555, -0x2AAAAAAB, 255, -256], np.int64)


def int32_values(rng: np.random.Generator, dims: tuple[int, ...]) -> np.ndarray:
    v = rng.integers(-(2**31), 2**31, size=dims, dtype=np.int64)
    return np.where(rng.random(dims) < 0.3, rng.choice(INT32_EDGES, size=dims), v).astype(np.int32)


@e2e_settings(2)
@given(shapes=pairs, op=st.sampled_from(BITWISE), seed=seeds)
def test_bitwise_on_int32(shapes: tuple[tuple[tuple[int, ...], ...], tuple[int, ...]], op: BinaryOp, seed: int) -> None:
    (a_dims, b_dims), _ = shapes
    rng = rng_for(seed)
    f = Feeds("bitwise_i32")
    a = f.input("a", int32_values(rng, a_dims), DType.I32)
    b = f.input("b", int32_values(rng, b_dims), DType.I32)
    f.verify([f.graph.binary(op, a, b, name="out")])


@e2e_settings(4)
@given(shapes=pairs, dtype=st.sampled_from((DType.I32, DType.I8, DType.U8)), constant=st.booleans(), seed=seeds)
def test_shifts_on_integers(shapes: tuple[tuple[tuple[int, ...], ...], tuple[int, ...]], dtype: DType, constant: bool,
                            seed: int) -> None:
    """Amounts include negatives (0), 31/32 and >= 64 (mod 64); Shl wraps into the dtype."""
    (a_dims, b_dims), _ = shapes
    rng = rng_for(seed)
    info = np.iinfo(dtype.numpy)
    values = int32_values(rng, a_dims) if dtype is DType.I32 else rng.integers(info.min, info.max + 1, size=a_dims)
    amounts = rng.choice(np.array([-3, 0, 1, 2, 5, 7, 8, 15, 30, 31, 32, 33, 63, 64, 66]), size=b_dims)
    f = Feeds("shift")
    a = f.input("a", values, dtype)
    b = f.leaf("constant" if constant else "input", "b", amounts, DType.I32)
    f.verify([f.graph.binary(op, a, b, name=op.value.lower()) for op in SHIFTS])


def test_shift_and_bitwise_reference_values() -> None:
    g = Graph("bits")
    a, b = g.input("a", [5], DType.I32), g.input("b", [5], DType.I32)
    g.set_outputs([g.binary(op, a, b, name=op.value.lower()) for op in (*BITWISE, *SHIFTS)])
    va = np.array([-8, 12, -(2**31), 7, -1], np.int32)
    vb = np.array([3, 10, 31, 66, 40], np.int32)
    ref = evaluate(g, {"a": va, "b": vb})
    np.testing.assert_array_equal(ref["bitand"], [0, 8, 0, 2, 40])
    np.testing.assert_array_equal(ref["bitor"], [-5, 14, -(2**31) + 31, 71, -1])
    np.testing.assert_array_equal(ref["bitxor"], [-5, 6, -(2**31) + 31, 69, -41])
    np.testing.assert_array_equal(ref["shl"], [-64, 12288, 0, 28, 0])
    np.testing.assert_array_equal(ref["shr"], [-1, 0, -1, 1, -1])
    f = Feeds("bits")
    fa, fb = f.input("a", va, DType.I32), f.input("b", vb, DType.I32)
    f.verify([f.graph.binary(op, fa, fb, name=op.value.lower()) for op in (*BITWISE, *SHIFTS)])


@e2e_settings(3)
@given(shapes=pairs, seed=seeds)
def test_bitwise_and_shifts_on_bool(shapes: tuple[tuple[tuple[int, ...], ...], tuple[int, ...]], seed: int) -> None:
    (a_dims, b_dims), _ = shapes
    rng = rng_for(seed)
    f = Feeds("bitwise_bool")
    a = f.input("a", rng.random(a_dims) < 0.5, DType.BOOL)
    b = f.input("b", rng.random(b_dims) < 0.5, DType.BOOL)
    f.verify([f.graph.binary(op, a, b, name=op.value.lower()) for op in (*BITWISE, *SHIFTS)])


@pytest.mark.parametrize("op", (*BITWISE, *SHIFTS))
def test_float_operands_stay_refused_by_name(op: BinaryOp) -> None:
    g = Graph("bitwise_float")
    a, b = g.input("a", [4], DType.I32), g.input("b", [4], DType.F32)
    g.set_outputs([g.binary(op, a, b, name="y")])
    with pytest.raises(UnsupportedOpError, match=f"Binary {op.value} on float operands.*no Core ML form"):
        rlx_mil.convert(g, {}, target="iOS18")
