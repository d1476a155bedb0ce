"""End-to-end: Activation (all kinds), Cast, Binary (all ops), Compare (all ops), Where."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from e2e.factory import (
    Feeds,
    clear_fractions,
    e2e_settings,
    integers,
    leaf_kinds,
    normal,
    rng_for,
    seeds,
    signed,
    uniform,
)
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import ActivationKind, BinaryOp, CmpOp
from rlx_mil.lowering.target import Precision
from rlx_mil.testing import Tolerance

POSITIVE_DOMAIN = (ActivationKind.LOG, ActivationKind.SQRT, ActivationKind.RSQRT)
#: Float dtypes a graph may declare; the program holds all of them in its own float type.
IR_FLOATS = (DType.F32, DType.F16)
#: Declared F16 tensors are held in the program float (fp32 under fp32 precision), so the
#: reference's rounding to F16 makes fp32 agree only to fp16 accuracy.
F16_DECLARED_TOLERANCE = {Precision.FP32: Tolerance(2e-3, 2e-3)}

#: Rank 0 has its own test (`test_scalar_operands`): Core ML interfaces have no rank-0 tensors.
small_dims = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4)


def broadcast_pair(max_dims: int = 4) -> st.SearchStrategy[tuple[tuple[int, ...], ...]]:
    return hnp.mutually_broadcastable_shapes(
        num_shapes=2, min_dims=1, max_dims=max_dims, min_side=1, max_side=4
    ).map(lambda b: tuple(b.input_shapes))


@st.composite
def sub_broadcast(draw: st.DrawFn, dims: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to `dims` (some dims set to 1, some leading dims dropped;
    never rank 0, which `test_scalar_operands` covers)."""
    drop = draw(st.integers(0, len(dims) - 1))
    kept = dims[drop:]
    return tuple(1 if draw(st.booleans()) else d for d in kept)


# ------------------------------------------------------------------------------ Activation


@e2e_settings(4)
@given(dims=small_dims, dtype=st.sampled_from(IR_FLOATS), seed=seeds)
def test_every_activation_kind(dims: tuple[int, ...], dtype: DType, seed: int) -> None:
    """All 17 kinds in one graph, each on inputs inside its unambiguous domain (positive for
    Log/Sqrt/Rsqrt, |x| <= 1.2 for Tan, no .5 ties for Round); F32 or F16 declared tensors."""
    rng = rng_for(seed)
    f = Feeds("activations")
    general = f.input("x", clear_fractions(rng, dims, -3, 3), dtype)
    positive = f.input("x_pos", uniform(rng, dims, 0.1, 4.0), dtype)
    # tan has poles at +-pi/2; stay where fp16 rounding of the input barely moves tan.
    near_zero = f.input("x_small", uniform(rng, dims, -1.2, 1.2), dtype)
    outputs = []
    for kind in ActivationKind:
        source = positive if kind in POSITIVE_DOMAIN else near_zero if kind is ActivationKind.TAN else general
        outputs.append(f.graph.activation(kind, source, name=kind.value.lower()))
    f.verify(outputs, tolerances=F16_DECLARED_TOLERANCE if dtype is DType.F16 else None)


def test_activation_special_values() -> None:
    """NaN propagates; log(0) = -inf, rsqrt(0) = inf; logs and roots of negatives are NaN;
    Round breaks exact ties to even. (Relu of NaN and rsqrt(-0) have their own tests.)"""
    values = np.array([np.nan, 0.0, -2.0, 1.0, -1.5, 0.5, 2.5, -2.5, 3.5], np.float32)
    f = Feeds("activation_special")
    x = f.input("x", values)
    kinds = [k for k in ActivationKind if k is not ActivationKind.RELU]
    f.verify([f.graph.activation(kind, x, name=kind.value.lower()) for kind in kinds])


