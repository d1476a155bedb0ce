"""Lowering of LayerNorm, RmsNorm, GroupNorm, FusedResidualLN and FusedResidualRmsNorm.

Every case is converted with `rlx_mil.convert` and the converted program (after Core ML's
passes, so fp16 programs really hold fp16 values) is run on NumPy and compared with the spec's
formulas (section 6), computed in float64 on the values the program actually receives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx_mil.errors import AttributeValueError, DTypeError, GraphError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.shape import Shape

from .conftest import convert_and_cleanup, emitted_ops

TARGETS = ["iOS15", "iOS16", "iOS17", "iOS18"]
PRECISIONS = ["fp32", "fp16"]
TOL = {"fp32": {"rtol": 2e-5, "atol": 2e-5}, "fp16": {"rtol": 1e-2, "atol": 1.5e-2}}


# ---------------------------------------------------------------------------------- running


def _silu(x: np.ndarray) -> np.ndarray:
    v = x.astype(np.float32)
    return (v / (1.0 + np.exp(-v))).astype(x.dtype)


def _value_inference_run(model: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate the converted program with coremltools' own per-op value_inference (values are
    held in each var's declared dtype, so fp16 overflow shows)."""
    func = model._mil_program.functions["main"]
    saved: list[tuple[Any, Any]] = []

    def put(var: Any, val: Any) -> None:
        saved.append((var, var._sym_val))
        sym = var.sym_type()
        sym.val = val
        var._sym_val = sym

    try:
        for name, var in func.inputs.items():
            put(var, np.asarray(feeds[name], dtype=np.float32))
        for op in func.operations:
            if op.op_type == "const":
                continue
            out = _silu(op.x.val) if op.op_type == "silu" else op.value_inference()
            for var, val in zip(op.outputs, out if isinstance(out, (tuple, list)) else (out,), strict=True):
                put(var, val)
        return {v.name: np.asarray(v.val, dtype=np.float32) for v in func.outputs}
    finally:
        for var, old in reversed(saved):
            var._sym_val = old


def run_model(model: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    try:
        from rlx_mil.milexec import run
    except ImportError:
        return _value_inference_run(model, feeds)
    return {k: np.asarray(v, dtype=np.float32) for k, v in run(model, dict(feeds)).items()}


def as_program_input(a: np.ndarray, precision: str) -> np.ndarray:
    """The values the program computes on: fp16 programs round inputs and params at entry."""
    a = np.asarray(a, dtype=np.float32)
    return a.astype(np.float16).astype(np.float64) if precision == "fp16" else a.astype(np.float64)


# ---------------------------------------------------------------------------------- spec formulas


def ref_layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma.reshape(-1) + beta.reshape(-1)


def ref_rms_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * gamma.reshape(-1) + beta.reshape(-1)


def ref_group_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, groups: int, eps: float) -> np.ndarray:
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1)
    mean = g.mean(axis=-1, keepdims=True)
    var = ((g - mean) ** 2).mean(axis=-1, keepdims=True)
    normed = ((g - mean) / np.sqrt(var + eps)).reshape(x.shape)
    affine = (1, c) + (1,) * (x.ndim - 2)
    return normed * gamma.reshape(affine) + beta.reshape(affine)


# ---------------------------------------------------------------------------------- graphs


def _leaf(g: Graph, name: str, sizes: tuple[int, ...], as_param: bool, dtype: DType = DType.F32) -> int:
    op = ops.Param(name) if as_param else ops.Input(name)
    return g.add_node(op, [], Shape.of(sizes, dtype), name=name)


def build_norm(
    op: ops.Op,
    x_shape: tuple[int, ...],
    affine_len: int,
    *,
    affine_as_param: bool = True,
    residual_shape: tuple[int, ...] | None = None,
    bias_as_param: bool = True,
    out_shape: tuple[int, ...] | None = None,
) -> Graph:
    g = Graph("norm")
    inputs = [_leaf(g, "x", x_shape, False)]
    if residual_shape is not None:
        inputs.append(_leaf(g, "residual", residual_shape, False))
        if getattr(op, "has_bias", False):
            inputs.append(_leaf(g, "bias", (affine_len,), bias_as_param))
    inputs.append(_leaf(g, "gamma", (affine_len,), affine_as_param))
    inputs.append(_leaf(g, "beta", (affine_len,), affine_as_param))
    y = g.add_node(op, inputs, Shape.of(out_shape or x_shape), name="y")
    g.set_outputs([y])
    return g


