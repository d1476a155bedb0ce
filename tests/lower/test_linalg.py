"""Lowering of MatMul, LoraMatMul and FusedMatMulBiasAct (spec sections 5.1-5.3).

Known weights must become MIL `linear` (Core ML's fast path); everything else `matmul` with
NumPy batch broadcasting. Every case is run and compared with `rlx_mil.reference.evaluate`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import ActivationKind
from rlx_mil.ir.shape import Shape

from .conftest import PRECISIONS, TARGETS, check_against_reference, emitted_ops, ops_outside_opset

TARGET_PRECISION = [(t, p) for t in TARGETS for p in PRECISIONS]
#: Products of K terms: fp16 programs accumulate rounding over the contraction.
TOL = {"fp32": {"rtol": 1e-4, "atol": 1e-4}, "fp16": {"rtol": 2e-2, "atol": 3e-2}}


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def matmul_graph(a_shape: tuple[int, ...], b_shape: tuple[int, ...], b_is_param: bool) -> Graph:
    g = Graph("matmul")
    a = g.add_node(ops.Input("a"), [], Shape.of(a_shape))
    b = g.add_node(ops.Param("b") if b_is_param else ops.Input("b"), [], Shape.of(b_shape))
    out = (*np.broadcast_shapes(a_shape[:-2], b_shape[:-2]), a_shape[-2], b_shape[-1])
    g.set_outputs([g.add_node(ops.MatMul(), [a, b], Shape.of(out), name="y")])
    return g


def run_matmul(a_shape: tuple[int, ...], b_shape: tuple[int, ...], b_is_param: bool, target: str, precision: str) -> Any:
    rng = np.random.default_rng(0)
    a, b = rand(rng, *a_shape), rand(rng, *b_shape)
    g = matmul_graph(a_shape, b_shape, b_is_param)
    inputs = {"a": a} if b_is_param else {"a": a, "b": b}
    params = {"b": b} if b_is_param else None
    model = check_against_reference(g, inputs, params, target=target, precision=precision, **TOL[precision])
    assert ops_outside_opset(model, target) == []
    return model


@pytest.mark.parametrize(("target", "precision"), TARGET_PRECISION)
@pytest.mark.parametrize("a_shape", [(3, 8), (2, 3, 8), (2, 2, 3, 8), (2, 1, 2, 3, 8)])
def test_weight_matmul_becomes_linear(a_shape: tuple[int, ...], target: str, precision: str) -> None:
    model = run_matmul(a_shape, (8, 5), True, target, precision)
    emitted = emitted_ops(model)
    assert emitted.count("linear") == 1
    assert "matmul" not in emitted


@pytest.mark.parametrize("b_shape", [(1, 8, 5), (1, 1, 8, 5)])
def test_weight_with_unit_batch_dims_becomes_linear(b_shape: tuple[int, ...]) -> None:
    model = run_matmul((2, 3, 8), b_shape, True, "iOS15", "fp32")
    assert "linear" in emitted_ops(model)
    assert "matmul" not in emitted_ops(model)


def test_weight_with_real_batch_dims_stays_matmul() -> None:
    model = run_matmul((2, 3, 8), (2, 8, 5), True, "iOS16", "fp32")
    assert "matmul" in emitted_ops(model)
    assert "linear" not in emitted_ops(model)


@st.composite
def batched_pairs(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two matmul operand shapes whose batch dims broadcast (ranks 2..4, either side longer)."""
    m, k, n = draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 4))
    batch_rank = draw(st.integers(0, 2))
    full = draw(st.lists(st.integers(1, 3), min_size=batch_rank, max_size=batch_rank))
    a_batch = [d if draw(st.booleans()) else 1 for d in full][draw(st.integers(0, batch_rank)):]
    b_batch = [d if draw(st.booleans()) else 1 for d in full][draw(st.integers(0, batch_rank)):]
    return (*a_batch, m, k), (*b_batch, k, n)


@given(pair=batched_pairs(), target=st.sampled_from(TARGETS), precision=st.sampled_from(PRECISIONS))
def test_activation_matmul_broadcasts_batch_dims(pair: Any, target: str, precision: str) -> None:
    a_shape, b_shape = pair
    model = run_matmul(a_shape, b_shape, False, target, precision)
    assert "matmul" in emitted_ops(model)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_rank2_times_rank3(precision: str) -> None:
    model = run_matmul((3, 4), (2, 4, 5), False, "iOS17", precision)
    assert "matmul" in emitted_ops(model)


def test_integer_matmul_is_exact() -> None:
    g = Graph("int_matmul")
    a = g.add_node(ops.Input("a"), [], Shape.of([2, 3], DType.I32))
    b = g.add_node(ops.Input("b"), [], Shape.of([3, 2], DType.I32))
    g.set_outputs([g.add_node(ops.MatMul(), [a, b], Shape.of([2, 2], DType.I32), name="y")])
    inputs = {"a": np.int32([[4096, 1, 0], [-3, 2, 5]]), "b": np.int32([[4097, 1], [1, 1], [2, -7]])}
    check_against_reference(g, inputs, target="iOS15", precision="fp16", rtol=0, atol=0)


# ------------------------------------------------------------------------------ LoraMatMul


def lora_graph(x_shape: tuple[int, ...], k: int, n: int, r: int, known: tuple[bool, bool, bool], scale: float) -> Graph:
    g = Graph("lora")
    x = g.add_node(ops.Input("x"), [], Shape.of(x_shape))
    nodes = []
    for name, shape, is_param in zip(("w", "a", "b"), ((k, n), (k, r), (r, n)), known, strict=True):
        nodes.append(g.add_node(ops.Param(name) if is_param else ops.Input(name), [], Shape.of(shape)))
    g.set_outputs([g.add_node(ops.LoraMatMul(scale), [x, *nodes], Shape.of((*x_shape[:-1], n)), name="y")])
    return g


