"""Lowering of the fused blocks (spec 10): FusedSwiGLU, FusedAttentionBlock and
FusedTransformerLayer (14-, 10- and 8-input forms), decomposed into simpler IR ops that go
through their own rules. Checked structurally and against the spec's formulas."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx_mil.errors import ArityError, AttributeValueError, GraphError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import ActivationKind
from rlx_mil.ir.shape import Shape

from .conftest import convert_and_cleanup, emitted_ops
from .test_norm import PRECISIONS, TARGETS, as_program_input, ref_layer_norm, run_model
from .test_rope import ref_rope, rope_tables

#: The blocks chain several matmuls and a softmax: fp16 error grows with depth.
FUSED_TOL = {"fp32": {"rtol": 1e-4, "atol": 1e-4}, "fp16": {"rtol": 3e-2, "atol": 3e-2}}


# ---------------------------------------------------------------------------------- spec formulas


def ref_activation(kind: ActivationKind, x: np.ndarray) -> np.ndarray:
    if kind is ActivationKind.GELU:
        return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    if kind is ActivationKind.GELU_APPROX:
        return 0.5 * x * (1.0 + np.tanh(0.7978845608 * (x + 0.044715 * x**3)))
    if kind is ActivationKind.SILU:
        return x / (1.0 + np.exp(-x))
    if kind is ActivationKind.RELU:
        return np.maximum(x, 0.0)
    raise AssertionError(f"no reference for {kind}")


def ref_swiglu(x: np.ndarray, gate_first: bool) -> np.ndarray:
    n = x.shape[-1] // 2
    low, high = x[..., :n], x[..., n:]
    gate, up = (low, high) if gate_first else (high, low)
    return up * ref_activation(ActivationKind.SILU, gate)


def ref_attention_custom(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, heads: int, head_dim: int) -> np.ndarray:
    """Spec 9.5 for rank-3 [B, S, H*D] operands and a Custom key mask."""
    b, sq, _ = q.shape
    sk = k.shape[1]

    def split(t: np.ndarray) -> np.ndarray:
        return t.reshape(t.shape[0], t.shape[1], heads, head_dim).transpose(0, 2, 1, 3)

    qh, kh, vh = split(q), split(k), split(v)
    s = np.einsum("bhqd,bhkd->bhqk", qh, kh) * head_dim**-0.5
    keep = mask.reshape(b, sk) >= 0.5
    s = np.where(keep[:, None, None, :], s, -1e9)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    return (p @ vh).transpose(0, 2, 1, 3).reshape(b, sq, heads * head_dim)


def ref_attention_block(
    v: Mapping[str, np.ndarray], heads: int, head_dim: int, has_bias: bool, has_rope: bool
) -> np.ndarray:
    width = heads * head_dim
    qkv = v["hidden"] @ v["qkv_w"] + (v["qkv_b"] if has_bias else 0.0)
    q, k, val = qkv[..., :width], qkv[..., width : 2 * width], qkv[..., 2 * width :]
    if has_rope:
        q = ref_rope(q, v["cos"], v["sin"], head_dim, head_dim)
        k = ref_rope(k, v["cos"], v["sin"], head_dim, head_dim)
    a = ref_attention_custom(q, k, val, v["mask"], heads, head_dim)
    return a @ v["out_w"] + (v["out_b"] if has_bias else 0.0)


def ref_transformer_layer(
    v: Mapping[str, np.ndarray], heads: int, head_dim: int, eps1: float, eps2: float, act: ActivationKind, has_bias: bool
) -> np.ndarray:
    zeros = np.zeros(v["hidden"].shape[-1])
    attn = ref_attention_block(v, heads, head_dim, has_bias, False)
    h1 = ref_layer_norm(v["hidden"] + attn, v["ln1_g"], v.get("ln1_b", zeros), eps1)
    f = ref_activation(act, h1 @ v["fc1_w"] + (v["fc1_b"] if has_bias else 0.0))
    f = f @ v["fc2_w"] + (v["fc2_b"] if has_bias else 0.0)
    return ref_layer_norm(h1 + f, v["ln2_g"], v.get("ln2_b", zeros), eps2)


# ---------------------------------------------------------------------------------- graphs


def build(
    op: ops.Op, leaves: list[tuple[str, tuple[int, ...], bool]], out_shape: tuple[int, ...], out_dtype: DType = DType.F32
) -> Graph:
    """One fused node over leaves (name, shape, is_param), in input order."""
    g = Graph("fused")
    ids = [
        g.add_node(ops.Param(name) if is_param else ops.Input(name), [], Shape.of(shape), name=name)
        for name, shape, is_param in leaves
    ]
    y = g.add_node(op, ids, Shape.of(out_shape, out_dtype), name="y")
    g.set_outputs([y])
    return g


def convert_run(
    graph: Graph, values: Mapping[str, np.ndarray], target: str, precision: str, attention: str = "auto"
) -> tuple[np.ndarray, list[str]]:
    params, feeds = {}, {}
    for node in graph:
        if isinstance(node.op, ops.Param):
            params[node.op.name] = values[node.op.name]
        elif isinstance(node.op, ops.Input):
            feeds[node.op.name] = values[node.op.name]
    model = convert_and_cleanup(graph, params, target=target, precision=precision, attention=attention)
    return run_model(model, feeds)["y"], emitted_ops(model)


def program_values(values: Mapping[str, np.ndarray], precision: str) -> dict[str, np.ndarray]:
    return {k: as_program_input(a, precision) for k, a in values.items()}


def key_mask(rng: np.random.Generator, batch: int, seq: int) -> np.ndarray:
    """A [B, S] key-padding mask with at least one attended key per row."""
    mask = (rng.uniform(size=(batch, seq)) > 0.3).astype(np.float32)
    mask[:, 0] = 1.0
    return mask


# ---------------------------------------------------------------------------------- FusedSwiGLU


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("gate_first", [False, True], ids=["up_first", "gate_first"])
def test_swiglu_every_target(target: str, precision: str, gate_first: bool) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 16)).astype(np.float32)
    graph = build(ops.FusedSwiGLU(None, gate_first), [("x", x.shape, False)], (2, 3, 8))
    y, emitted = convert_run(graph, {"x": x}, target, precision)
    want = ref_swiglu(as_program_input(x, precision), gate_first)
    np.testing.assert_allclose(y, want, **FUSED_TOL[precision])
    # the halves are swapped when gate_first flips, so the result must differ
    other = ref_swiglu(as_program_input(x, precision), not gate_first)
    assert not np.allclose(y, other, atol=1e-2)
    assert "silu" in emitted and "mul" in emitted


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("cast_to", [DType.F16, DType.F32])
def test_swiglu_cast_to(precision: str, cast_to: DType) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(0, 3, (4, 10)).astype(np.float32)
    graph = build(ops.FusedSwiGLU(cast_to, False), [("x", x.shape, False)], (4, 5), cast_to)
    y, _ = convert_run(graph, {"x": x}, "iOS17", precision)
    want = ref_swiglu(as_program_input(x, precision), False)
    if cast_to is DType.F16:
        want = want.astype(np.float16).astype(np.float64)
        # an fp16 result is exactly representable in fp16
        np.testing.assert_array_equal(y, y.astype(np.float16).astype(np.float32))
    np.testing.assert_allclose(y, want, **FUSED_TOL[precision])


# ---------------------------------------------------------------------------------- FusedAttentionBlock


def attention_block_case(
    rng: np.random.Generator, batch: int, seq: int, embed: int, heads: int, head_dim: int,
    has_bias: bool, has_rope: bool, rope_rows: int | None = None,
) -> tuple[list[tuple[str, tuple[int, ...], bool]], dict[str, np.ndarray], tuple[int, ...]]:
    """Leaves (weights as Params, activations and tables as Inputs) and values for one block."""
    width = heads * head_dim
    lead = (batch, seq)
    values = {
        "hidden": rng.normal(size=(*lead, embed)).astype(np.float32),
        "qkv_w": (rng.normal(size=(embed, 3 * width)) / math.sqrt(embed)).astype(np.float32),
        "out_w": (rng.normal(size=(width, embed)) / math.sqrt(width)).astype(np.float32),
        "mask": key_mask(rng, batch, seq),
    }
    leaves = [("hidden", values["hidden"].shape, False), ("qkv_w", values["qkv_w"].shape, True),
              ("out_w", values["out_w"].shape, True), ("mask", values["mask"].shape, False)]
    if has_bias:
        values["qkv_b"] = rng.normal(0, 0.1, 3 * width).astype(np.float32)
        values["out_b"] = rng.normal(0, 0.1, embed).astype(np.float32)
        leaves += [("qkv_b", (3 * width,), True), ("out_b", (embed,), True)]
    if has_rope:
        cos, sin = rope_tables(rope_rows or seq + 2, head_dim)
        values.update(cos=cos, sin=sin)
        leaves += [("cos", cos.shape, False), ("sin", sin.shape, False)]
    return leaves, values, (*lead, embed)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize(("has_bias", "has_rope"), [(False, False), (True, False), (False, True), (True, True)])
def test_attention_block_every_target(target: str, precision: str, has_bias: bool, has_rope: bool) -> None:
    rng = np.random.default_rng(2)
    heads, head_dim = 2, 4
    leaves, values, out_shape = attention_block_case(rng, 2, 5, 8, heads, head_dim, has_bias, has_rope)
    graph = build(ops.FusedAttentionBlock(heads, head_dim, has_bias, has_rope), leaves, out_shape)
    y, emitted = convert_run(graph, values, target, precision)
    want = ref_attention_block(program_values(values, precision), heads, head_dim, has_bias, has_rope)
    np.testing.assert_allclose(y, want, **FUSED_TOL[precision])
    # Param weights reach the MatMul rule as weights: both projections become `linear`
    assert emitted.count("linear") == 2
    assert "softmax" in emitted or "scaled_dot_product_attention" in emitted
    if has_rope:
        assert emitted.count("split") >= 2  # the rotate-half of q and of k


@pytest.mark.parametrize("attention", ["fused", "decomposed"])
def test_attention_block_honours_the_attention_option(attention: str) -> None:
    rng = np.random.default_rng(3)
    leaves, values, out_shape = attention_block_case(rng, 1, 4, 8, 2, 4, False, False)
    graph = build(ops.FusedAttentionBlock(2, 4, False, False), leaves, out_shape)
    y, emitted = convert_run(graph, values, "iOS18", "fp32", attention=attention)
    np.testing.assert_allclose(y, ref_attention_block(program_values(values, "fp32"), 2, 4, False, False), **FUSED_TOL["fp32"])
    assert ("scaled_dot_product_attention" in emitted) == (attention == "fused")


def test_attention_block_masked_keys_do_not_contribute() -> None:
    """Changing hidden rows whose keys are masked out changes nothing for the other rows'
    attention: only their own query rows differ."""
    rng = np.random.default_rng(4)
    leaves, values, out_shape = attention_block_case(rng, 1, 6, 8, 2, 4, True, True)
    values["mask"] = np.array([[1, 1, 1, 0, 0, 1]], dtype=np.float32)
    graph = build(ops.FusedAttentionBlock(2, 4, True, True), leaves, out_shape)
    y1, _ = convert_run(graph, values, "iOS17", "fp32")
    changed = dict(values)
    changed["hidden"] = values["hidden"].copy()
    changed["hidden"][:, 3:5] += 5.0
    y2, _ = convert_run(graph, changed, "iOS17", "fp32")
    np.testing.assert_allclose(y1[:, [0, 1, 2, 5]], y2[:, [0, 1, 2, 5]], atol=1e-5)
    assert not np.allclose(y1[:, 3:5], y2[:, 3:5], atol=1e-3)


@given(
    batch=st.integers(1, 2),
    seq=st.integers(1, 5),
    heads=st.integers(1, 3),
    half_dim=st.integers(1, 3),
    embed=st.integers(2, 9),
    has_bias=st.booleans(),
    has_rope=st.booleans(),
    extra_rope_rows=st.integers(0, 2),
    precision=st.sampled_from(PRECISIONS),
    target=st.sampled_from(TARGETS),
    seed=st.integers(0, 2**16),
)
def test_attention_block_matches_spec(
    batch: int, seq: int, heads: int, half_dim: int, embed: int, has_bias: bool, has_rope: bool,
    extra_rope_rows: int, precision: str, target: str, seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    head_dim = 2 * half_dim
    rows = seq + extra_rope_rows
    leaves, values, out_shape = attention_block_case(rng, batch, seq, embed, heads, head_dim, has_bias, has_rope, rows)
    graph = build(ops.FusedAttentionBlock(heads, head_dim, has_bias, has_rope), leaves, out_shape)
    y, _ = convert_run(graph, values, target, precision)
    want = ref_attention_block(program_values(values, precision), heads, head_dim, has_bias, has_rope)
    np.testing.assert_allclose(y, want, **FUSED_TOL[precision])


# ---------------------------------------------------------------------------------- FusedTransformerLayer


def transformer_layer_case(
    rng: np.random.Generator, form: int, batch: int, seq: int, heads: int, head_dim: int, inter: int, embed: int = 0,
) -> tuple[list[tuple[str, tuple[int, ...], bool]], dict[str, np.ndarray], tuple[int, ...]]:
    embed = embed or heads * head_dim
    width = heads * head_dim
    lead = (batch, seq)
    full = {
        "hidden": rng.normal(size=(*lead, embed)),
        "qkv_w": rng.normal(size=(embed, 3 * width)) / math.sqrt(embed),
        "qkv_b": rng.normal(0, 0.1, 3 * width),
        "out_w": rng.normal(size=(width, embed)) / math.sqrt(width),
        "out_b": rng.normal(0, 0.1, embed),
        "ln1_g": rng.uniform(0.5, 1.5, embed),
        "ln1_b": rng.normal(0, 0.2, embed),
        "fc1_w": rng.normal(size=(embed, inter)) / math.sqrt(embed),
        "fc1_b": rng.normal(0, 0.1, inter),
        "fc2_w": rng.normal(size=(inter, embed)) / math.sqrt(inter),
        "fc2_b": rng.normal(0, 0.1, embed),
        "ln2_g": rng.uniform(0.5, 1.5, embed),
        "ln2_b": rng.normal(0, 0.2, embed),
        "mask": key_mask(rng, batch, seq),
    }
    roles = {
        14: ["hidden", "qkv_w", "qkv_b", "out_w", "out_b", "ln1_g", "ln1_b", "fc1_w", "fc1_b", "fc2_w", "fc2_b",
             "ln2_g", "ln2_b", "mask"],
        10: ["hidden", "qkv_w", "out_w", "ln1_g", "ln1_b", "fc1_w", "fc2_w", "ln2_g", "ln2_b", "mask"],
        8: ["hidden", "qkv_w", "out_w", "ln1_g", "fc1_w", "fc2_w", "ln2_g", "mask"],
    }[form]
    values = {role: np.asarray(full[role], dtype=np.float32) for role in roles}
    leaves = [(role, values[role].shape, role not in ("hidden", "mask")) for role in roles]
    return leaves, values, (*lead, embed)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("form", [14, 10, 8])
def test_transformer_layer_every_target_and_form(target: str, precision: str, form: int) -> None:
    rng = np.random.default_rng(5)
    heads, head_dim, inter = 2, 4, 16
    leaves, values, out_shape = transformer_layer_case(rng, form, 2, 4, heads, head_dim, inter)
    op = ops.FusedTransformerLayer(heads, head_dim, inter, 1e-12, 1e-5, ActivationKind.GELU, form == 14)
    graph = build(op, leaves, out_shape)
    y, emitted = convert_run(graph, values, target, precision)
    want = ref_transformer_layer(program_values(values, precision), heads, head_dim, 1e-12, 1e-5, ActivationKind.GELU, form == 14)
    np.testing.assert_allclose(y, want, **FUSED_TOL[precision])
    assert emitted.count("linear") == 4 and "gelu" in emitted
    if precision == "fp32":
        assert emitted.count("layer_norm") == 2


@given(
    form=st.sampled_from([14, 10, 8]),
    batch=st.integers(1, 2),
    seq=st.integers(1, 4),
    heads=st.integers(1, 2),
    head_dim=st.integers(1, 4),
    inter=st.integers(1, 12),
    act=st.sampled_from([ActivationKind.GELU, ActivationKind.GELU_APPROX, ActivationKind.RELU, ActivationKind.SILU]),
    eps=st.sampled_from([1e-12, 1e-5]),
    precision=st.sampled_from(PRECISIONS),
    target=st.sampled_from(TARGETS),
    seed=st.integers(0, 2**16),
)
def test_transformer_layer_matches_spec(
    form: int, batch: int, seq: int, heads: int, head_dim: int, inter: int, act: ActivationKind, eps: float,
    precision: str, target: str, seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    leaves, values, out_shape = transformer_layer_case(rng, form, batch, seq, heads, head_dim, inter)
    op = ops.FusedTransformerLayer(heads, head_dim, inter, eps, 1e-5, act, form == 14)
    graph = build(op, leaves, out_shape)
    y, _ = convert_run(graph, values, target, precision)
    want = ref_transformer_layer(program_values(values, precision), heads, head_dim, eps, 1e-5, act, form == 14)
    np.testing.assert_allclose(y, want, **FUSED_TOL[precision])


def test_transformer_layer_fp16_large_hidden_stays_finite() -> None:
    """Post-norm residual sums of magnitude ~500 over hidden 256 overflow a direct fp16
    LayerNorm; the decomposition's norms must keep the layer finite and accurate. (The qkv
    projection is kept small: scores of 500-magnitude queries and keys exceed fp16 by
    themselves, which no norm lowering can help.)"""
    rng = np.random.default_rng(6)
    heads, head_dim, inter = 4, 64, 64
    leaves, values, out_shape = transformer_layer_case(rng, 10, 1, 3, heads, head_dim, inter)
    values["hidden"] = (rng.choice([-1.0, 1.0], size=values["hidden"].shape) * rng.uniform(300, 700, values["hidden"].shape)).astype(np.float32)
    values["qkv_w"] = values["qkv_w"] * np.float32(1e-3)
    with np.errstate(over="ignore"):
        assert np.isinf(np.square(values["hidden"].astype(np.float16))).any()
    op = ops.FusedTransformerLayer(heads, head_dim, inter, 1e-12, 1e-12, ActivationKind.GELU, False)
    graph = build(op, leaves, out_shape)
    y, _ = convert_run(graph, values, "iOS16", "fp16")
    assert np.isfinite(y).all()
    want = ref_transformer_layer(program_values(values, "fp16"), heads, head_dim, 1e-12, 1e-12, ActivationKind.GELU, False)
    np.testing.assert_allclose(y, want, rtol=5e-2, atol=5e-2)


# ---------------------------------------------------------------------------------- rejected graphs


def _convert(graph: Graph, values: Mapping[str, np.ndarray]) -> Any:
    params = {n.op.name: values[n.op.name] for n in graph if isinstance(n.op, ops.Param)}
    return convert_and_cleanup(graph, params, target="iOS17", precision="fp32")


def _expect(error: type[GraphError], operand: str | None, make: Any) -> None:
    """The fault is reported as a typed error naming the fused node and the operand at fault
    (when the node is added or, for graphs the builder lets through, when it is lowered)."""
    with pytest.raises(error) as info:
        graph, values = make()
        _convert(graph, values)
    assert info.value.op is not None and info.value.node is not None
    assert info.value.operand == operand


def test_swiglu_rejects_odd_split() -> None:
    def make() -> tuple[Graph, dict[str, np.ndarray]]:
        graph = build(ops.FusedSwiGLU(None, False), [("x", (2, 7), False)], (2, 3))
        return graph, {}

    _expect(ShapeError, "x", make)


def test_attention_block_rejects_mismatched_weights() -> None:
    rng = np.random.default_rng(7)
    leaves, values, out_shape = attention_block_case(rng, 1, 3, 8, 2, 4, False, False)
    values["qkv_w"] = values["qkv_w"][:, :-1]
    leaves[1] = ("qkv_w", values["qkv_w"].shape, True)
    _expect(ShapeError, "qkv_w", lambda: (build(ops.FusedAttentionBlock(2, 4, False, False), leaves, out_shape), values))


def test_attention_block_rejects_short_rope_table() -> None:
    rng = np.random.default_rng(8)
    leaves, values, out_shape = attention_block_case(rng, 1, 5, 8, 2, 4, False, True, rope_rows=3)
    _expect(ShapeError, "cos", lambda: (build(ops.FusedAttentionBlock(2, 4, False, True), leaves, out_shape), values))


def test_attention_block_rejects_mask_of_wrong_size() -> None:
    rng = np.random.default_rng(9)
    leaves, values, out_shape = attention_block_case(rng, 2, 3, 8, 2, 4, False, False)
    values["mask"] = np.ones((2, 4), np.float32)
    leaves[3] = ("mask", (2, 4), False)
    _expect(ShapeError, "mask", lambda: (build(ops.FusedAttentionBlock(2, 4, False, False), leaves, out_shape), values))


def test_transformer_layer_rejects_wrong_input_count() -> None:
    rng = np.random.default_rng(10)
    leaves, values, out_shape = transformer_layer_case(rng, 10, 1, 3, 2, 4, 8)
    op = ops.FusedTransformerLayer(2, 4, 8, 1e-5, 1e-5, ActivationKind.GELU, True)  # has_bias wants 14
    _expect(ArityError, None, lambda: (build(op, leaves, out_shape), values))


def test_transformer_layer_rejects_wrong_intermediate_size() -> None:
    rng = np.random.default_rng(11)
    leaves, values, out_shape = transformer_layer_case(rng, 8, 1, 3, 2, 4, 8)
    op = ops.FusedTransformerLayer(2, 4, 6, 1e-5, 1e-5, ActivationKind.GELU, False)
    _expect(ShapeError, "fc1_w", lambda: (build(op, leaves, out_shape), values))


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (ops.FusedTransformerLayer(2, 4, 6, 1e-5, 1e-5, ActivationKind.GELU, False), ShapeError, "fc1_w"),
        (ops.FusedTransformerLayer(4, 4, 8, 1e-5, 1e-5, ActivationKind.GELU, False), ShapeError, "qkv_w"),
        (ops.FusedTransformerLayer(2, 4, 8, 1e-5, float("nan"), ActivationKind.GELU, False), AttributeValueError, "eps2"),
    ],
)
def test_transformer_layer_lowering_checks_its_own_inputs(bad: ops.Op, error: type[GraphError], match: str) -> None:
    """Graphs assembled without the builder's checks (the op swapped in after the node was
    added) are still rejected by the lowering, naming the node and the operand."""
    rng = np.random.default_rng(12)
    leaves, values, out_shape = transformer_layer_case(rng, 10, 1, 3, 2, 4, 8)
    graph = build(ops.FusedTransformerLayer(2, 4, 8, 1e-5, 1e-5, ActivationKind.GELU, False), leaves, out_shape)
    y = graph.outputs[0]
    graph._nodes[y] = dataclasses.replace(graph.node(y), op=bad)
    with pytest.raises(error, match=match) as info:
        _convert(graph, values)
    assert info.value.node == y and info.value.op == "FusedTransformerLayer"
