"""Lowering of Activation, Cast, Binary, Compare and Where (spec section 4).

Each case is converted with `rlx_mil.convert` for every target and precision, the emitted MIL
ops are checked, and the converted program is run on NumPy and compared with
`rlx_mil.reference.evaluate`. Where Core ML leaves a corner case to the compute unit (tie
rounding, NaN in maximum, fraction handling in cast), the program is also run with kernels that
behave the other way, to show the lowering does not depend on it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rlx_mil
from rlx_mil.errors import UnsupportedOpError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import ActivationKind, BinaryOp, CmpOp
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import round_to_bf16, to_dtype

from .conftest import (
    PRECISIONS,
    TARGETS,
    check_against_reference,
    convert_and_cleanup,
    emitted_ops,
    ops_outside_opset,
    run_model,
)

TARGET_PRECISION = [(t, p) for t in TARGETS for p in PRECISIONS]


def mil_ops_of_type(model: Any, op_type: str) -> list[Any]:
    return [op for op in model._mil_program.functions["main"].operations if op.op_type == op_type]


def unary_graph(kinds: list[ActivationKind], shape: tuple[int, ...]) -> Graph:
    g = Graph("activations")
    x = g.add_node(ops.Input("x"), [], Shape.of(shape))
    g.set_outputs([g.add_node(ops.Activation(k), [x], Shape.of(shape), name=k.value) for k in kinds])
    return g


# ------------------------------------------------------------------------------ Activation

# Inputs inside each function's domain (log/sqrt/rsqrt need x > 0, tan stays off pi/2) and with
# exact halves, so Round's tie rule is exercised.
_GENERAL = np.array([-3.5, -2.5, -1.25, -0.5, 0.0, 0.5, 0.75, 1.5, 2.5, 3.0, -0.3, 1.1], dtype=np.float32)
_POSITIVE = np.array([0.01, 0.1, 0.5, 1.0, 1.5, 2.0, 3.0, 7.5, 20.0, 100.0, 0.25, 4.0], dtype=np.float32)
_POSITIVE_KINDS = {ActivationKind.LOG, ActivationKind.SQRT, ActivationKind.RSQRT}
_TAN_SAFE = np.clip(_GENERAL, -1.2, 1.2)


@pytest.mark.parametrize(("target", "precision"), TARGET_PRECISION)
def test_every_activation_matches_reference(target: str, precision: str) -> None:
    g = Graph("activations")
    x = g.add_node(ops.Input("x"), [], Shape.of([12]))
    xp = g.add_node(ops.Input("xp"), [], Shape.of([12]))
    xt = g.add_node(ops.Input("xt"), [], Shape.of([12]))
    outs = []
    for kind in ActivationKind:
        src = xp if kind in _POSITIVE_KINDS else xt if kind is ActivationKind.TAN else x
        outs.append(g.add_node(ops.Activation(kind), [src], Shape.of([12]), name=kind.value))
    g.set_outputs(outs)
    model = check_against_reference(
        g, {"x": _GENERAL, "xp": _POSITIVE, "xt": _TAN_SAFE}, target=target, precision=precision
    )
    assert ops_outside_opset(model, target) == []
    emitted = set(emitted_ops(model))
    for mil_op in ("gelu", "silu", "sigmoid", "tanh", "exp", "log", "sqrt", "real_div", "abs",
                   "sin", "cos", "tan", "atan", "round", "floor", "select", "greater"):
        assert mil_op in emitted, mil_op


@pytest.mark.parametrize("precision", PRECISIONS)
def test_gelu_modes_map_to_mil_gelu_modes(precision: str) -> None:
    model = convert_and_cleanup(
        unary_graph([ActivationKind.GELU, ActivationKind.GELU_APPROX], (2, 3)), target="iOS15", precision=precision
    )
    modes = sorted(op.mode.val for op in mil_ops_of_type(model, "gelu"))
    assert modes == ["EXACT", "TANH_APPROXIMATION"]


def test_log_and_rsqrt_are_exact_at_zero() -> None:
    g = unary_graph([ActivationKind.LOG, ActivationKind.RSQRT, ActivationKind.SQRT], (5,))
    model = convert_and_cleanup(g, target="iOS17", precision="fp32")
    (log,) = mil_ops_of_type(model, "log")
    assert float(log.epsilon.val) == 0.0
    assert mil_ops_of_type(model, "rsqrt") == []  # rsqrt(x + eps) cannot give rsqrt(-0) = -inf
    out = run_model(model, {"x": np.float32([0.0, 4.0, 1e-30, -1.0, -0.0])})
    np.testing.assert_array_equal(out["Log"][:2], np.float32([-np.inf, np.log(4.0)]))
    assert out["Log"][2] == pytest.approx(np.log(1e-30), rel=1e-6)
    assert np.isnan(out["Log"][3])
    np.testing.assert_array_equal(out["Rsqrt"][:2], np.float32([np.inf, 0.5]))
    assert np.isnan(out["Rsqrt"][3])
    assert out["Rsqrt"][4] == -np.inf


def test_relu_maps_nan_to_zero_whatever_mil_does() -> None:
    model = convert_and_cleanup(unary_graph([ActivationKind.RELU], (4,)), target="iOS15", precision="fp32")
    got = run_model(model, {"x": np.float32([np.nan, -1.0, 0.0, 2.5])})["Relu"]
    np.testing.assert_array_equal(got, np.float32([0.0, 0.0, 0.0, 2.5]))


def _round_half_away(op: Any) -> np.ndarray:
    x = op.x.val
    return (np.sign(x) * np.floor(np.abs(x) + x.dtype.type(0.5))).astype(x.dtype)


@pytest.mark.parametrize(("target", "precision"), [("iOS15", "fp32"), ("iOS18", "fp16")])
def test_round_is_ties_to_even_whatever_mil_round_does(target: str, precision: str) -> None:
    model = convert_and_cleanup(unary_graph([ActivationKind.ROUND], (10,)), target=target, precision=precision)
    x = np.float32([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 2.4999, -3.6, 1024.5])
    want = np.rint(x.astype(np.float16) if precision == "fp16" else x).astype(np.float32)
    for kernels in (None, {"round": _round_half_away}):
        got = run_model(model, {"x": x}, engine="value_inference", kernels=kernels)["Round"]
        np.testing.assert_array_equal(got, want)


def test_neg_keeps_the_sign_of_zero() -> None:
    model = convert_and_cleanup(unary_graph([ActivationKind.NEG], (2,)), target="iOS15", precision="fp32")
    got = run_model(model, {"x": np.float32([0.0, -0.0])})["Neg"]
    assert np.signbit(got[0]) and not np.signbit(got[1])


def test_integer_activations_stay_exact() -> None:
    g = Graph("int_act")
    x = g.add_node(ops.Input("x"), [], Shape.of([5], DType.I32))
    kinds = [ActivationKind.NEG, ActivationKind.ABS, ActivationKind.RELU, ActivationKind.ROUND, ActivationKind.SQRT]
    g.set_outputs([g.add_node(ops.Activation(k), [x], Shape.of([5], DType.I32), name=k.value) for k in kinds])
    values = np.int32([-16777217, -3, 0, 9, 16777217])  # beyond 2^24: not exact in fp32
    for precision in PRECISIONS:
        model = convert_and_cleanup(g, target="iOS16", precision=precision)
        out = run_model(model, {"x": values})
        np.testing.assert_array_equal(out["Neg"], -values)
        np.testing.assert_array_equal(out["Abs"], np.abs(values))
        np.testing.assert_array_equal(out["Relu"], np.maximum(values, 0))
        np.testing.assert_array_equal(out["Round"], values)
    assert "sqrt" in emitted_ops(model)


# ------------------------------------------------------------------------------ Cast

_CAST_SOURCE = np.float32([-300.7, -128.5, -1.5, -0.5, -0.0, 0.3, 0.999, 2.9, 127.9, 255.5, 1000.25, 3e9, -3e9,
                           np.inf, -np.inf, np.nan])
_CAST_TARGETS = [DType.I8, DType.U8, DType.I16, DType.I32, DType.I64, DType.U32, DType.BOOL,
                 DType.F16, DType.BF16, DType.F32]


def cast_graph(src: DType, dsts: list[DType], n: int) -> Graph:
    g = Graph("casts")
    x = g.add_node(ops.Input("x"), [], Shape.of([n], src))
    g.set_outputs([g.add_node(ops.Cast(d), [x], Shape.of([n], d), name=f"to_{d.value}") for d in dsts])
    return g


@pytest.mark.parametrize(("target", "precision"), TARGET_PRECISION)
def test_float_casts_truncate_saturate_and_round(target: str, precision: str) -> None:
    g = cast_graph(DType.F32, _CAST_TARGETS, len(_CAST_SOURCE))
    model = convert_and_cleanup(g, target=target, precision=precision)
    assert ops_outside_opset(model, target) == []
    out = run_model(model, {"x": _CAST_SOURCE})
    with np.errstate(over="ignore"):
        held = _CAST_SOURCE.astype(np.float16).astype(np.float32) if precision == "fp16" else _CAST_SOURCE
    for dst in _CAST_TARGETS:
        got = out[f"to_{dst.value}"]
        if dst.is_int:
            want = to_dtype(held, dst).astype(np.int64)
            if precision == "fp16" or dst in (DType.I64, DType.U32):
                # int dtypes are held as int32: I64/U32 saturate at the int32 range.
                want = np.clip(want, -(2**31), 2**31 - 1)
            np.testing.assert_array_equal(got.astype(np.int64), want, err_msg=dst.value)
        elif dst is DType.BOOL:
            np.testing.assert_array_equal(got.astype(bool), held != 0)
        elif dst is DType.BF16:
            np.testing.assert_array_equal(got, round_to_bf16(held))
        elif dst is DType.F16 or precision == "fp16":
            with np.errstate(over="ignore"):
                np.testing.assert_array_equal(got, held.astype(np.float16).astype(np.float32))
        else:
            np.testing.assert_array_equal(got, held)


def test_f16_cast_in_fp32_program_really_rounds() -> None:
    model = convert_and_cleanup(cast_graph(DType.F32, [DType.F16], 4), target="iOS15", precision="fp32")
    casts = [op.dtype.val for op in mil_ops_of_type(model, "cast")]
    assert casts == ["fp16", "fp32"]
    x = np.float32([1 + 2.0**-12, 1 + 3 * 2.0**-12, 70000.0, 1e-8])
    got = run_model(model, {"x": x})["to_F16"]
    np.testing.assert_array_equal(got, x.astype(np.float16).astype(np.float32))


def test_bf16_rounding_matches_bit_rounding_on_random_values() -> None:
    model = convert_and_cleanup(cast_graph(DType.F32, [DType.BF16], 4096), target="iOS18", precision="fp32")
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(4096) * np.exp(rng.uniform(-60, 60, 4096))).astype(np.float32)
    # Exact halfway cases between neighbouring bfloat16 values.
    x[:512] = (round_to_bf16(x[:512]).view(np.uint32) | np.uint32(0x8000)).view(np.float32)
    x[512:520] = np.float32([3.3e38, -3.3e38, 1e35, np.inf, -np.inf, np.nan, 0.0, -0.0])
    got = run_model(model, {"x": x})["to_BF16"]
    np.testing.assert_array_equal(got, round_to_bf16(x))


def _cast_rounding_to_nearest(op: Any) -> Any:
    """A cast that rounds fractions to nearest instead of truncating (another compute unit)."""
    value = op.x.val
    if op.dtype.val == "int32" and np.asarray(value).dtype.kind == "f":
        return np.rint(value).astype(np.int32)
    return op.value_inference()


def test_float_to_int_truncation_does_not_rely_on_mil_cast() -> None:
    model = convert_and_cleanup(cast_graph(DType.F32, [DType.I32], 6), target="iOS15", precision="fp32")
    x = np.float32([2.9, -2.9, 0.5, -0.5, 7.5, -7.5])
    got = run_model(model, {"x": x}, engine="value_inference", kernels={"cast": _cast_rounding_to_nearest})
    np.testing.assert_array_equal(got["to_I32"], np.int32([2, -2, 0, 0, 7, -7]))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_int_and_bool_casts(precision: str) -> None:
    g = Graph("int_casts")
    x = g.add_node(ops.Input("x"), [], Shape.of([6], DType.I32))
    b = g.add_node(ops.Compare(CmpOp.GT), [x, g.add_node(ops.Constant(np.int32(0).tobytes()), [], Shape.of([], DType.I32))],
                   Shape.of([6], DType.BOOL))
    outs = [g.add_node(ops.Cast(d), [x], Shape.of([6], d), name=f"to_{d.value}")
            for d in (DType.I8, DType.U8, DType.I16, DType.F32, DType.F16, DType.BOOL)]
    outs += [g.add_node(ops.Cast(d), [b], Shape.of([6], d), name=f"bool_to_{d.value}") for d in (DType.F32, DType.I32)]
    g.set_outputs(outs)
    model = convert_and_cleanup(g, target="iOS16", precision=precision)
    values = np.int32([-40000, -129, -1, 0, 200, 2049])
    out = run_model(model, {"x": values})
    # Narrowing wraps like NumPy's astype (spec 4.2).
    np.testing.assert_array_equal(out["to_I8"], values.astype(np.int8))
    np.testing.assert_array_equal(out["to_U8"], values.astype(np.uint8))
    np.testing.assert_array_equal(out["to_I16"], values.astype(np.int16))
    np.testing.assert_array_equal(out["to_F16"], values.astype(np.float16).astype(np.float32))
    if precision == "fp32":
        np.testing.assert_array_equal(out["to_F32"], values.astype(np.float32))
    np.testing.assert_array_equal(out["to_Bool"].astype(bool), values != 0)
    np.testing.assert_array_equal(out["bool_to_F32"], (values > 0).astype(np.float32))
    np.testing.assert_array_equal(out["bool_to_I32"], (values > 0).astype(np.int32))


# ------------------------------------------------------------------------------ Binary


def binary_graph(op: BinaryOp, a_shape: tuple[int, ...], b_shape: tuple[int, ...], dtype: DType = DType.F32) -> Graph:
    g = Graph("binary")
    a = g.add_node(ops.Input("a"), [], Shape.of(a_shape, dtype))
    b = g.add_node(ops.Input("b"), [], Shape.of(b_shape, dtype))
    out = tuple(int(d) for d in np.broadcast_shapes(a_shape, b_shape))
    g.set_outputs([g.add_node(ops.Binary(op), [a, b], Shape.of(out, dtype), name="y")])
    return g


#: Bitwise ops and shifts have no MIL form; conversion refuses them by name.
NO_CORE_ML_BINARY = (BinaryOp.BIT_AND, BinaryOp.BIT_OR, BinaryOp.BIT_XOR, BinaryOp.SHL, BinaryOp.SHR)


@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=3),
    op=st.sampled_from([op for op in BinaryOp if op not in NO_CORE_ML_BINARY]),
    target=st.sampled_from(TARGETS),
    precision=st.sampled_from(PRECISIONS),
    seed=st.integers(0, 2**16),
)
def test_binary_broadcasts_like_numpy(shapes: Any, op: BinaryOp, target: str, precision: str, seed: int) -> None:
    a_shape, b_shape = shapes.input_shapes
    rng = np.random.default_rng(seed)
    # Positive operands away from 0 keep Div and Pow well conditioned in fp16.
    a = rng.uniform(0.5, 2.0, a_shape).astype(np.float32)
    b = rng.uniform(0.5, 2.0, b_shape).astype(np.float32)
    model = check_against_reference(binary_graph(op, a_shape, b_shape), {"a": a, "b": b}, target=target, precision=precision)
    assert ops_outside_opset(model, target) == []


def _maximum_picking_second_on_nan(op: Any) -> np.ndarray:
    """`x > y ? x : y`, a common hardware max: returns y when x is NaN, and NaN when y is."""
    x, y = op.x.val, op.y.val
    return np.where(x > y, x, y)


@pytest.mark.parametrize(("op", "fn"), [(BinaryOp.MAX, np.fmax), (BinaryOp.MIN, np.fmin)])
def test_max_min_ignore_nan(op: BinaryOp, fn: Any) -> None:
    model = convert_and_cleanup(binary_graph(op, (5,), (5,)), target="iOS17", precision="fp32")
    assert {"maximum", "minimum"} & set(emitted_ops(model))
    a = np.float32([np.nan, 1.0, np.nan, -2.0, 3.0])
    b = np.float32([2.0, np.nan, np.nan, -1.0, 3.0])
    want = fn(a, b)
    np.testing.assert_array_equal(run_model(model, {"a": a, "b": b})["y"], want)
    other = {"maximum": _maximum_picking_second_on_nan, "minimum": lambda o: np.where(o.x.val < o.y.val, o.x.val, o.y.val)}
    got = run_model(model, {"a": a, "b": b}, engine="value_inference", kernels=other)["y"]
    np.testing.assert_array_equal(got, want)


def test_max_with_nan_free_constant_checks_only_the_other_side() -> None:
    g = Graph("clamp")
    x = g.add_node(ops.Input("x"), [], Shape.of([3]))
    zero = g.add_node(ops.Constant(np.float32(0).tobytes()), [], Shape.of([]))
    g.set_outputs([g.add_node(ops.Binary(BinaryOp.MAX), [x, zero], Shape.of([3]), name="y")])
    model = convert_and_cleanup(g, target="iOS15", precision="fp32")
    assert emitted_ops(model).count("not_equal") == 1
    np.testing.assert_array_equal(run_model(model, {"x": np.float32([np.nan, -1, 2])})["y"], np.float32([0, 0, 2]))


def _pow_through_log(op: Any) -> np.ndarray:
    """pow as exp(y*log(x)): NaN for every negative base, as some units compute it."""
    x, y = op.x.val, op.y.val
    with np.errstate(all="ignore"):
        return np.exp(y * np.log(x)).astype(x.dtype)


@pytest.mark.parametrize("exponent", [2.0, 3.0, -1.0, 4.0, 0.5])
def test_pow_with_constant_exponent(exponent: float) -> None:
    g = Graph("pow")
    x = g.add_node(ops.Input("x"), [], Shape.of([4]))
    e = g.add_node(ops.Constant(np.float32(exponent).tobytes()), [], Shape.of([1]))
    g.set_outputs([g.add_node(ops.Binary(BinaryOp.POW), [x, e], Shape.of([4]), name="y")])
    model = convert_and_cleanup(g, target="iOS15", precision="fp32")
    x_val = np.float32([-2.0, -0.5, 1.5, 3.0])
    with np.errstate(invalid="ignore"):
        want = np.power(x_val, np.float32(exponent))
    got = run_model(model, {"x": x_val}, engine="value_inference", kernels={"pow": _pow_through_log})["y"]
    if exponent.is_integer():
        # Integer exponents of negative bases are exact whatever pow does with them.
        np.testing.assert_allclose(got, want, rtol=1e-6)
    else:
        np.testing.assert_allclose(got[2:], want[2:], rtol=1e-6)
        assert np.isnan(got[:2]).all()
    if exponent == 2.0:
        assert "pow" not in emitted_ops(model)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_integer_binary_ops_are_exact_and_divide_toward_zero(precision: str) -> None:
    a = np.int32([7, -7, 7, -7, 2**24 + 1, -9, 0, 100])
    b = np.int32([2, 2, -2, -2, 1, 3, 5, -7])
    g = Graph("int_binary")
    an = g.add_node(ops.Input("a"), [], Shape.of([8], DType.I32))
    bn = g.add_node(ops.Input("b"), [], Shape.of([8], DType.I32))
    g.set_outputs([g.add_node(ops.Binary(o), [an, bn], Shape.of([8], DType.I32), name=o.value)
                   for o in (BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL, BinaryOp.DIV, BinaryOp.MAX, BinaryOp.MIN)])
    model = convert_and_cleanup(g, target="iOS18", precision=precision)
    out = run_model(model, {"a": a, "b": b})
    np.testing.assert_array_equal(out["Add"], a + b)
    np.testing.assert_array_equal(out["Sub"], a - b)
    np.testing.assert_array_equal(out["Mul"], a * b)
    np.testing.assert_array_equal(out["Div"], np.trunc(a / b).astype(np.int32))
    np.testing.assert_array_equal(out["Max"], np.maximum(a, b))
    np.testing.assert_array_equal(out["Min"], np.minimum(a, b))
    assert "floor_div" in emitted_ops(model)


def test_mixed_int_float_binary_computes_in_float() -> None:
    g = Graph("mixed")
    a = g.add_node(ops.Input("a"), [], Shape.of([3]))
    b = g.add_node(ops.Input("b"), [], Shape.of([3], DType.I32))
    g.set_outputs([g.add_node(ops.Binary(BinaryOp.MUL), [a, b], Shape.of([3]), name="y")])
    for target in TARGETS:
        check_against_reference(g, {"a": np.float32([0.5, -1.25, 3]), "b": np.int32([3, 4, -5])}, target=target, precision="fp32")


# ------------------------------------------------------------------------------ Compare / Where


@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3),
    target=st.sampled_from(TARGETS),
    precision=st.sampled_from(PRECISIONS),
    seed=st.integers(0, 2**16),
)
def test_every_compare_broadcasts_and_returns_bool(shapes: Any, target: str, precision: str, seed: int) -> None:
    a_shape, b_shape = shapes.input_shapes
    out = tuple(int(d) for d in np.broadcast_shapes(a_shape, b_shape))
    g = Graph("compare")
    a = g.add_node(ops.Input("a"), [], Shape.of(a_shape))
    b = g.add_node(ops.Input("b"), [], Shape.of(b_shape))
    g.set_outputs([g.add_node(ops.Compare(c), [a, b], Shape.of(out, DType.BOOL), name=c.value) for c in CmpOp])
    rng = np.random.default_rng(seed)
    # Small integers (exact in fp16) make equality common; a NaN checks IEEE semantics.
    a_val = rng.integers(-2, 3, a_shape).astype(np.float32)
    b_val = rng.integers(-2, 3, b_shape).astype(np.float32)
    if a_val.size:
        a_val.flat[0] = np.nan
    model = check_against_reference(g, {"a": a_val, "b": b_val}, target=target, precision=precision, rtol=0, atol=0)
    assert {"equal", "not_equal", "less", "less_equal", "greater", "greater_equal"} <= set(emitted_ops(model))


def test_compare_of_int_and_float_does_not_truncate() -> None:
    g = Graph("compare_mixed")
    a = g.add_node(ops.Input("a"), [], Shape.of([3], DType.I32))
    b = g.add_node(ops.Input("b"), [], Shape.of([3]))
    g.set_outputs([g.add_node(ops.Compare(CmpOp.LT), [a, b], Shape.of([3], DType.BOOL), name="lt")])
    model = convert_and_cleanup(g, target="iOS15", precision="fp32")
    out = run_model(model, {"a": np.int32([2, 2, 3]), "b": np.float32([2.5, 1.5, 3.0])})
    np.testing.assert_array_equal(out["lt"].astype(bool), [True, False, False])


@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=3),
    target=st.sampled_from(TARGETS),
    precision=st.sampled_from(PRECISIONS),
    cond_dtype=st.sampled_from([DType.F32, DType.BOOL, DType.I32]),
    seed=st.integers(0, 2**16),
)
def test_where_broadcasts_three_ways(shapes: Any, target: str, precision: str, cond_dtype: DType, seed: int) -> None:
    c_shape, t_shape, f_shape = shapes.input_shapes
    out = tuple(int(d) for d in np.broadcast_shapes(c_shape, t_shape, f_shape))
    g = Graph("where")
    c = g.add_node(ops.Input("c"), [], Shape.of(c_shape, cond_dtype))
    t = g.add_node(ops.Input("t"), [], Shape.of(t_shape))
    f = g.add_node(ops.Input("f"), [], Shape.of(f_shape))
    g.set_outputs([g.add_node(ops.Where(), [c, t, f], Shape.of(out), name="y")])
    rng = np.random.default_rng(seed)
    choices = {DType.F32: np.float32([0.0, 0.25, -3.0, np.nan]), DType.BOOL: np.array([False, True]),
               DType.I32: np.int32([0, 1, -2])}[cond_dtype]
    cond = rng.choice(choices, c_shape)
    inputs = {"c": cond, "t": rng.standard_normal(t_shape).astype(np.float32),
              "f": rng.standard_normal(f_shape).astype(np.float32)}
    model = check_against_reference(g, inputs, target=target, precision=precision, rtol=0, atol=0)
    assert "select" in emitted_ops(model)


def test_bool_operands_and_results() -> None:
    g = Graph("bools")
    x = g.add_node(ops.Input("x"), [], Shape.of([4]))
    y = g.add_node(ops.Input("y"), [], Shape.of([4]))
    zero = g.add_node(ops.Constant(np.float32(0).tobytes()), [], Shape.of([]))
    a = g.add_node(ops.Compare(CmpOp.GT), [x, zero], Shape.of([4], DType.BOOL))
    b = g.add_node(ops.Compare(CmpOp.GT), [y, zero], Shape.of([4], DType.BOOL))
    outs = [g.add_node(ops.Binary(o), [a, b], Shape.of([4], DType.BOOL), name=f"bool_{o.value}") for o in BinaryOp if o not in NO_CORE_ML_BINARY]
    outs.append(g.add_node(ops.Compare(CmpOp.EQ), [a, b], Shape.of([4], DType.BOOL), name="bool_eq"))
    outs.append(g.add_node(ops.Where(), [a, x, b], Shape.of([4]), name="where_mixed"))
    outs.append(g.add_node(ops.Where(), [x, a, b], Shape.of([4], DType.BOOL), name="where_bool"))
    g.set_outputs(outs)
    inputs = {"x": np.float32([1, 1, -1, -1]), "y": np.float32([1, -1, 1, -1])}
    for precision in PRECISIONS:
        check_against_reference(g, inputs, target="iOS15", precision=precision, rtol=0, atol=0)


def test_integer_where_and_compare() -> None:
    g = Graph("int_where")
    a = g.add_node(ops.Input("a"), [], Shape.of([2, 3], DType.I32))
    b = g.add_node(ops.Input("b"), [], Shape.of([3], DType.I32))
    c = g.add_node(ops.Compare(CmpOp.LE), [a, b], Shape.of([2, 3], DType.BOOL), name="le")
    g.set_outputs([c, g.add_node(ops.Where(), [c, a, b], Shape.of([2, 3], DType.I32), name="y")])
    inputs = {"a": np.int32([[2**24 + 1, -5, 3], [0, 7, 7]]), "b": np.int32([2**24, -5, 9])}
    for precision in PRECISIONS:
        check_against_reference(g, inputs, target="iOS18", precision=precision, rtol=0, atol=0)


@pytest.mark.parametrize(("target", "precision"), [("iOS15", "fp32"), ("iOS16", "fp16"), ("iOS17", "fp32"), ("iOS18", "fp16")])
def test_upstream_elementwise_zoo(upstream_json_dir: Any, target: str, precision: str) -> None:
    """Every element-wise, reduction and shape op as upstream RLX serialises them."""
    g = Graph.from_json_file(upstream_json_dir / "elementwise_zoo.json")
    rng = np.random.default_rng(11)
    # Positive inputs keep log/sqrt/rsqrt/pow defined; below 1.4 keeps tan off its pole.
    inputs = {"x": rng.uniform(0.1, 1.4, (2, 3, 4)).astype(np.float32),
              "y": rng.uniform(0.1, 1.4, (2, 3, 4)).astype(np.float32),
              "row_bias": rng.standard_normal(4).astype(np.float32),
              "ids": rng.integers(0, 10, (2, 3)).astype(np.int64)}
    params = {"embed_table": rng.standard_normal((10, 4)).astype(np.float32),
              "col_scale": rng.standard_normal((1, 3, 1)).astype(np.float32)}
    model = check_against_reference(g, inputs, params, target=target, precision=precision)
    assert ops_outside_opset(model, target) == []


@pytest.mark.parametrize("op", NO_CORE_ML_BINARY)
def test_bitwise_and_shift_ops_are_refused_by_name(op: BinaryOp) -> None:
    g = Graph("bitwise")
    a, b = g.input("a", [4]), g.input("b", [4])
    g.set_outputs([g.binary(op, a, b, name="y")])
    with pytest.raises(UnsupportedOpError, match=f"Binary {op.value}.*no Core ML form"):
        rlx_mil.convert(g, {}, target="iOS18")