def test_relu_of_nan_is_zero() -> None:
    """Spec 4.1: Relu is NaN-ignoring (CPU maps NaN to 0), like Binary Max."""
    f = Feeds("relu_nan")
    x = f.input("x", np.array([np.nan, -1.0, 2.0], np.float32))
    f.verify([f.graph.relu(x, name="relu")])


def test_rsqrt_of_negative_zero() -> None:
    """`1/sqrt(-0.0)` is -inf (IEEE rSqrt(-0) = -inf), and Sqrt keeps the sign of zero."""
    f = Feeds("rsqrt_negative_zero")
    x = f.input("x", np.array([-0.0, 0.0, 4.0], np.float32))
    f.verify([f.graph.rsqrt(x, name="rsqrt"), f.graph.sqrt(x, name="sqrt")])


def test_scalar_operands() -> None:
    """Rank-0 inputs and outputs (the model interface holds them as shape [1])."""
    f = Feeds("scalars")
    x = f.input("x", np.array(0.75, np.float32))
    y = f.input("y", np.array([[1.5, -2.0]], np.float32))
    s = f.graph.exp(x, name="exp")
    f.verify([s, f.graph.add(y, s, name="add"), f.graph.mul(s, s, name="square")])


# ------------------------------------------------------------------------------ Cast

CAST_TARGETS = (
    DType.F32, DType.F16, DType.BF16, DType.F64, DType.I8, DType.I16, DType.I32, DType.I64,
    DType.U8, DType.U32, DType.BOOL,
)


@e2e_settings(3)
@given(dims=small_dims, seed=seeds)
def test_cast_float_to_every_dtype(dims: tuple[int, ...], seed: int) -> None:
    """Truncation toward zero and saturation (|x| up to 255 overflows I8/U8; negatives U8/U32)."""
    rng = rng_for(seed)
    values = clear_fractions(rng, dims, -255, 255)
    values[rng.random(values.shape) < 0.15] = 0.0  # -> Bool false
    f = Feeds("cast_from_f32")
    x = f.input("x", values)
    outputs = [f.graph.cast(x, to, name=f"to_{to.value.lower()}") for to in CAST_TARGETS]
    f.verify(outputs)


def test_cast_saturation_and_nan() -> None:
    """Exact-in-fp16 values around every int range edge; NaN -> 0 for ints, True for Bool."""
    values = np.array(
        [-60000, -40000, -300, -129, -128, -1.75, -0.75, 0, 0.75, 1.75, 127, 128, 255, 256, 300,
         40000, 60000, np.nan], np.float32,
    )
    f = Feeds("cast_edges")
    x = f.input("x", values)
    outputs = [f.graph.cast(x, to, name=f"to_{to.value.lower()}") for to in CAST_TARGETS]
    f.verify(outputs)


INT_SOURCES = (DType.I32, DType.I8, DType.I16, DType.U8, DType.I64, DType.BOOL)


@e2e_settings(3)
@given(dims=small_dims, seed=seeds)
def test_cast_from_int_and_bool(dims: tuple[int, ...], seed: int) -> None:
    """Every int dtype and Bool to floats, Bool and every int dtype (one input per source).
    Values span the source's range, within +-300 so fp16 holds them exactly; narrowing to a
    smaller int type wraps (spec 4.2: `x.astype(to)`; the reference wraps, as Rust `as`).
    Core ML holds every int as int32, so a negative value cast to U32 (which would wrap past
    2^31) is a documented limitation, checked separately below."""
    rng = rng_for(seed)
    f = Feeds("cast_from_int")
    outputs = []
    for source in INT_SOURCES:
        low, high = {DType.I8: (-128, 127), DType.U8: (0, 255), DType.BOOL: (0, 1)}.get(source, (-300, 300))
        label = source.value.lower()
        x = f.input(f"x_{label}", integers(rng, dims, low, high), source)
        outputs += [
            f.graph.cast(x, to, name=f"{label}_to_{to.value.lower()}")
            for to in CAST_TARGETS
            if not (to is DType.U32 and low < 0)
        ]
    f.verify(outputs)