def split_feeds(graph: Graph, values: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(params, inputs) for `graph` from one name -> value map."""
    params, feeds = {}, {}
    for node in graph:
        if isinstance(node.op, ops.Param):
            params[node.op.name] = values[node.op.name]
        elif isinstance(node.op, ops.Input):
            feeds[node.op.name] = values[node.op.name]
    return params, feeds


def convert_run(graph: Graph, values: Mapping[str, np.ndarray], target: str, precision: str) -> tuple[np.ndarray, list[str]]:
    params, feeds = split_feeds(graph, values)
    model = convert_and_cleanup(graph, params, target=target, precision=precision)
    return run_model(model, feeds)["y"], emitted_ops(model)


def affine_values(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.uniform(0.5, 1.5, n).astype(np.float32), rng.normal(0, 0.5, n).astype(np.float32)


def program_values(values: Mapping[str, np.ndarray], precision: str) -> dict[str, np.ndarray]:
    return {k: as_program_input(v, precision) for k, v in values.items()}


def overflows_naively(x: np.ndarray) -> bool:
    """True when squaring x in fp16 (what a direct lowering does) leaves the fp16 range."""
    with np.errstate(over="ignore"):
        return bool(np.isinf(np.square(x.astype(np.float16))).any())


# ---------------------------------------------------------------------------------- every target x precision


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_layer_norm_every_target(target: str, precision: str) -> None:
    rng = np.random.default_rng(1)
    h = 16
    gamma, beta = affine_values(rng, h)
    x = rng.normal(2.0, 3.0, (2, 3, h)).astype(np.float32)
    graph = build_norm(ops.LayerNorm(-1, 1e-5), x.shape, h)
    values = {"x": x, "gamma": gamma, "beta": beta}
    y, emitted = convert_run(graph, values, target, precision)
    v = program_values(values, precision)
    np.testing.assert_allclose(y, ref_layer_norm(v["x"], v["gamma"], v["beta"], 1e-5), **TOL[precision])
    if precision == "fp32":
        # constant gamma/beta fold into MIL's own layer_norm
        assert emitted.count("layer_norm") == 1 and "mul" not in emitted and "reduce_max" not in emitted
    else:
        assert "layer_norm" not in emitted and "reduce_max" in emitted


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_rms_norm_every_target(target: str, precision: str) -> None:
    rng = np.random.default_rng(2)
    h = 24
    gamma, beta = affine_values(rng, h)
    x = rng.normal(0.0, 2.0, (3, h)).astype(np.float32)
    graph = build_norm(ops.RmsNorm(-1, 1e-6), x.shape, h)
    values = {"x": x, "gamma": gamma, "beta": beta}
    y, emitted = convert_run(graph, values, target, precision)
    v = program_values(values, precision)
    np.testing.assert_allclose(y, ref_rms_norm(v["x"], v["gamma"], v["beta"], 1e-6), **TOL[precision])
    # beta is added; fp16 folds eps into the padded row's sum of squares (no add of its own)
    assert "rsqrt" in emitted and emitted.count("add") == 1
    assert ("reduce_max" in emitted) == (precision == "fp16")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_group_norm_every_target(target: str, precision: str) -> None:
    rng = np.random.default_rng(3)
    gamma, beta = affine_values(rng, 6)
    x = rng.normal(1.0, 2.0, (2, 6, 3, 4)).astype(np.float32)
    graph = build_norm(ops.GroupNorm(3, 1e-5), x.shape, 6)
    values = {"x": x, "gamma": gamma, "beta": beta}
    y, emitted = convert_run(graph, values, target, precision)
    v = program_values(values, precision)
    np.testing.assert_allclose(y, ref_group_norm(v["x"], v["gamma"], v["beta"], 3, 1e-5), **TOL[precision])
    assert "reshape" in emitted and "layer_norm" in emitted if precision == "fp32" else "reduce_max" in emitted


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_fused_residual_norms_every_target(target: str, precision: str, rms: bool) -> None:
    rng = np.random.default_rng(4)
    h = 8
    gamma, beta = affine_values(rng, h)
    x = rng.normal(size=(2, 5, h)).astype(np.float32)
    residual = rng.normal(size=(2, 5, h)).astype(np.float32)
    bias = rng.normal(size=h).astype(np.float32)
    op = ops.FusedResidualRmsNorm(True, 1e-5) if rms else ops.FusedResidualLN(True, 1e-5)
    graph = build_norm(op, x.shape, h, residual_shape=x.shape)
    values = {"x": x, "residual": residual, "bias": bias, "gamma": gamma, "beta": beta}
    y, emitted = convert_run(graph, values, target, precision)
    v = program_values(values, precision)
    total = v["x"] + v["residual"] + v["bias"]
    ref = (ref_rms_norm if rms else ref_layer_norm)(total, v["gamma"], v["beta"], 1e-5)
    np.testing.assert_allclose(y, ref, **TOL[precision])
    assert emitted.count("add") >= 2


# ---------------------------------------------------------------------------------- fp16 overflow safety


@pytest.mark.parametrize("kind", ["layer", "rms", "group", "residual_ln", "residual_rms"])
@pytest.mark.parametrize("target", ["iOS15", "iOS18"])
def test_fp16_large_activations_stay_finite_and_accurate(kind: str, target: str) -> None:
    """Activations of magnitude 300-1000 over a hidden size of 1024 overflow a direct fp16
    lowering (x*x > 65504); the lowering must stay finite and accurate."""
    rng = np.random.default_rng(5)
    h = 1024
    gamma, beta = affine_values(rng, h)
    signs = rng.choice([-1.0, 1.0], size=(3, h))
    x = (signs * rng.uniform(300, 1000, (3, h))).astype(np.float32)
    x[1] += 700.0  # a large mean too (LayerNorm subtracts it)
    assert overflows_naively(x)
    values: dict[str, np.ndarray] = {"x": x, "gamma": gamma, "beta": beta}
    eps = 1e-5
    if kind == "layer":
        graph = build_norm(ops.LayerNorm(-1, eps), x.shape, h)
    elif kind == "rms":
        graph = build_norm(ops.RmsNorm(-1, eps), x.shape, h)
    elif kind == "group":
        x4 = x.reshape(3, 8, 8, 16)
        values["x"] = x4
        gamma, beta = affine_values(rng, 8)
        values.update(gamma=gamma, beta=beta)
        graph = build_norm(ops.GroupNorm(4, eps), x4.shape, 8)
    else:
        residual = (rng.uniform(-200, 200, (3, h))).astype(np.float32)
        values["residual"] = residual
        op = ops.FusedResidualLN(False, eps) if kind == "residual_ln" else ops.FusedResidualRmsNorm(False, eps)
        graph = build_norm(op, x.shape, h, residual_shape=x.shape)
    y, _ = convert_run(graph, values, target, "fp16")
    assert np.isfinite(y).all()
    v = program_values(values, "fp16")
    if kind == "layer":
        ref = ref_layer_norm(v["x"], v["gamma"], v["beta"], eps)
    elif kind == "rms":
        ref = ref_rms_norm(v["x"], v["gamma"], v["beta"], eps)
    elif kind == "group":
        ref = ref_group_norm(v["x"], v["gamma"], v["beta"], 4, eps)
    else:
        total = (v["x"] + v["residual"]).astype(np.float16).astype(np.float64)  # the fp16 sum
        ref = (ref_layer_norm if kind == "residual_ln" else ref_rms_norm)(total, v["gamma"], v["beta"], eps)
    np.testing.assert_allclose(y, ref, rtol=1e-2, atol=1.5e-2)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("kind", ["layer", "rms", "group"])
@pytest.mark.parametrize("eps", [1e-5, 1e-12])
def test_all_zero_rows_give_beta(precision: str, kind: str, eps: float) -> None:
    rng = np.random.default_rng(6)
    h = 32
    gamma, beta = affine_values(rng, h)
    if kind == "group":
        x = np.zeros((2, h, 2, 2), dtype=np.float32)
        x[1] = rng.normal(size=(h, 2, 2))
        graph = build_norm(ops.GroupNorm(4, eps), x.shape, h)
    else:
        x = rng.normal(size=(3, h)).astype(np.float32)
        x[1] = 0.0
        op = ops.LayerNorm(-1, eps) if kind == "layer" else ops.RmsNorm(-1, eps)
        graph = build_norm(op, x.shape, h)
    y, _ = convert_run(graph, {"x": x, "gamma": gamma, "beta": beta}, "iOS17", precision)
    assert np.isfinite(y).all()
    zero_part = y[0] if kind == "group" else y[1]
    want = np.broadcast_to(beta.reshape((h, 1, 1)) if kind == "group" else beta, zero_part.shape)
    np.testing.assert_allclose(zero_part, as_program_input(want, precision), **TOL[precision])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_tiny_rows_keep_eps_semantics(precision: str) -> None:
    """Rows far below sqrt(eps): the output is x/sqrt(eps) scaled, so eps must reach the
    rescaled program intact (eps / s^2), not be dropped or applied to the unscaled rows."""
    rng = np.random.default_rng(7)
    h = 64
    gamma, beta = np.ones(h, np.float32), np.zeros(h, np.float32)
    x = (rng.normal(size=(2, h)) * np.array([[1e-3], [5.0]])).astype(np.float32)
    for op, ref in ((ops.RmsNorm(-1, 1e-2), ref_rms_norm), (ops.LayerNorm(-1, 1e-2), ref_layer_norm)):
        graph = build_norm(op, x.shape, h)
        y, emitted = convert_run(graph, {"x": x, "gamma": gamma, "beta": beta}, "iOS16", precision)
        v = program_values({"x": x}, precision)
        np.testing.assert_allclose(y, ref(v["x"], gamma.astype(np.float64), beta.astype(np.float64), 1e-2), **TOL[precision])
        if op.type_name == "RmsNorm":
            # gamma of ones and a zero beta known at conversion cost no ops (fp16 keeps one
            # scalar multiply by sqrt(H), the scale of its sum-of-squares form)
            assert emitted.count("mul") == (1 if precision == "fp32" else 2) and "add" not in emitted


# ---------------------------------------------------------------------------------- hypothesis: shapes, eps, affine sources


_EPS = st.sampled_from([1e-5, 1e-6, 1e-12, 0.1])


@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    h=st.integers(1, 20),
    eps=_EPS,
    rms=st.booleans(),
    affine_as_param=st.booleans(),
    precision=st.sampled_from(PRECISIONS),
    target=st.sampled_from(TARGETS),
    scale=st.sampled_from([0.01, 1.0, 300.0]),
    seed=st.integers(0, 2**16),
)
def test_row_norms_match_spec(
    lead: list[int], h: int, eps: float, rms: bool, affine_as_param: bool, precision: str, target: str,
    scale: float, seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    shape = (*lead, h)
    x = (rng.normal(size=shape) * scale).astype(np.float32)
    gamma, beta = affine_values(rng, h)
    op = ops.RmsNorm(-1, eps) if rms else ops.LayerNorm(len(shape) - 1, eps)
    graph = build_norm(op, shape, h, affine_as_param=affine_as_param)
    y, emitted = convert_run(graph, {"x": x, "gamma": gamma, "beta": beta}, target, precision)
    v = program_values({"x": x, "gamma": gamma, "beta": beta}, precision)
    ref = (ref_rms_norm if rms else ref_layer_norm)(v["x"], v["gamma"], v["beta"], eps)
    np.testing.assert_allclose(y, ref, **TOL[precision])
    if not affine_as_param:
        assert "mul" in emitted and "add" in emitted  # runtime gamma/beta applied explicitly


@given(
    n=st.integers(1, 2),
    groups=st.integers(1, 4),
    per_group=st.integers(1, 3),
    spatial=st.lists(st.integers(1, 4), min_size=0, max_size=2),
    eps=_EPS,
    affine_as_param=st.booleans(),
    precision=st.sampled_from(PRECISIONS),
    target=st.sampled_from(TARGETS),
    seed=st.integers(0, 2**16),
)
def test_group_norm_matches_spec(
    n: int, groups: int, per_group: int, spatial: list[int], eps: float, affine_as_param: bool,
    precision: str, target: str, seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    c = groups * per_group
    shape = (n, c, *spatial)
    x = rng.normal(1.0, 3.0, shape).astype(np.float32)
    gamma, beta = affine_values(rng, c)
    graph = build_norm(ops.GroupNorm(groups, eps), shape, c, affine_as_param=affine_as_param)
    y, _ = convert_run(graph, {"x": x, "gamma": gamma, "beta": beta}, target, precision)
    v = program_values({"x": x, "gamma": gamma, "beta": beta}, precision)
    np.testing.assert_allclose(y, ref_group_norm(v["x"], v["gamma"], v["beta"], groups, eps), **TOL[precision])


@given(
    rows=st.integers(1, 3),
    seq=st.integers(1, 3),
    h=st.integers(1, 12),
    has_bias=st.booleans(),
    rms=st.booleans(),
    residual_form=st.sampled_from(["same", "row", "vector"]),
    params=st.booleans(),
    precision=st.sampled_from(PRECISIONS),
    target=st.sampled_from(TARGETS),
    seed=st.integers(0, 2**16),
)
def test_fused_residual_norms_match_spec(
    rows: int, seq: int, h: int, has_bias: bool, rms: bool, residual_form: str, params: bool,
    precision: str, target: str, seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    shape = (rows, seq, h)
    residual_shape = {"same": shape, "row": (1, seq, h), "vector": (h,)}[residual_form]
    x = rng.normal(size=shape).astype(np.float32)
    values = {
        "x": x,
        "residual": rng.normal(size=residual_shape).astype(np.float32),
        "bias": rng.normal(size=h).astype(np.float32),
    }
    values["gamma"], values["beta"] = affine_values(rng, h)
    op = ops.FusedResidualRmsNorm(has_bias, 1e-5) if rms else ops.FusedResidualLN(has_bias, 1e-5)
    graph = build_norm(op, shape, h, residual_shape=residual_shape, affine_as_param=params, bias_as_param=params)
    y, _ = convert_run(graph, values, target, precision)
    v = program_values(values, precision)
    total = v["x"] + v["residual"] + (v["bias"] if has_bias else 0.0)
    if precision == "fp16":
        total = total.astype(np.float16).astype(np.float64)
    ref = (ref_rms_norm if rms else ref_layer_norm)(total, v["gamma"], v["beta"], 1e-5)
    np.testing.assert_allclose(y, ref, **TOL[precision])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_rms_norm_leading_flattened_declaration(precision: str) -> None:
    rng = np.random.default_rng(8)
    x = rng.normal(size=(2, 3, 8)).astype(np.float32)
    gamma, beta = affine_values(rng, 8)
    graph = build_norm(ops.RmsNorm(-1, 1e-5), x.shape, 8, out_shape=(6, 8))
    y, emitted = convert_run(graph, {"x": x, "gamma": gamma, "beta": beta}, "iOS18", precision)
    assert y.shape == (6, 8) and "reshape" in emitted
    v = program_values({"x": x, "gamma": gamma, "beta": beta}, precision)
    np.testing.assert_allclose(y, ref_rms_norm(v["x"], v["gamma"], v["beta"], 1e-5).reshape(6, 8), **TOL[precision])


# ---------------------------------------------------------------------------------- rejected graphs
#
# The graph builder already rejects most of these when the node is added; the lowering checks
# again (graphs can be assembled without the builder), so each case is built with a valid
# twin op that is then swapped for the bad one, and must fail in `convert` with a typed error
# naming the node and the fault, before coremltools sees anything.


def _swap_op(graph: Graph, node_id: int, op: ops.Op) -> None:
    graph._nodes[node_id] = dataclasses.replace(graph.node(node_id), op=op)


def _expect_lowering_error(error: type[GraphError], graph: Graph, params: dict[str, np.ndarray], match: str) -> None:
    with pytest.raises(error, match=match) as info:
        convert_and_cleanup(graph, params, target="iOS17", precision="fp32")
    assert info.value.node is not None and info.value.op is not None


def _one_norm(
    valid: ops.Op, bad: ops.Op | None, x_shape: tuple[int, ...], gamma_shape: tuple[int, ...],
    x_dtype: DType = DType.F32,
) -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("bad")
    x = _leaf(g, "x", x_shape, False, x_dtype)
    gamma = _leaf(g, "gamma", gamma_shape, True)
    beta = _leaf(g, "beta", gamma_shape, True)
    y = g.add_node(valid, [x, gamma, beta], Shape.of(x_shape, x_dtype), name="y")
    g.set_outputs([y])
    if bad is not None:
        _swap_op(g, y, bad)
    ones = np.ones(gamma_shape, np.float32)
    return g, {"gamma": ones, "beta": ones}


def test_rejects_axis_other_than_last() -> None:
    for bad in (ops.LayerNorm(0, 1e-5), ops.RmsNorm(-2, 1e-5)):
        graph, params = _one_norm(type(bad)(-1, 1e-5), bad, (2, 4), (4,))
        _expect_lowering_error(AttributeValueError, graph, params, "last axis")
        with pytest.raises(AttributeValueError):
            _one_norm(bad, None, (2, 4), (4,))


def test_rejects_gamma_of_wrong_size() -> None:
    g = Graph("bad")
    x = _leaf(g, "x", (2, 4), False)
    gamma = _leaf(g, "gamma", (5,), True)
    beta = _leaf(g, "beta", (4,), True)
    y = g.add_node(ops.Reshape((2, 4)), [x], Shape.of((2, 4)), name="y")
    g.set_outputs([y])
    g._nodes[y] = dataclasses.replace(g.node(y), op=ops.LayerNorm(-1, 1e-5), inputs=(x, gamma, beta))
    params = {"gamma": np.ones(5, np.float32), "beta": np.ones(4, np.float32)}
    with pytest.raises(ShapeError, match="gamma") as info:
        convert_and_cleanup(g, params, target="iOS17", precision="fp32")
    assert info.value.operand == "gamma"


def test_rejects_integer_input() -> None:
    graph, params = _one_norm(ops.RmsNorm(-1, 1e-5), None, (2, 4), (4,), DType.I32)
    _expect_lowering_error(DTypeError, graph, params, "float")


def test_rejects_groups_not_dividing_channels() -> None:
    graph, params = _one_norm(ops.GroupNorm(3, 1e-5), ops.GroupNorm(4, 1e-5), (1, 6, 2, 2), (6,))
    _expect_lowering_error(AttributeValueError, graph, params, "divide")


def test_rejects_negative_eps() -> None:
    graph, params = _one_norm(ops.LayerNorm(-1, 1e-5), ops.LayerNorm(-1, -1.0), (2, 4), (4,))
    _expect_lowering_error(AttributeValueError, graph, params, "eps")


def test_rejects_residual_that_grows_the_output() -> None:
    g = Graph("bad")
    x = _leaf(g, "x", (1, 4), False)
    res = _leaf(g, "residual", (1, 4), False)
    wide = _leaf(g, "wide", (3, 4), False)
    gamma = _leaf(g, "gamma", (4,), True)
    beta = _leaf(g, "beta", (4,), True)
    y = g.add_node(ops.FusedResidualLN(False, 1e-5), [x, res, gamma, beta], Shape.of((1, 4)), name="y")
    g.set_outputs([y])
    g._nodes[y] = dataclasses.replace(g.node(y), inputs=(x, wide, gamma, beta))
    params = {"gamma": np.ones(4, np.float32), "beta": np.zeros(4, np.float32)}
    with pytest.raises(ShapeError, match="residual") as info:
        convert_and_cleanup(g, params, target="iOS17", precision="fp32")
    assert info.value.operand == "residual"