@pytest.mark.parametrize(("target", "precision"), TARGET_PRECISION)
def test_lora_with_known_weights_is_one_linear(target: str, precision: str) -> None:
    rng = np.random.default_rng(1)
    g = lora_graph((2, 3, 8), 8, 6, 2, (True, True, True), 0.5)
    params = {"w": rand(rng, 8, 6), "a": rand(rng, 8, 2), "b": rand(rng, 2, 6)}
    model = check_against_reference(g, {"x": rand(rng, 2, 3, 8)}, params, target=target, precision=precision, **TOL[precision])
    emitted = emitted_ops(model)
    assert emitted.count("linear") == 1
    assert "matmul" not in emitted


@pytest.mark.parametrize("known", [(False, True, True), (True, False, False), (False, False, False), (True, True, False)])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_lora_with_runtime_operands(known: tuple[bool, bool, bool], precision: str) -> None:
    rng = np.random.default_rng(2)
    g = lora_graph((4, 8), 8, 6, 3, known, 0.25)
    values = {"w": rand(rng, 8, 6), "a": rand(rng, 8, 3), "b": rand(rng, 3, 6)}
    params = {k: v for (k, v), is_param in zip(values.items(), known, strict=True) if is_param}
    inputs = {"x": rand(rng, 4, 8), **{k: v for k, v in values.items() if k not in params}}
    model = check_against_reference(g, inputs, params, target="iOS16", precision=precision, **TOL[precision])
    emitted = emitted_ops(model)
    assert emitted.count("linear") == sum(known)
    assert emitted.count("matmul") == 3 - sum(known)


# ------------------------------------------------------------------------------ FusedMatMulBiasAct


def fused_graph(x_shape: tuple[int, ...], k: int, n: int, act: ActivationKind | None, known: bool) -> Graph:
    g = Graph("fused")
    x = g.add_node(ops.Input("x"), [], Shape.of(x_shape))
    leaf = ops.Param if known else ops.Input
    w = g.add_node(leaf("w"), [], Shape.of([k, n]))
    bias = g.add_node(leaf("bias"), [], Shape.of([n]))
    g.set_outputs([g.add_node(ops.FusedMatMulBiasAct(act), [x, w, bias], Shape.of((*x_shape[:-1], n)), name="y")])
    return g


_FUSED_ACTS = [None, ActivationKind.GELU, ActivationKind.GELU_APPROX, ActivationKind.SILU, ActivationKind.RELU,
               ActivationKind.TANH]


@pytest.mark.parametrize("act", _FUSED_ACTS, ids=lambda a: "none" if a is None else a.value)
@pytest.mark.parametrize(("target", "precision"), [("iOS15", "fp32"), ("iOS16", "fp16"), ("iOS17", "fp32"), ("iOS18", "fp16")])
def test_fused_matmul_bias_act_is_linear_with_bias(act: ActivationKind | None, target: str, precision: str) -> None:
    rng = np.random.default_rng(3)
    g = fused_graph((2, 3, 8), 8, 5, act, True)
    params = {"w": rand(rng, 8, 5), "bias": rand(rng, 5)}
    model = check_against_reference(g, {"x": rand(rng, 2, 3, 8)}, params, target=target, precision=precision, **TOL[precision])
    emitted = emitted_ops(model)
    assert emitted.count("linear") == 1
    assert "matmul" not in emitted and "add" not in emitted
    (linear,) = [op for op in model._mil_program.functions["main"].operations if op.op_type == "linear"]
    np.testing.assert_allclose(linear.bias.val.astype(np.float32), params["bias"], rtol=1e-3, atol=1e-3)
    if act in (ActivationKind.GELU, ActivationKind.GELU_APPROX):
        (gelu,) = [op for op in model._mil_program.functions["main"].operations if op.op_type == "gelu"]
        assert gelu.mode.val == ("EXACT" if act is ActivationKind.GELU else "TANH_APPROXIMATION")


@pytest.mark.parametrize("precision", PRECISIONS)
def test_fused_matmul_with_runtime_weight(precision: str) -> None:
    rng = np.random.default_rng(4)
    g = fused_graph((3, 8), 8, 5, ActivationKind.SILU, False)
    inputs = {"x": rand(rng, 3, 8), "w": rand(rng, 8, 5), "bias": rand(rng, 5)}
    model = check_against_reference(g, inputs, target="iOS18", precision=precision, **TOL[precision])
    emitted = emitted_ops(model)
    assert {"matmul", "add", "silu"} <= set(emitted)


def test_known_left_operand_multiplies_a_runtime_right_operand() -> None:
    rng = np.random.default_rng(5)
    g = Graph("left_param")
    a = g.add_node(ops.Param("a"), [], Shape.of([3, 4]))
    b = g.add_node(ops.Input("b"), [], Shape.of([2, 4, 5]))
    g.set_outputs([g.add_node(ops.MatMul(), [a, b], Shape.of([2, 3, 5]), name="y")])
    for precision in PRECISIONS:
        model = check_against_reference(g, {"b": rand(rng, 2, 4, 5)}, {"a": rand(rng, 3, 4)}, target="iOS15",
                                        precision=precision, **TOL[precision])
        assert "matmul" in emitted_ops(model)