def test_negative_to_u32_saturates_at_zero() -> None:
    """The documented limitation: U32 is held as int32, so negatives cannot wrap to 2^32 - n."""
    import shutil

    import rlx_mil

    g = Graph("neg_to_u32")
    x = g.input("x", [3], "i32")
    g.set_outputs([g.cast(x, "u32", name="y")])
    model = rlx_mil.convert(g, target="iOS17", precision="fp32")
    try:
        got = rlx_mil.milexec.run(model, {"x": np.int32([-5, 0, 7])})["y"]
    finally:
        shutil.rmtree(model.package_path, ignore_errors=True)
    np.testing.assert_array_equal(got, [0, 0, 7])


# ------------------------------------------------------------------------------ Binary


@e2e_settings(5)
@given(shapes=broadcast_pair(), rhs_kind=leaf_kinds, with_nan=st.booleans(), seed=seeds)
def test_every_binary_op(shapes: tuple[tuple[int, ...], ...], rhs_kind: str, with_nan: bool, seed: int) -> None:
    """All 7 ops with NumPy broadcasting; the rhs is an input, a weight or a constant.
    NaNs: arithmetic propagates them, Max/Min ignore them (fmax/fmin)."""
    lhs_dims, rhs_dims = shapes
    rng = rng_for(seed)
    lhs = normal(rng, lhs_dims, 2.0)
    rhs = signed(rng, rhs_dims, 0.5, 3.0)  # divisor and exponent away from 0
    base = uniform(rng, lhs_dims, 0.5, 2.0)  # real powers need a positive base
    if with_nan:
        lhs[rng.random(lhs.shape) < 0.3] = np.nan
        rhs[rng.random(rhs.shape) < 0.3] = np.nan
    f = Feeds("binary")
    a = f.input("a", lhs)
    b = f.leaf(rhs_kind, "b", rhs)
    p = f.input("p", base)
    # Bitwise ops and shifts have no Core ML form (refused by name, tests/lower/test_elementwise.py).
    no_core_ml = (BinaryOp.BIT_AND, BinaryOp.BIT_OR, BinaryOp.BIT_XOR, BinaryOp.SHL, BinaryOp.SHR, BinaryOp.POW)
    outputs = [f.graph.binary(op, a, b, name=op.value.lower()) for op in BinaryOp if op not in no_core_ml]
    outputs.append(f.graph.binary(BinaryOp.POW, p, b, name="pow"))
    f.verify(outputs)


@e2e_settings(3)
@given(dims=small_dims, exponent=st.sampled_from([2.0, 3.0, -1.0, -2.0, 0.0, 1.0, 0.5, -0.5]), seed=seeds)
def test_pow_constant_exponent(dims: tuple[int, ...], exponent: float, seed: int) -> None:
    """Constant exponents take special paths (x*x, sign-corrected integer powers): negative
    bases with integer exponents are real, with fractional ones NaN in both."""
    rng = rng_for(seed)
    f = Feeds("pow_const")
    x = f.input("x", signed(rng, dims, 0.5, 2.0))
    e = f.constant("e", np.array([exponent], np.float32))
    f.verify([f.graph.pow(x, e, name="pow")])


@e2e_settings(3)
@given(shapes=broadcast_pair(3), rhs_dtype=st.sampled_from((DType.I32, DType.F32)), seed=seeds)
def test_binary_integer_lhs(shapes: tuple[tuple[int, ...], ...], rhs_dtype: DType, seed: int) -> None:
    """I32 lhs: output I32 (Div truncates toward zero); a float rhs is combined in float
    and the result converted to the lhs dtype."""
    lhs_dims, rhs_dims = shapes
    rng = rng_for(seed)
    f = Feeds("binary_int")
    a = f.input("a", integers(rng, lhs_dims, -20, 20), DType.I32)
    divisor = integers(rng, rhs_dims, 1, 5) * np.where(rng.random(rhs_dims) < 0.5, -1, 1).astype(np.float32)
    b = f.input("b", divisor if rhs_dtype is DType.I32 else divisor + 0.25, rhs_dtype)
    e = f.input("e", integers(rng, rhs_dims, 0, 3), DType.I32)
    # Bitwise ops and shifts have no Core ML form (refused by name, tests/lower/test_elementwise.py).
    no_core_ml = (BinaryOp.BIT_AND, BinaryOp.BIT_OR, BinaryOp.BIT_XOR, BinaryOp.SHL, BinaryOp.SHR, BinaryOp.POW)
    outputs = [f.graph.binary(op, a, b, name=op.value.lower()) for op in BinaryOp if op not in no_core_ml]
    outputs.append(f.graph.binary(BinaryOp.POW, a, e, name="pow"))
    f.verify(outputs)


# ------------------------------------------------------------------------------ Compare


@pytest.mark.parametrize("dtype", [DType.F32, DType.I32], ids=["f32", "i32"])
@e2e_settings(3)
@given(shapes=broadcast_pair(), rhs_kind=leaf_kinds, with_nan=st.booleans(), seed=seeds)
def test_every_compare_op(
    dtype: DType, shapes: tuple[tuple[int, ...], ...], rhs_kind: str, with_nan: bool, seed: int
) -> None:
    """Values from a small grid so equality happens often; NaN compares unequal to all."""
    lhs_dims, rhs_dims = shapes
    rng = rng_for(seed)
    step = 1.0 if dtype is DType.I32 else 0.5
    lhs = integers(rng, lhs_dims, -2, 2) * step
    rhs = integers(rng, rhs_dims, -2, 2) * step
    if with_nan and dtype is DType.F32:
        lhs[rng.random(lhs.shape) < 0.3] = np.nan
    f = Feeds("compare")
    a = f.input("a", lhs, dtype)
    b = f.leaf(rhs_kind, "b", rhs, dtype)
    f.verify([f.graph.compare(op, a, b, name=op.value.lower()) for op in CmpOp])


# ------------------------------------------------------------------------------ Where


@st.composite
def where_shapes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    on_true, on_false = draw(broadcast_pair())
    result = np.broadcast_shapes(on_true, on_false)
    return draw(sub_broadcast(result)), on_true, on_false


@e2e_settings(5)
@given(
    shapes=where_shapes(),
    branch_dtype=st.sampled_from((DType.F32, DType.I32)),
    false_kind=leaf_kinds,
    seed=seeds,
)
def test_where(shapes: tuple[tuple[int, ...], ...], branch_dtype: DType, false_kind: str, seed: int) -> None:
    """3-way broadcasting; a Bool, float or int cond (one node each) is true where non-zero."""
    cond_dims, true_dims, false_dims = shapes
    rng = rng_for(seed)
    cond = integers(rng, cond_dims, -1, 1) * 0.5  # -0.5, 0, 0.5: non-zero fractions are true
    f = Feeds("where")
    t = f.input("on_true", integers(rng, true_dims, -50, 50), branch_dtype)
    e = f.leaf(false_kind, "on_false", integers(rng, false_dims, -50, 50), branch_dtype)
    outputs = []
    for cond_dtype in (DType.BOOL, DType.F32, DType.I32):
        label = cond_dtype.value.lower()
        c = f.input(f"cond_{label}", cond if cond_dtype is DType.F32 else np.sign(cond), cond_dtype)
        outputs.append(f.graph.where_(c, t, e, name=f"where_{label}"))
    f.verify(outputs)


def test_where_of_compare() -> None:
    """The usual pattern: Where(Compare(x, y), x, y) and a Bool produced inside the graph."""
    rng = rng_for(7)
    f = Feeds("where_compare")
    x = f.input("x", normal(rng, (2, 3, 4)))
    y = f.input("y", normal(rng, (3, 1)))
    mask = f.graph.gt_(x, y)
    f.verify([f.graph.where_(mask, x, y, name="where"), mask])
