"""JSON interchange with upstream RLX: fixtures, exact round trips, f32 spelling, hostile input."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import re
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from conftest import UPSTREAM_JSON_DIR, upstream_fixture_paths
from hypothesis import given
from hypothesis import strategies as st

import rlx_mil.ir.graph as graph_module
import rlx_mil.ir.infer as infer_module
from rlx_mil.errors import ArityError, GraphError, GraphFormatError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph, NodeOrigin
from rlx_mil.ir.json_io import (
    OP_FORMS,
    JsonLimits,
    format_f32,
    graph_from_json,
    graph_from_json_file,
    graph_to_json,
    graph_to_json_file,
    parse_f32,
)
from rlx_mil.ir.ops import (
    OP_TYPES,
    ActivationKind,
    AttentionBwdWrt,
    BinaryOp,
    CmpOp,
    MaskKind,
    Op,
    QuantKind,
    QuantScheme,
    ReduceOp,
)
from rlx_mil.ir.serde.versions import NEWEST_ONLY_MEMBERS
from rlx_mil.ir.shape import Dynamic, Shape, Static

FIXTURE_PATHS = upstream_fixture_paths()
NO_FIXTURES_REASON = f"upstream JSON fixtures not found at {UPSTREAM_JSON_DIR} (../shared is absent)"


def fixture_params() -> list[Any]:
    if not FIXTURE_PATHS:
        return [pytest.param(None, marks=pytest.mark.skip(reason=NO_FIXTURES_REASON))]
    return [pytest.param(path, id=path.name) for path in FIXTURE_PATHS]


def load_fixture(name: str) -> Graph:
    path = UPSTREAM_JSON_DIR / name
    if not path.is_file():
        pytest.skip(NO_FIXTURES_REASON)
    return graph_from_json_file(path)


def signature(graph: Graph) -> tuple[object, ...]:
    return graph.name, graph.nodes, graph.outputs


def f32(value: float) -> float:
    return float(np.float32(value))


@contextlib.contextmanager
def trusting_inference() -> Iterator[None]:
    """Accept every declared shape.

    The random graphs below pair arbitrary attribute values with arbitrary declared shapes:
    they exercise the codec over the whole attribute space, which is far larger than the
    space of semantically valid graphs. Shape rules are tested with the inference module;
    the fixtures cover loading through the real rules.
    """

    def trust(op: Op, inputs: Sequence[Shape], declared: Shape | None = None) -> Shape | None:
        return None

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(infer_module, "infer_shape", trust))
        if hasattr(graph_module, "infer_shape"):
            stack.enter_context(mock.patch.object(graph_module, "infer_shape", trust))
        yield


# The example of spec section 2, as serde_json::to_string writes it.
TINY_TEXT = (
    '{"name":"tiny","nodes":['
    '{"id":0,"op":{"Input":{"name":"x"}},"inputs":[],"shape":{"dims":[{"Static":1},{"Static":4},{"Static":8}],"dtype":"F32"},"name":"x","origin":null},'
    '{"id":1,"op":{"Param":{"name":"w"}},"inputs":[],"shape":{"dims":[{"Static":8},{"Static":8}],"dtype":"F32"},"name":"w","origin":null},'
    '{"id":2,"op":{"Constant":{"data":[0,0,192,63]}},"inputs":[],"shape":{"dims":[{"Static":1}],"dtype":"F32"},"name":null,"origin":null},'
    '{"id":3,"op":"MatMul","inputs":[0,1],"shape":{"dims":[{"Static":1},{"Static":4},{"Static":8}],"dtype":"F32"},"name":null,"origin":null},'
    '{"id":4,"op":{"Binary":"Add"},"inputs":[3,2],"shape":{"dims":[{"Static":1},{"Static":4},{"Static":8}],"dtype":"F32"},"name":null,"origin":null},'
    '{"id":5,"op":{"Activation":"Gelu"},"inputs":[4],"shape":{"dims":[{"Static":1},{"Static":4},{"Static":8}],"dtype":"F32"},"name":null,"origin":null}],'
    '"outputs":[5]}'
)


def tiny_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(TINY_TEXT)
    return doc


def with_attention_doc() -> dict[str, Any]:
    """A small graph whose node 3 is an Attention node (q, k, v inputs)."""
    dims = [{"Static": 1}, {"Static": 2}, {"Static": 3}, {"Static": 4}]
    shape = {"dims": dims, "dtype": "F32"}
    nodes: list[dict[str, Any]] = [
        {"id": i, "op": {"Input": {"name": n}}, "inputs": [], "shape": copy.deepcopy(shape), "name": n, "origin": None}
        for i, n in enumerate("qkv")
    ]
    nodes.append({
        "id": 3,
        "op": {"Attention": {"num_heads": 2, "head_dim": 4, "mask_kind": "Causal", "score_scale": 0.5,
                             "attn_logit_softcap": None}},
        "inputs": [0, 1, 2],
        "shape": copy.deepcopy(shape),
        "name": "attn",
        "origin": {"hir": 7, "label": "sdpa", "pass": "fusion"},
    })
    nodes.append({
        "id": 4,
        "op": {"LayerNorm": {"axis": -1, "eps": 1e-05}},
        "inputs": [3, 0, 0],
        "shape": copy.deepcopy(shape),
        "name": None,
        "origin": None,
    })
    return {"name": "attn_graph", "nodes": nodes, "outputs": [3, 4]}


# ============================================================================ fixtures


@pytest.mark.parametrize("path", fixture_params())
def test_fixture_loads_with_the_declared_structure(path: Path) -> None:
    raw = json.loads(path.read_text())
    graph = graph_from_json_file(path)
    assert graph.name == raw["name"]
    assert len(graph) == len(raw["nodes"])
    assert list(graph.outputs) == raw["outputs"]
    for node, raw_node in zip(graph.nodes, raw["nodes"], strict=True):
        assert node.id == raw_node["id"]
        assert list(node.inputs) == raw_node["inputs"]
        assert node.name == raw_node["name"]
        assert node.origin is None and raw_node["origin"] is None
        raw_op = raw_node["op"]
        assert node.op.type_name == (raw_op if isinstance(raw_op, str) else next(iter(raw_op)))
        assert node.shape.dtype.value == raw_node["shape"]["dtype"]
        assert [{type(d).__name__: d.size if isinstance(d, Static) else d.symbol} for d in node.shape.dims] == (
            raw_node["shape"]["dims"]
        )


@pytest.mark.parametrize("path", fixture_params())
def test_fixture_reserialises_byte_identically(path: Path, tmp_path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    graph = graph_from_json(text)
    # serde_json::to_string_pretty output; the fixture files add one final newline.
    assert graph_to_json(graph, indent=2) + "\n" == text
    assert graph.to_json(indent=2) + "\n" == text
    out = tmp_path / path.name
    graph_to_json_file(graph, out, indent=2)
    assert out.read_bytes() == path.read_bytes()


@pytest.mark.parametrize("path", fixture_params())
def test_fixture_compact_form_has_the_same_tokens(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    compact = graph_to_json(graph_from_json(text))
    assert "\n" not in compact and '": ' not in compact and ", " not in compact
    # parse_float=str compares the float spellings themselves, not just their values.
    assert json.loads(compact, parse_float=str) == json.loads(text, parse_float=str)
    assert signature(graph_from_json(compact)) == signature(graph_from_json(text))


def test_fixture_attention_attributes_are_decoded() -> None:
    softcap = load_fixture("attn_opts_softcap.json")
    by_name = {n.name: n.op for n in softcap.nodes}
    op = by_name["attn_causal_scale0.2_softcap30"]
    assert isinstance(op, ops.Attention)
    assert (op.num_heads, op.head_dim, op.mask_kind) == (4, 16, MaskKind.CAUSAL)
    assert op.score_scale == f32(0.2) and op.attn_logit_softcap == 30.0
    op = by_name["attn_nomask_softcap30"]
    assert isinstance(op, ops.Attention)
    assert (op.mask_kind, op.score_scale, op.attn_logit_softcap) == (MaskKind.NONE, None, 30.0)
    op = by_name["attn_custom_scale0.2"]
    assert isinstance(op, ops.Attention)
    assert (op.mask_kind, op.score_scale, op.attn_logit_softcap) == (MaskKind.CUSTOM, f32(0.2), None)

    sliding = load_fixture("attn_sliding_bshd.json")
    assert sliding.nodes[3].op == ops.Attention(4, 16, MaskKind.sliding_window(3))

    backward = load_fixture("attn_backward.json")
    wrts = [n.op.wrt for n in backward.nodes if isinstance(n.op, ops.AttentionBackward)]
    assert wrts == [AttentionBwdWrt.QUERY, AttentionBwdWrt.KEY, AttentionBwdWrt.VALUE]
    assert all(n.name is None for n in backward.nodes if isinstance(n.op, ops.AttentionBackward))


def test_fixture_norm_eps_quant_and_constant_values_are_decoded() -> None:
    bert = load_fixture("bert_layer.json")
    eps = {n.op.eps for n in bert.nodes if isinstance(n.op, ops.LayerNorm)}
    assert eps == {f32(1e-12)}
    llama = load_fixture("llama_layer.json")
    eps = {n.op.eps for n in llama.nodes if isinstance(n.op, ops.RmsNorm)}
    assert eps == {f32(1e-5)}
    assert {n.op for n in llama.nodes if isinstance(n.op, ops.Rope)} == {ops.Rope(8, 8)}

    quant = load_fixture("quant_matmul.json")
    schemes = [n.op.scheme for n in quant.nodes if isinstance(n.op, ops.DequantMatMul)]
    assert schemes == [QuantScheme.int8_block(4), QuantScheme.int8_block_asym(4), QuantScheme.int4_block(4)]
    quantizers = [n.op for n in quant.nodes if isinstance(n.op, ops.Quantize)]
    assert quantizers == [
        ops.Quantize(None, (f32(0.05),), (3,)),
        ops.Quantize(0, (f32(0.1), f32(0.02)), (0, -1)),
    ]

    zoo = load_fixture("elementwise_zoo.json")
    constants = [n.op for n in zoo.nodes if isinstance(n.op, ops.Constant)]
    assert len(constants) == 1
    values = np.frombuffer(constants[0].data, dtype="<f4")
    np.testing.assert_array_equal(values, np.array([1.0, -2.5, 0.5, 3.0], dtype=np.float32))
    compares = [n for n in zoo.nodes if isinstance(n.op, ops.Compare)]
    assert {n.op.op for n in zoo.nodes if isinstance(n.op, ops.Compare)} == set(CmpOp)
    assert {n.shape.dtype for n in compares} == {DType.BOOL}
    assert {n.op.kind for n in zoo.nodes if isinstance(n.op, ops.Activation)} == {k for k in ActivationKind if k not in NEWEST_ONLY_MEMBERS}


# ============================================================================ spec examples


def test_spec_example_round_trips_exactly() -> None:
    graph = Graph.from_json(TINY_TEXT)
    assert graph.to_json() == TINY_TEXT
    assert [n.op.type_name for n in graph.nodes] == ["Input", "Param", "Constant", "MatMul", "Binary", "Activation"]
    constant = graph.nodes[2].op
    assert isinstance(constant, ops.Constant)
    assert struct.unpack("<f", constant.data) == (1.5,)
    assert graph.outputs == (5,)


SPEC_OP_ENCODINGS = [
    '{"Attention":{"num_heads":2,"head_dim":4,"mask_kind":{"SlidingWindow":3},"score_scale":0.5,"attn_logit_softcap":null}}',
    '{"Rope":{"head_dim":64,"n_rot":32}}',
    '{"Narrow":{"axis":2,"start":0,"len":8}}',
    '{"Reduce":{"op":"Mean","axes":[2],"keep_dim":true}}',
    '{"Cumsum":{"axis":-1,"exclusive":true}}',
    '{"Quantize":{"axis":null,"scales":[0.1],"zero_points":[0]}}',
    '{"Dequantize":{"axis":0,"scales":[0.5,0.25],"zero_points":[0,3]}}',
    '{"DequantMatMul":{"scheme":{"Int4Block":{"block_size":32}}}}',
    '{"DequantMatMul":{"scheme":"GgufQ4K"}}',
    '{"DequantMatMul":{"scheme":"Fp8E4m3"}}',
    '{"FusedMatMulBiasAct":{"activation":"Silu"}}',
    '{"FusedSwiGLU":{"cast_to":null,"gate_first":false}}',
    '{"FusedSwiGLU":{"cast_to":"F16","gate_first":true}}',
    '{"AttentionBackward":{"num_heads":2,"head_dim":4,"mask_kind":"None","wrt":"Key"}}',
    '{"Pool":{"kind":"Max","kernel_size":[2,2],"stride":[2,2],"padding":[0,0]}}',
    '{"FusedTransformerLayer":{"num_heads":12,"head_dim":64,"intermediate_size":3072,"eps1":1e-12,"eps2":1e-12,"activation":"Gelu","has_bias":true}}',
    '{"Reshape":{"new_shape":[-1,64]}}',
    '{"Compare":"Lt"}',
    '"Where"',
]


def single_op_graph_text(op_text: str, arity: int) -> str:
    leaf = '{{"id":{i},"op":{{"Input":{{"name":"x{i}"}}}},"inputs":[],"shape":{{"dims":[{{"Static":2}}],"dtype":"F32"}},"name":"x{i}","origin":null}}'
    nodes = [leaf.format(i=i) for i in range(arity)]
    inputs = ",".join(str(i) for i in range(arity))
    nodes.append(
        f'{{"id":{arity},"op":{op_text},"inputs":[{inputs}],"shape":{{"dims":[{{"Dynamic":1}}],"dtype":"F32"}},'
        '"name":null,"origin":null}'
    )
    return f'{{"name":"g","nodes":[{",".join(nodes)}],"outputs":[{arity}]}}'


@pytest.mark.parametrize("op_text", SPEC_OP_ENCODINGS)
def test_spec_op_encodings_round_trip_exactly(op_text: str) -> None:
    with trusting_inference():
        arity = _arity_of(op_text)
        text = single_op_graph_text(op_text, arity)
        graph = graph_from_json(text)
        assert graph_to_json(graph) == text


def _arity_of(op_text: str) -> int:
    """Decode the op alone (inside a graph with enough inputs) and read its arity."""
    for arity in range(0, 16):
        try:
            graph = graph_from_json(single_op_graph_text(op_text, arity))
        except GraphFormatError:
            continue
        return len(graph.nodes[-1].inputs)
    raise AssertionError(f"no arity accepted for {op_text}")


def test_spec_op_encodings_decode_to_the_expected_values() -> None:
    with trusting_inference():
        def op_of(op_text: str) -> Op:
            return graph_from_json(single_op_graph_text(op_text, _arity_of(op_text))).nodes[-1].op

        assert op_of(SPEC_OP_ENCODINGS[0]) == ops.Attention(2, 4, MaskKind.sliding_window(3), 0.5, None)
        assert op_of(SPEC_OP_ENCODINGS[7]) == ops.DequantMatMul(QuantScheme.int4_block(32))
        assert op_of(SPEC_OP_ENCODINGS[8]) == ops.DequantMatMul(QuantScheme(QuantKind.GGUF_Q4K))
        assert op_of(SPEC_OP_ENCODINGS[12]) == ops.FusedSwiGLU(DType.F16, True)
        assert op_of(SPEC_OP_ENCODINGS[15]) == ops.FusedTransformerLayer(
            12, 64, 3072, f32(1e-12), f32(1e-12), ActivationKind.GELU, True
        )
        assert op_of(SPEC_OP_ENCODINGS[16]) == ops.Reshape((-1, 64))


# ============================================================================ f32 spelling

# Spellings of serde_json (ryu) for f32 values.
RYU_SPELLINGS = [
    (0.2, "0.2"),
    (30.0, "30.0"),
    (1e-12, "1e-12"),
    (1e-5, "0.00001"),
    (1e-6, "0.000001"),
    (1e-7, "1e-7"),
    (1.5e-7, "1.5e-7"),
    (0.1, "0.1"),
    (1 / 3, "0.33333334"),
    (1.0, "1.0"),
    (-1.5, "-1.5"),
    (0.0, "0.0"),
    (-0.0, "-0.0"),
    (123456789.0, "123456790.0"),
    (1e12, "1000000000000.0"),
    (1e13, "1e13"),
    (2.5e20, "2.5e20"),
    (16777216.0, "16777216.0"),
    (3.4028234663852886e38, "3.4028235e38"),  # f32::MAX
    (1.1754943508222875e-38, "1.1754944e-38"),  # f32::MIN_POSITIVE
    (1.401298464324817e-45, "1e-45"),  # smallest subnormal
]


@pytest.mark.parametrize(("value", "text"), RYU_SPELLINGS)
def test_format_f32_matches_serde_json(value: float, text: str) -> None:
    assert format_f32(value) == text
    assert struct.pack("<f", parse_f32(text)) == struct.pack("<f", value)


def f32_from_bits(bits: int) -> float:
    value: float = struct.unpack("<f", struct.pack("<I", bits))[0]
    return value


FINITE_F32_BITS = st.integers(0, 2**32 - 1).filter(lambda b: (b >> 23) & 0xFF != 0xFF)


@given(FINITE_F32_BITS)
def test_format_f32_is_shortest_and_reads_back_to_the_same_bits(bits: int) -> None:
    value = f32_from_bits(bits)
    text = format_f32(value)
    assert struct.unpack("<I", struct.pack("<f", parse_f32(text)))[0] == bits
    if value == 0:
        return
    # numpy's Dragon4 in unique mode is an independent shortest-digits implementation.
    reference = np.format_float_scientific(np.float32(value), unique=True, trim="-")
    ref_mantissa, ref_exp = reference.lstrip("-").split("e")
    ref_digits = ref_mantissa.replace(".", "")
    match = re.fullmatch(r"-?(\d+)(?:\.(\d+))?(?:e(-?\d+))?", text)
    assert match is not None, text
    int_part, frac_part, exp_part = match.group(1), match.group(2) or "", match.group(3)
    digits = (int_part + frac_part).lstrip("0").rstrip("0")
    assert digits == ref_digits.rstrip("0")
    # Plain decimal exactly when 1e-6 <= |decimal| < 1e13, as ryu's f32 printer lays it out.
    magnitude = abs(float(text))
    assert (exp_part is None) == (1e-6 <= magnitude < 1e13)
    if exp_part is None:
        assert "." in text
    else:
        assert int(exp_part) == int(ref_exp)


def test_parse_f32_rounds_ties_to_even_and_rejects_overflow() -> None:
    assert parse_f32("16777217") == 16777216.0
    assert parse_f32("16777219") == 16777220.0
    half_min_subnormal = "7.00649232162408535461864791644958065640130970938257885878534141944895541342930300743319094181060791015625e-46"
    assert parse_f32(half_min_subnormal) == 0.0
    assert parse_f32(half_min_subnormal.replace("625e-46", "626e-46")) == 2.0**-149
    overflow_threshold = 2**128 - 2**103  # halfway between f32::MAX and 2**128
    with pytest.raises(ValueError, match="f32 range"):
        parse_f32(str(overflow_threshold))
    assert parse_f32(str(overflow_threshold - 1)) == float(np.finfo(np.float32).max)
    with pytest.raises(ValueError, match="f32 range"):
        parse_f32("1e999999999")
    assert parse_f32("1e-999999999") == 0.0
    assert math.copysign(1.0, parse_f32("-0.0")) == -1.0
    assert parse_f32("0." + "0" * 300 + "1e300") == f32(1e-1)
    assert parse_f32("1" + "0" * 400 + "e-400") == 1.0
    assert parse_f32("25e+" + "0" * 5000 + "1") == 250.0
    assert parse_f32("-3.5E-" + "0" * 5000 + "1") == f32(-0.35)
    assert parse_f32("0." + "1" * 5000) == f32(1 / 9)
    with pytest.raises(ValueError, match="f32 range"):
        parse_f32("1" * 5000)


# ============================================================================ random graphs

USIZES = st.one_of(st.integers(0, 40), st.sampled_from([2**32 - 1, 2**32, 2**64 - 1]))
U32S = st.one_of(st.integers(0, 40), st.just(2**32 - 1))
I32S = st.one_of(st.integers(-5, 5), st.sampled_from([-(2**31), 2**31 - 1]))
I64S = st.one_of(st.integers(-2, 40), st.sampled_from([-(2**63), 2**63 - 1]))
F32S = st.floats(width=32, allow_nan=False, allow_infinity=False)
ACTIVATIONS = st.sampled_from(ActivationKind)
DTYPES = st.sampled_from(DType)
TEXTS = st.text(max_size=8)
BOOLS = st.booleans()
MASKS = st.one_of(
    st.sampled_from([MaskKind.NONE, MaskKind.CAUSAL, MaskKind.CUSTOM, MaskKind.BIAS]),
    USIZES.map(MaskKind.sliding_window),
)
SCHEMES = st.one_of(
    st.builds(
        QuantScheme,
        st.sampled_from([k for k in QuantKind if k.has_block_size]),
        st.one_of(st.integers(1, 64), st.just(2**64 - 1)),
    ),
    st.sampled_from([QuantScheme(k) for k in QuantKind if not k.parameters]),
    st.builds(
        lambda kind, values: QuantScheme(kind, **dict(zip(kind.parameters, values, strict=False))),
        st.sampled_from([k for k in QuantKind if k.parameters and not k.has_block_size]),
        st.lists(st.integers(1, 2**64 - 1), min_size=2, max_size=2),
    ),
)


def vectors(elements: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.lists(elements, max_size=4).map(tuple)


OP_STRATEGIES: dict[str, st.SearchStrategy[Op]] = {
    "Input": st.builds(ops.Input, TEXTS),
    "Param": st.builds(ops.Param, TEXTS),
    "Activation": st.builds(ops.Activation, ACTIVATIONS),
    "Cast": st.builds(ops.Cast, DTYPES),
    "Binary": st.builds(ops.Binary, st.sampled_from(BinaryOp)),
    "Compare": st.builds(ops.Compare, st.sampled_from(CmpOp)),
    "Where": st.just(ops.Where()),
    "MatMul": st.just(ops.MatMul()),
    "LoraMatMul": st.builds(ops.LoraMatMul, F32S),
    "FusedMatMulBiasAct": st.builds(ops.FusedMatMulBiasAct, st.none() | ACTIVATIONS),
    "Quantize": st.builds(ops.Quantize, st.none() | USIZES, vectors(F32S), vectors(I32S)),
    "Dequantize": st.builds(ops.Dequantize, st.none() | USIZES, vectors(F32S), vectors(I32S)),
    "DequantMatMul": st.builds(ops.DequantMatMul, SCHEMES),
    "LayerNorm": st.builds(ops.LayerNorm, I32S, F32S),
    "RmsNorm": st.builds(ops.RmsNorm, I32S, F32S),
    "GroupNorm": st.builds(ops.GroupNorm, USIZES, F32S),
    "FusedResidualLN": st.builds(ops.FusedResidualLN, BOOLS, F32S),
    "FusedResidualRmsNorm": st.builds(ops.FusedResidualRmsNorm, BOOLS, F32S),
    "Softmax": st.builds(ops.Softmax, I32S),
    "Reduce": st.builds(ops.Reduce, st.sampled_from(ReduceOp), vectors(USIZES), BOOLS),
    "Cumsum": st.builds(ops.Cumsum, I32S, BOOLS),
    "TopK": st.builds(ops.TopK, USIZES),
    "Reshape": st.builds(ops.Reshape, vectors(I64S)),
    "Transpose": st.builds(ops.Transpose, vectors(USIZES)),
    "Narrow": st.builds(ops.Narrow, USIZES, USIZES, USIZES),
    "Concat": st.builds(ops.Concat, USIZES),
    "Expand": st.builds(ops.Expand, vectors(I64S)),
    "Gather": st.builds(ops.Gather, USIZES),
    "Rope": st.builds(ops.Rope, USIZES, USIZES, st.sampled_from(ops.RopeStyle)),
    "Attention": st.builds(
        ops.Attention, USIZES, USIZES, MASKS, st.none() | F32S, st.none() | F32S, st.none() | USIZES
    ),
    "AttentionBackward": st.builds(ops.AttentionBackward, USIZES, USIZES, MASKS, st.sampled_from(AttentionBwdWrt)),
    "FusedSwiGLU": st.builds(ops.FusedSwiGLU, st.none() | DTYPES, BOOLS),
    "FusedAttentionBlock": st.builds(ops.FusedAttentionBlock, USIZES, USIZES, BOOLS, BOOLS),
    "FusedTransformerLayer": st.builds(
        ops.FusedTransformerLayer, USIZES, USIZES, USIZES, F32S, F32S, ACTIVATIONS, BOOLS
    ),
    "Conv": st.builds(ops.Conv, vectors(USIZES), vectors(USIZES), vectors(USIZES), vectors(USIZES), USIZES),
    "Pool": st.builds(ops.Pool, st.sampled_from(ReduceOp), vectors(USIZES), vectors(USIZES), vectors(USIZES)),
    # Part-2 spec ops.
    "BatchNormInference": st.builds(ops.BatchNormInference, F32S),
    "LayerNorm2d": st.builds(ops.LayerNorm2d, F32S),
    "AdaLayerNorm": st.builds(ops.AdaLayerNorm, st.sampled_from(ops.AdaNormKind), F32S),
    "GatedResidual": st.just(ops.GatedResidual()),
    "RngNormal": st.builds(ops.RngNormal, F32S, F32S, USIZES.filter(lambda v: v < 2**64), st.none() | F32S),
    "RngUniform": st.builds(ops.RngUniform, F32S, F32S, USIZES.filter(lambda v: v < 2**64), st.none() | F32S),
    "Sample": st.builds(ops.Sample, USIZES, F32S, F32S, USIZES.filter(lambda v: v < 2**64)),
    "ScatterAdd": st.builds(ops.ScatterAdd, USIZES),
    "ScatterNd": st.builds(ops.ScatterNd, st.sampled_from(ops.ScatterNdReduction)),
    "ScatterElements": st.builds(ops.ScatterElements, I32S, st.sampled_from(ops.ScatterNdReduction)),
    "GatherNd": st.builds(ops.GatherNd, I32S),
    "GatherElements": st.builds(ops.GatherElements, I32S),
    "QMatMul": st.builds(ops.QMatMul, I32S, I32S, I32S, F32S),
    "QConv2d": st.builds(
        ops.QConv2d, vectors(USIZES), vectors(USIZES), vectors(USIZES), vectors(USIZES), USIZES, I32S, I32S, I32S, F32S
    ),
    "FakeQuantize": st.builds(
        ops.FakeQuantize, st.integers(0, 255), st.none() | USIZES, st.sampled_from(ops.SteKind),
        st.one_of(
            st.sampled_from([ops.ScaleMode(ops.ScaleModeKind.PER_BATCH), ops.ScaleMode(ops.ScaleModeKind.FIXED)]),
            st.floats(0, 1, width=32).map(lambda d: ops.ScaleMode(ops.ScaleModeKind.EMA, d)),
        ),
    ),
    "ConvTranspose2d": st.builds(
        ops.ConvTranspose2d, vectors(USIZES), vectors(USIZES), vectors(USIZES), vectors(USIZES), vectors(USIZES), USIZES
    ),
    "Conv3d": st.builds(ops.Conv3d, vectors(USIZES), vectors(USIZES), vectors(USIZES), USIZES),
    "ConvTranspose3d": st.builds(
        ops.ConvTranspose3d, vectors(USIZES), vectors(USIZES), vectors(USIZES), vectors(USIZES), USIZES
    ),
    "FusedConvBiasAct": st.builds(
        ops.FusedConvBiasAct, vectors(USIZES), vectors(USIZES), vectors(USIZES), vectors(USIZES), USIZES,
        st.none() | ACTIVATIONS, BOOLS,
    ),
    "ResizeNearest2x": st.just(ops.ResizeNearest2x()),
    "Interpolate3d": st.builds(ops.Interpolate3d, vectors(USIZES)),
    "AxialRope2d": st.builds(ops.AxialRope2d, USIZES, USIZES, USIZES, USIZES, F32S, USIZES),
    "LogMel": st.just(ops.LogMel()),
}

U64S = st.one_of(st.integers(0, 40), st.just(2**64 - 1))
TRIPLES = st.lists(USIZES, min_size=3, max_size=3).map(tuple)
PAD_MODES = st.one_of(F32S.map(ops.PadMode.constant), st.sampled_from(
    [ops.PadMode(k) for k in ops.PadKind if k is not ops.PadKind.CONSTANT]))
CHAIN_OPERANDS = st.builds(ops.ChainOperand, st.sampled_from(ops.ChainSource), USIZES)
CHAIN_STEPS = st.one_of(
    st.builds(lambda a, o: ops.ChainStep("Activation", a, (o,)), ACTIVATIONS, CHAIN_OPERANDS),
    st.builds(lambda d, o: ops.ChainStep("Cast", d, (o,)), DTYPES, CHAIN_OPERANDS),
    st.builds(lambda b, o, p: ops.ChainStep("Binary", b, (o, p)), st.sampled_from(BinaryOp), CHAIN_OPERANDS, CHAIN_OPERANDS),
    st.builds(lambda c, o, p: ops.ChainStep("Compare", c, (o, p)), st.sampled_from(CmpOp), CHAIN_OPERANDS, CHAIN_OPERANDS),
    st.builds(lambda o, p, q: ops.ChainStep("Where", None, (o, p, q)), CHAIN_OPERANDS, CHAIN_OPERANDS, CHAIN_OPERANDS),
)
RNN_FIELDS = (USIZES, USIZES, BOOLS, BOOLS)

#: Strategies of the ops the newest upstream JSON added (sub-graph ops are tested on their own).
NEWER_OP_STRATEGIES: dict[str, st.SearchStrategy[Op]] = {
    "StopGradient": st.just(ops.StopGradient()),
    "Fma": st.just(ops.Fma()),
    "Clamp": st.builds(ops.Clamp, F32S, F32S),
    "Pad": st.builds(ops.Pad, vectors(st.tuples(USIZES, USIZES)), PAD_MODES),
    "Slice": st.builds(ops.Slice, USIZES, USIZES, USIZES, I64S),
    "Tile": st.builds(ops.Tile, vectors(USIZES)),
    "Trilu": st.builds(ops.Trilu, BOOLS, I64S),
    "Reverse": st.builds(ops.Reverse, vectors(USIZES)),
    "CumProd": st.builds(ops.CumProd, I32S, BOOLS),
    "CumMax": st.builds(ops.CumMax, I32S, BOOLS),
    "ArgMax": st.builds(ops.ArgMax, USIZES, BOOLS),
    "ArgMin": st.builds(ops.ArgMin, USIZES, BOOLS),
    "Sort": st.builds(ops.Sort, USIZES, BOOLS),
    "ArgSort": st.builds(ops.ArgSort, USIZES, BOOLS),
    "DotGeneral": st.builds(ops.DotGeneral, vectors(USIZES), vectors(USIZES), vectors(USIZES), vectors(USIZES)),
    "ConvTranspose2d": st.builds(ops.ConvTranspose2d, *(vectors(USIZES),) * 5, USIZES),
    "Conv3d": st.builds(ops.Conv3d, TRIPLES, TRIPLES, TRIPLES, USIZES),
    "ConvTranspose3d": st.builds(ops.ConvTranspose3d, TRIPLES, TRIPLES, TRIPLES, TRIPLES, USIZES),
    "FusedConvBiasAct": st.builds(
        ops.FusedConvBiasAct, *(vectors(USIZES),) * 4, USIZES, st.none() | ACTIVATIONS, BOOLS
    ),
    "ResizeNearest2x": st.just(ops.ResizeNearest2x()),
    "Interpolate3d": st.builds(ops.Interpolate3d, vectors(USIZES)),
    "AxialRope2d": st.builds(ops.AxialRope2d, USIZES, USIZES, USIZES, USIZES, F32S, USIZES),
    "LogMel": st.just(ops.LogMel()),
    "GroupedMatMul": st.just(ops.GroupedMatMul()),
    "DequantGroupedMatMul": st.builds(ops.DequantGroupedMatMul, SCHEMES),
    "DequantMoEWeights": st.builds(ops.DequantMoEWeights, SCHEMES),
    "GatedDeltaNet": st.builds(ops.GatedDeltaNet, USIZES, BOOLS, BOOLS),
    "SelectiveScan": st.builds(ops.SelectiveScan, USIZES),
    "Mamba2": st.builds(ops.Mamba2, USIZES, USIZES),
    "Lstm": st.builds(ops.Lstm, *RNN_FIELDS),
    "Gru": st.builds(ops.Gru, *RNN_FIELDS),
    "Rnn": st.builds(ops.Rnn, *RNN_FIELDS, BOOLS),
    "ElementwiseRegion": st.builds(
        ops.ElementwiseRegion, vectors(CHAIN_STEPS), st.integers(1, 3), U32S, vectors(USIZES),
        st.sampled_from(ops.RegionPrologue), USIZES,
    ),
    "BatchElementwiseRegion": st.builds(
        ops.BatchElementwiseRegion, vectors(CHAIN_STEPS), st.integers(1, 3), U32S, vectors(USIZES),
        st.sampled_from(ops.RegionPrologue), U32S,
    ),
    "RngNormal": st.builds(ops.RngNormal, F32S, F32S, U64S, st.none() | F32S),
    "RngUniform": st.builds(ops.RngUniform, F32S, F32S, U64S, st.none() | F32S),
    "Sample": st.builds(ops.Sample, USIZES, F32S, F32S, U64S),
    "KvAppend": st.builds(ops.KvAppend, USIZES, USIZES),
    "Roll": st.builds(ops.Roll, vectors(I64S), vectors(USIZES)),
}
U8S = st.integers(0, 255)
SCALED_FORMATS = st.sampled_from(ops.ScaledFormat)
SCALE_LAYOUTS = st.one_of(st.just(ops.ScaleLayout(ops.ScaleKind.PER_TENSOR)), st.builds(
    ops.ScaleLayout, st.sampled_from([ops.ScaleKind.BLOCK_MX_E8M0, ops.ScaleKind.NVFP4]), U32S))
#: The kinds upstream part 3 added (losses, codebook, scaled codes, signal, regions).
PART3_OP_STRATEGIES: dict[str, st.SearchStrategy[Op]] = {
    "ReluBackward": st.just(ops.ReluBackward()),
    "ActivationBackward": st.builds(ops.ActivationBackward, ACTIVATIONS),
    "CumsumBackward": st.builds(ops.CumsumBackward, I32S, BOOLS),
    "GatherBackward": st.builds(ops.GatherBackward, I32S),
    "RopeBackward": st.builds(ops.RopeBackward, USIZES, USIZES),
    "SoftmaxCrossEntropy": st.just(ops.SoftmaxCrossEntropy()),
    "SoftmaxCrossEntropyWithLogits": st.just(ops.SoftmaxCrossEntropyWithLogits()),
    "FakeQuantizeLSQ": st.builds(ops.FakeQuantizeLSQ, U8S, st.none() | USIZES),
    "SynthMatMul": st.builds(ops.SynthMatMul, st.builds(ops.SynthKind, U32S, U32S)),
    "SynthReconstruct": st.builds(ops.SynthReconstruct, st.builds(ops.SynthKind, U32S, U32S)),
    "FusedMatMulResidual": st.just(ops.FusedMatMulResidual()),
    "ScaledDequantize": st.builds(ops.ScaledDequantize, SCALED_FORMATS, SCALE_LAYOUTS),
    "ScaledMatMul": st.builds(ops.ScaledMatMul, SCALED_FORMATS, SCALED_FORMATS, SCALE_LAYOUTS, BOOLS),
    "ScaledGroupedMatMul": st.builds(ops.ScaledGroupedMatMul, SCALED_FORMATS, SCALED_FORMATS, SCALE_LAYOUTS, BOOLS),
    "DequantGroupedMatMulMlx": st.builds(ops.DequantGroupedMatMulMlx, SCHEMES),
    "Histogram": st.builds(ops.Histogram, USIZES, F32S, F32S),
    "SplineActivation": st.builds(ops.SplineActivation, U32S, F32S, F32S),
    "Im2Col": st.builds(ops.Im2Col, vectors(USIZES), vectors(USIZES), vectors(USIZES), vectors(USIZES)),
    "PartitionedConv": st.builds(ops.PartitionedConv, USIZES),
    "Fft": st.builds(ops.Fft, BOOLS, st.sampled_from(ops.FftNorm)),
    "FftButterflyStage": st.builds(ops.FftButterflyStage, U32S, U32S),
    "ComplexNormSq": st.just(ops.ComplexNormSq()),
    "Conjugate": st.just(ops.Conjugate()),
    "WelchPeaks": st.builds(ops.WelchPeaks, USIZES, USIZES),
    "TransformRegion": st.builds(ops.TransformRegion, vectors(st.builds(
        ops.ChainOperand, st.sampled_from(ops.ChainSource), USIZES)), st.integers(1, 3)),
}
NEWER_OP_STRATEGIES.update(PART3_OP_STRATEGIES)
OP_STRATEGIES.update(NEWER_OP_STRATEGIES)
#: Ops holding sub-graphs; their round trip has its own test.
SUBGRAPH_OPS = {"If", "While", "Scan", "CustomFn"}
# Constant needs its shape first; see node_steps.
ALL_OP_NAMES = sorted(set(OP_TYPES) - SUBGRAPH_OPS)

DIMS = st.one_of(st.integers(0, 5).map(Static), U32S.map(Dynamic))
# C64 tensors are read as interleaved F32 pairs (tests/lower/test_complex_graphs.py), so a graph
# declaring them does not read back as itself.
REAL_DTYPES = DTYPES.filter(lambda d: d is not DType.C64)
SHAPES = st.builds(Shape, st.lists(DIMS, max_size=4).map(tuple), REAL_DTYPES)
STATIC_SHAPES = st.builds(Shape, st.lists(st.integers(0, 4).map(Static), max_size=3).map(tuple), REAL_DTYPES)
NAMES = st.none() | TEXTS
ORIGINS = st.none() | st.builds(NodeOrigin, st.none() | U32S, st.none() | TEXTS, st.none() | TEXTS)


@dataclass(frozen=True)
class NodeStep:
    op: Op
    inputs: tuple[int, ...]
    shape: Shape
    name: str | None
    origin: NodeOrigin | None


@dataclass(frozen=True)
class GraphRecipe:
    name: str
    steps: tuple[NodeStep, ...]
    outputs: tuple[int, ...]

    def build(self) -> Graph:
        graph = Graph(self.name)
        for step in self.steps:
            graph.add_node(step.op, step.inputs, step.shape, name=step.name, origin=step.origin)
        graph.set_outputs(self.outputs)
        return graph


def draw_step(draw: st.DrawFn, type_name: str, existing: int) -> NodeStep:
    if type_name == "Constant":
        shape = draw(STATIC_SHAPES)
        size = shape.numel() * shape.dtype.itemsize
        op: Op = ops.Constant(draw(st.binary(min_size=size, max_size=size)))
    else:
        op = draw(OP_STRATEGIES[type_name])
        shape = draw(SHAPES)
    accepted = op.accepted_arities()
    arity = draw(st.sampled_from(accepted)) if accepted else draw(st.integers(1, 3))
    inputs = tuple(draw(st.lists(st.integers(0, existing - 1), min_size=arity, max_size=arity))) if arity else ()
    return NodeStep(op, inputs, shape, draw(NAMES), draw(ORIGINS))


@st.composite
def graph_recipes(draw: st.DrawFn, focus: str | None = None) -> GraphRecipe:
    leaves = ["Input", "Param", "Constant"]
    steps = [draw_step(draw, draw(st.sampled_from(leaves)), 0) for _ in range(draw(st.integers(1, 3)))]
    for _ in range(draw(st.integers(1 if focus else 0, 4))):
        type_name = focus if focus is not None else draw(st.sampled_from(ALL_OP_NAMES))
        steps.append(draw_step(draw, type_name, len(steps)))
    outputs = draw(st.lists(st.integers(0, len(steps) - 1), max_size=4))
    return GraphRecipe(draw(TEXTS), tuple(steps), tuple(outputs))


def assert_round_trips(graph: Graph) -> None:
    text = graph_to_json(graph)
    loaded = graph_from_json(text)
    assert signature(loaded) == signature(graph)
    assert graph_to_json(loaded) == text
    pretty = graph_to_json(graph, indent=2)
    assert signature(graph_from_json(pretty)) == signature(graph)
    assert graph_to_json(graph_from_json(pretty), indent=2) == pretty
    assert json.loads(pretty, parse_float=str) == json.loads(text, parse_float=str)
    assert_serde_layout(json.loads(text, parse_float=str), graph)


def assert_serde_layout(document: dict[str, Any], graph: Graph) -> None:
    """Check the derive(Serialize) layout independently of the codec's own tables."""
    assert list(document) == ["name", "nodes", "outputs"]
    for raw, node in zip(document["nodes"], graph.nodes, strict=True):
        assert list(raw) == ["id", "op", "inputs", "shape", "name", "origin"]
        assert list(raw["shape"]) == ["dims", "dtype"]
        if raw["origin"] is not None:
            assert list(raw["origin"]) == ["hir", "label", "pass"]
        op_fields = [f.name for f in fields(node.op)]
        raw_op = raw["op"]
        if not op_fields or isinstance(raw_op, str):
            # A unit variant, or an op 0.2.2 spelled bare (ScatterAdd at axis 0).
            assert raw_op == node.op.type_name
            assert not op_fields or (isinstance(node.op, ops.ScatterAdd) and node.op.axis == 0)
            continue
        assert list(raw_op) == [node.op.type_name]
        content = raw_op[node.op.type_name]
        if isinstance(node.op, (ops.Activation, ops.Binary, ops.Compare)):
            assert content == getattr(node.op, op_fields[0]).value
            continue
        order = list(getattr(type(node.op), "SERDE_ORDER", op_fields))
        # The 0.2.2 form leaves out the fields the newest upstream added (at their 0.2.2 value).
        left_out = [f.name for f in fields(node.op) if f.name not in content]
        assert all(f.metadata.get("newest") and getattr(node.op, f.name) == f.default
                   for f in fields(node.op) if f.name in left_out)
        assert list(content) == [name for name in order if name not in left_out]
        for field_name in list(content):
            value = getattr(node.op, field_name)
            if isinstance(value, float):
                assert isinstance(content[field_name], str)
                assert f32(float(content[field_name])) == value
            elif isinstance(value, bytes):
                assert content[field_name] == list(value)


@given(graph_recipes())
def test_random_graphs_round_trip_exactly(recipe: GraphRecipe) -> None:
    with trusting_inference():
        assert_round_trips(recipe.build())


@pytest.mark.parametrize("type_name", ALL_OP_NAMES)
@given(data=st.data())
def test_every_op_type_round_trips_with_random_attributes(type_name: str, data: st.DataObject) -> None:
    recipe = data.draw(graph_recipes(focus=type_name))
    with trusting_inference():
        graph = recipe.build()
        assert any(n.op.type_name == type_name for n in graph.nodes)
        assert_round_trips(graph)


def test_op_strategies_cover_every_op_type() -> None:
    assert set(OP_STRATEGIES) | {"Constant"} | SUBGRAPH_OPS == set(OP_TYPES)


def test_json_op_table_matches_the_op_dataclasses() -> None:
    assert set(OP_FORMS) == set(OP_TYPES)
    for name, form in OP_FORMS.items():
        assert form.op_type is OP_TYPES[name]
        # serde writes struct fields in declaration order, so the order is part of the format
        # (Attention keeps v_head_dim last as a dataclass, third in upstream's declaration).
        order = list(getattr(form.op_type, "SERDE_ORDER", [f.name for f in fields(form.op_type)]))
        assert [field_name for field_name, _ in form.fields] == order, name
    assert OP_FORMS["Attention"].form == "struct"
    assert {name for name, form in OP_FORMS.items() if form.form == "unit"} == {
        "MatMul", "Where", "StopGradient", "Fma", "ResizeNearest2x", "GatedResidual", "LogMel", "GroupedMatMul",
        "ReluBackward", "SoftmaxCrossEntropy", "SoftmaxCrossEntropyWithLogits", "FusedMatMulResidual",
        "ComplexNormSq", "Conjugate",
    }
    assert {name for name, form in OP_FORMS.items() if form.form == "newtype"} == {"Activation", "Binary", "Compare"}


def test_huge_but_valid_integers_round_trip_with_raised_limits() -> None:
    with trusting_inference():
        graph = Graph("big")
        graph.add_node(ops.Input("x"), [], Shape((Static(2**64 - 1),), DType.F32), name="x")
        graph.add_node(
            ops.Narrow(2**64 - 1, 0, 2**64 - 1), [0], Shape((Dynamic(2**32 - 1),), DType.F32),
            origin=NodeOrigin(hir=2**32 - 1),
        )
        graph.set_outputs([1])
        text = graph_to_json(graph)
        assert '{"Static":18446744073709551615}' in text
        with pytest.raises(GraphFormatError, match="more than 1099511627776 elements"):
            graph_from_json(text)
        loaded = graph_from_json(text, limits=JsonLimits(max_numel=2**64))
        assert signature(loaded) == signature(graph)


# ============================================================================ targeted errors

Mutation = Callable[[dict[str, Any]], None]


def mutated(base: Callable[[], dict[str, Any]], mutate: Mutation) -> str:
    doc = base()
    mutate(doc)
    return json.dumps(doc)


def setter(path: Sequence[str | int], value: object) -> Mutation:
    def apply(doc: dict[str, Any]) -> None:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return apply


def deleter(path: Sequence[str | int]) -> Mutation:
    def apply(doc: dict[str, Any]) -> None:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return apply


ATTN = ("nodes", 3, "op", "Attention")

ERROR_CASES: list[tuple[str, Callable[[], dict[str, Any]], Mutation, str]] = [
    ("num_heads as string", with_attention_doc, setter((*ATTN, "num_heads"), "4"),
     'nodes[3].op.Attention.num_heads: expected a non-negative integer, got "4"'),
    ("missing head_dim", with_attention_doc, deleter((*ATTN, "head_dim")),
     'nodes[3].op.Attention: missing required field "head_dim"'),
    ("missing mask_kind", with_attention_doc, deleter((*ATTN, "mask_kind")),
     'nodes[3].op.Attention: missing required field "mask_kind"'),
    ("bool as int", with_attention_doc, setter((*ATTN, "head_dim"), True),
     "nodes[3].op.Attention.head_dim: expected a non-negative integer, got true"),
    ("float as int", with_attention_doc, setter((*ATTN, "num_heads"), 2.0),
     "nodes[3].op.Attention.num_heads: expected a non-negative integer, got 2.0"),
    ("negative usize", with_attention_doc, setter((*ATTN, "num_heads"), -2),
     "nodes[3].op.Attention.num_heads: expected a non-negative integer, got -2"),
    ("usize overflow", with_attention_doc, setter((*ATTN, "num_heads"), 2**64),
     "nodes[3].op.Attention.num_heads: integer 18446744073709551616 does not fit in usize"),
    ("huge integer", with_attention_doc, setter((*ATTN, "num_heads"), 10**200),
     "nodes[3].op.Attention.num_heads: integer with 201 digits does not fit in usize"),
    ("null score_scale is fine but string is not", with_attention_doc, setter((*ATTN, "score_scale"), "0.5"),
     'nodes[3].op.Attention.score_scale: expected a number, got "0.5"'),
    ("softcap beyond f32", with_attention_doc, setter((*ATTN, "attn_logit_softcap"), 1e39),
     "nodes[3].op.Attention.attn_logit_softcap: number 1e+39 is out of the f32 range"),
    ("null eps", with_attention_doc, setter(("nodes", 4, "op", "LayerNorm", "eps"), None),
     "nodes[4].op.LayerNorm.eps: expected a number, got null (only optional fields may be null)"),
    ("eps as bool", with_attention_doc, setter(("nodes", 4, "op", "LayerNorm", "eps"), False),
     "nodes[4].op.LayerNorm.eps: expected a number, got false"),
    ("axis beyond i32", with_attention_doc, setter(("nodes", 4, "op", "LayerNorm", "axis"), 2**31),
     "nodes[4].op.LayerNorm.axis: integer 2147483648 does not fit in i32"),
    ("mask kind lower case", with_attention_doc, setter((*ATTN, "mask_kind"), "causal"),
     'nodes[3].op.Attention.mask_kind: unknown MaskKind variant "causal" (names are case-sensitive; did you mean "Causal"?)'),
    ("sliding window without size", with_attention_doc, setter((*ATTN, "mask_kind"), "SlidingWindow"),
     'nodes[3].op.Attention.mask_kind: SlidingWindow needs its window: {"SlidingWindow": n}'),
    ("negative sliding window", with_attention_doc, setter((*ATTN, "mask_kind"), {"SlidingWindow": -1}),
     "nodes[3].op.Attention.mask_kind.SlidingWindow: expected a non-negative integer, got -1"),
    ("unit mask with value", with_attention_doc, setter((*ATTN, "mask_kind"), {"Causal": 3}),
     "nodes[3].op.Attention.mask_kind.Causal: MaskKind Causal takes no value, got 3"),
    ("origin hir as string", with_attention_doc, setter(("nodes", 3, "origin", "hir"), "7"),
     'nodes[3].origin.hir: expected a non-negative integer, got "7"'),
    ("origin not an object", with_attention_doc, setter(("nodes", 3, "origin"), []),
     "nodes[3].origin: expected an object, got an array of 0 items"),
    ("unknown op case", tiny_doc, setter(("nodes", 3, "op"), "Matmul"),
     'nodes[3].op: unknown or unsupported op variant "Matmul" (names are case-sensitive; did you mean "MatMul"?)'),
    ("unknown op", tiny_doc, setter(("nodes", 3, "op"), {"Frobnicate": {}}),
     'nodes[3].op: unknown or unsupported op variant "Frobnicate"'),
    ("unit op with attributes", tiny_doc, setter(("nodes", 3, "op"), {"MatMul": {"x": 1}}),
     'nodes[3].op.MatMul: MatMul takes no attributes, got an object with keys {"x"}'),
    ("struct op as string", tiny_doc, setter(("nodes", 0, "op"), "Input"),
     'nodes[0].op: Input needs its attributes: {"Input": ...}'),
    ("two-key op", tiny_doc, setter(("nodes", 3, "op"), {"MatMul": None, "Where": None}),
     "nodes[3].op: expected an op as a string or an object with exactly one key"),
    ("unknown activation", tiny_doc, setter(("nodes", 5, "op"), {"Activation": "gelu"}),
     'nodes[5].op.Activation: unknown Activation variant "gelu" (names are case-sensitive; did you mean "Gelu"?)'),
    ("unknown binary op", tiny_doc, setter(("nodes", 4, "op"), {"Binary": "Plus"}),
     'nodes[4].op.Binary: unknown BinaryOp variant "Plus"'),
    ("dtype alias", tiny_doc, setter(("nodes", 0, "shape", "dtype"), "f32"),
     'nodes[0].shape.dtype: unknown DType variant "f32" (names are case-sensitive; did you mean "F32"?)'),
    ("bare int dim", tiny_doc, setter(("nodes", 0, "shape", "dims", 0), 4),
     'nodes[0].shape.dims[0]: expected a dim ({"Static": n} or {"Dynamic": symbol}) as a string or an object'),
    ("unknown dim variant", tiny_doc, setter(("nodes", 0, "shape", "dims", 0), {"Fixed": 4}),
     'nodes[0].shape.dims[0]: unknown Dim variant "Fixed"'),
    ("float dim", tiny_doc, setter(("nodes", 0, "shape", "dims", 0), {"Static": 4.0}),
     "nodes[0].shape.dims[0].Static: expected a non-negative integer, got 4.0"),
    ("negative dim", tiny_doc, setter(("nodes", 0, "shape", "dims", 0), {"Static": -1}),
     "nodes[0].shape.dims[0].Static: expected a non-negative integer, got -1"),
    ("dim beyond u64", tiny_doc, setter(("nodes", 0, "shape", "dims", 0), {"Static": 2**64}),
     "nodes[0].shape.dims[0].Static: integer 18446744073709551616 does not fit in usize"),
    ("dynamic beyond u32", tiny_doc, setter(("nodes", 0, "shape", "dims", 0), {"Dynamic": 2**32}),
     "nodes[0].shape.dims[0].Dynamic: integer 4294967296 does not fit in u32"),
    ("numel above the cap", tiny_doc, setter(("nodes", 0, "shape", "dims"), [{"Static": 2**21}, {"Static": 2**20}]),
     "nodes[0].shape.dims: shape has more than 1099511627776 elements (the configured limit)"),
    ("missing shape", tiny_doc, deleter(("nodes", 1, "shape")),
     'nodes[1]: missing required field "shape"'),
    ("missing dtype", tiny_doc, deleter(("nodes", 1, "shape", "dtype")),
     'nodes[1].shape: missing required field "dtype"'),
    ("missing outputs", tiny_doc, deleter(("outputs",)),
     'graph: missing required field "outputs"'),
    ("missing node list", tiny_doc, deleter(("nodes",)),
     'graph: missing required field "nodes"'),
    ("name not a string", tiny_doc, setter(("name",), 3),
     "name: expected a string, got 3"),
    ("nodes not a list", tiny_doc, setter(("nodes",), {}),
     "nodes: expected an array, got an empty object"),
    ("node not an object", tiny_doc, setter(("nodes", 2), "x"),
     'nodes[2]: expected an object, got "x"'),
    ("dangling input", tiny_doc, setter(("nodes", 3, "inputs"), [0, 9]),
     "nodes[3].inputs[1]: node 9 is not defined before node 3 (inputs must name earlier nodes;"
     " forward references and cycles are not allowed)"),
    ("self reference", tiny_doc, setter(("nodes", 3, "inputs"), [3, 1]),
     "nodes[3].inputs[0]: node 3 is not defined before node 3"),
    ("forward reference", tiny_doc, setter(("nodes", 3, "inputs"), [0, 4]),
     "nodes[3].inputs[1]: node 4 is not defined before node 3"),
    ("negative input", tiny_doc, setter(("nodes", 3, "inputs"), [0, -1]),
     "nodes[3].inputs[1]: expected a non-negative integer, got -1"),
    ("id mismatch", tiny_doc, setter(("nodes", 1, "id"), 5),
     "nodes[1].id: node id 5 differs from its position 1 in nodes"),
    ("id as bool", tiny_doc, setter(("nodes", 0, "id"), False),
     "nodes[0].id: expected a non-negative integer, got false"),
    ("missing output node", tiny_doc, setter(("outputs",), [5, 99]),
     "outputs[1]: node 99 does not exist (the graph has 6 nodes)"),
    ("short constant payload", tiny_doc, setter(("nodes", 2, "op", "Constant", "data"), [0, 0, 192]),
     "nodes[2].op.Constant.data: payload has 3 bytes but shape F32[1] needs 4 (1 elements x 4 bytes)"),
    ("byte out of range", tiny_doc, setter(("nodes", 2, "op", "Constant", "data"), [0, 0, 256, 63]),
     "nodes[2].op.Constant.data[2]: expected a byte value 0..255, got 256"),
    ("negative byte", tiny_doc, setter(("nodes", 2, "op", "Constant", "data"), [0, -1, 1, 63]),
     "nodes[2].op.Constant.data[1]: expected a byte value 0..255, got -1"),
    ("bool byte", tiny_doc, setter(("nodes", 2, "op", "Constant", "data"), [0, 0, True, 63]),
     "nodes[2].op.Constant.data[2]: expected a byte value 0..255, got true"),
    ("dynamic constant", tiny_doc, setter(("nodes", 2, "shape", "dims"), [{"Dynamic": 0}]),
     "nodes[2].op.Constant: a Constant needs a static shape to size its payload, got F32[?0]"),
    ("constant without data", tiny_doc, setter(("nodes", 2, "op"), {"Constant": {}}),
     'nodes[2].op.Constant: missing required field "data"'),
    ("name as number", tiny_doc, setter(("nodes", 0, "name"), 1),
     "nodes[0].name: expected a string, got 1"),
    ("input name missing", tiny_doc, setter(("nodes", 0, "op"), {"Input": {}}),
     'nodes[0].op.Input: missing required field "name"'),
]


@pytest.mark.parametrize(
    ("base", "mutate", "message"),
    [pytest.param(base, mutate, message, id=case_id) for case_id, base, mutate, message in ERROR_CASES],
)
def test_malformed_documents_name_the_path_at_fault(
    base: Callable[[], dict[str, Any]], mutate: Mutation, message: str
) -> None:
    with trusting_inference(), pytest.raises(GraphFormatError) as info:
        graph_from_json(mutated(base, mutate))
    assert message in str(info.value)


def test_error_documents_are_valid_before_mutation() -> None:
    assert len(graph_from_json(json.dumps(tiny_doc()))) == 6
    with trusting_inference():
        assert len(graph_from_json(json.dumps(with_attention_doc()))) == 5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "invalid JSON: Expecting value at line 1 column 1"),
        ("   ", "invalid JSON: Expecting value"),
        ("{", "invalid JSON"),
        ('{"name": "g", "nodes": [], "outputs": []} x', "invalid JSON: Extra data"),
        ("[]", "graph: expected a JSON object at the top level, got an array of 0 items"),
        ("null", "graph: expected a JSON object at the top level, got null"),
        ('"graph"', 'graph: expected a JSON object at the top level, got "graph"'),
        ('{"name": "g", "nodes": [], "outputs": [], "name": "h"}', 'graph: duplicate key "name"'),
        ('{"name": NaN, "nodes": [], "outputs": []}', "NaN is not a JSON value"),
        ('{"name": "g", "nodes": [], "outputs": [Infinity]}', "Infinity is not a JSON value"),
        ('{"name": "g", "nodes": [], "outputs": [-Infinity]}', "-Infinity is not a JSON value"),
        ('{"name": "g\\ud800", "nodes": [], "outputs": []}', "name: string contains a lone surrogate"),
        ('{"name": "g", "nodes": [], "outputs": [' + "1" * 5000 + "]}", "invalid JSON: Exceeds the limit"),
        ("\ufeff" + '{"name": "g", "nodes": [], "outputs": []}', "invalid JSON: text starts with a byte-order mark"),
        ('{"name": "a\u0001b", "nodes": [], "outputs": []}', "invalid JSON: Invalid control character"),
    ],
)
def test_invalid_json_text_is_rejected(text: str, message: str) -> None:
    with pytest.raises(GraphFormatError) as info:
        graph_from_json(text)
    assert message in str(info.value)


@pytest.mark.parametrize("depth", [10_000, 200_000])
def test_deep_nesting_is_rejected_without_recursion_error(depth: int) -> None:
    with pytest.raises(GraphFormatError):
        graph_from_json("[" * depth + "]" * depth)
    nested_in_ignored_field = '{"name": "g", "nodes": [], "outputs": [], "extra": ' + "[" * depth + "]" * depth + "}"
    with pytest.raises(GraphFormatError, match="nesting is too deep"):
        graph_from_json(nested_in_ignored_field)


def test_non_utf8_and_non_text_input_are_rejected() -> None:
    with pytest.raises(GraphFormatError, match=r"not valid UTF-8 \(byte offset 10\)"):
        graph_from_json(b'{"name": "\xff", "nodes": [], "outputs": []}')
    with pytest.raises(GraphFormatError, match="expected JSON text as str or bytes, got int"):
        graph_from_json(123)  # type: ignore[arg-type]
    assert graph_from_json(b'{"name": "\xc3\xa9", "nodes": [], "outputs": []}').name == "\u00e9"


def test_text_length_is_checked_before_parsing() -> None:
    limits = JsonLimits(max_text_length=30)
    text = '{"name": "g", "nodes": [], "outputs": []}'
    with mock.patch.object(json.JSONDecoder, "decode", side_effect=AssertionError("parsed")), pytest.raises(
        GraphFormatError, match="more than the limit of 30"
    ):
        graph_from_json(text, limits=limits)
    with pytest.raises(GraphFormatError, match="more than the limit of 30"):
        graph_from_json(text.encode(), limits=limits)


def test_constant_byte_cap_applies_to_the_total_before_conversion() -> None:
    doc = tiny_doc()
    second = copy.deepcopy(doc["nodes"][2])
    second["id"] = 3
    doc["nodes"].insert(3, second)
    for index, node in enumerate(doc["nodes"]):
        node["id"] = index
        node["inputs"] = [i + 1 if i >= 3 else i for i in node["inputs"]]
    doc["outputs"] = [6]
    text = json.dumps(doc)
    assert len(graph_from_json(text)) == 7
    with pytest.raises(GraphFormatError, match=r"nodes\[3\]\.op\.Constant\.data: constant payloads would total more than 7 bytes"):
        graph_from_json(text, limits=JsonLimits(max_constant_bytes=7))
    # A declared size beyond the cap is refused from the shape alone, whatever the payload.
    doc = tiny_doc()
    doc["nodes"][2]["shape"]["dims"] = [{"Static": 2**30}, {"Static": 2**6}]
    with pytest.raises(GraphFormatError, match="constant payloads would total more than 2147483648 bytes"):
        graph_from_json(json.dumps(doc))


def test_optional_fields_may_be_omitted_and_unknown_fields_outside_ops_are_ignored() -> None:
    doc = with_attention_doc()
    for node in doc["nodes"]:
        del node["name"], node["origin"]
        node["comment"] = {"anything": [1, 2, {"x": None}]}
        node["shape"]["layout"] = "ignored"
    attn = doc["nodes"][3]["op"]["Attention"]
    del attn["score_scale"], attn["attn_logit_softcap"]
    doc["version"] = "0.2.2"
    with trusting_inference():
        graph = graph_from_json(json.dumps(doc))
    assert all(n.name is None and n.origin is None for n in graph.nodes)
    assert graph.nodes[3].op == ops.Attention(2, 4, MaskKind.CAUSAL, None, None)
    assert '"score_scale":null,"attn_logit_softcap":null' in graph_to_json(graph)


def test_unknown_op_fields_are_errors_naming_the_field() -> None:
    # serde ignores them, but a field rlx_mil does not know would be silently dropped.
    doc = with_attention_doc()
    doc["nodes"][3]["op"]["Attention"]["future_field"] = 1
    with pytest.raises(GraphFormatError, match=r'nodes\[3\]\.op\.Attention\.future_field: unknown field "future_field"'):
        graph_from_json(json.dumps(doc))


def test_origin_uses_the_upstream_pass_key() -> None:
    with trusting_inference():
        graph = graph_from_json(json.dumps(with_attention_doc()))
        assert graph.nodes[3].origin == NodeOrigin(hir=7, label="sdpa", pass_name="fusion")
        assert '"origin":{"hir":7,"label":"sdpa","pass":"fusion"}' in graph_to_json(graph)


def test_unit_variants_also_accept_serde_map_form() -> None:
    doc = with_attention_doc()
    doc["nodes"][3]["op"]["Attention"]["mask_kind"] = {"Causal": None}
    with trusting_inference():
        graph = graph_from_json(json.dumps(doc))
    assert isinstance(graph.nodes[3].op, ops.Attention)
    assert graph.nodes[3].op.mask_kind == MaskKind.CAUSAL


def quant_doc(scheme: object) -> str:
    return single_op_graph_text(json.dumps({"DequantMatMul": {"scheme": scheme}}), 4)


@pytest.mark.parametrize(
    ("scheme", "message"),
    [
        ({"Int8Block": {"block_size": 0}}, "scheme.Int8Block.block_size: block_size must be at least 1, got 0"),
        ({"Int8Block": {}}, 'scheme.Int8Block: missing required field "block_size"'),
        ("Int8Block", 'scheme: Int8Block needs its block size: {"Int8Block": {"block_size": n}}'),
        ({"Fp8E4m3": {"block_size": 3}}, 'scheme.Fp8E4m3: QuantScheme Fp8E4m3 takes no value, got an object'),
        ("Q4K", 'scheme: unknown QuantScheme variant "Q4K"'),
        ("gguFQ4K", 'did you mean "GgufQ4K"?'),
    ],
)
def test_bad_quant_schemes_are_rejected(scheme: object, message: str) -> None:
    with trusting_inference(), pytest.raises(GraphFormatError) as info:
        graph_from_json(quant_doc(scheme))
    assert "nodes[4].op.DequantMatMul." in str(info.value)
    assert message in str(info.value)


def test_ir_violations_surface_as_graph_format_errors_chained_to_the_graph_error() -> None:
    doc = tiny_doc()
    doc["nodes"][3]["inputs"] = [0]  # MatMul with one input
    with pytest.raises(GraphFormatError) as info:
        graph_from_json(json.dumps(doc))
    assert isinstance(info.value.__cause__, ArityError)
    assert str(info.value).startswith("nodes[3]: node %3 (MatMul): ")
    assert "got 1" in str(info.value)


def test_declared_shape_disagreeing_with_inference_is_rejected() -> None:
    x, w = Shape.of([1, 4, 8]), Shape.of([8, 8])
    if infer_module.infer_shape(ops.MatMul(), [x, w], declared=None) is None:
        pytest.skip("no MatMul shape rule registered yet")
    doc = tiny_doc()
    doc["nodes"][3]["shape"]["dims"] = [{"Static": 1}, {"Static": 4}, {"Static": 9}]
    with pytest.raises(GraphFormatError) as info:
        graph_from_json(json.dumps(doc))
    assert isinstance(info.value.__cause__, ShapeError)
    assert str(info.value).startswith("nodes[3]: node %3 (MatMul): ")
    assert "F32[1, 4, 9]" in str(info.value)


# ============================================================================ writing


def test_writing_rejects_values_upstream_cannot_represent() -> None:
    with trusting_inference():
        graph = Graph("g")
        x = graph.add_node(ops.Input("x"), [], Shape.of([2]))
        graph.add_node(ops.LayerNorm(-1, math.nan), [x, x, x], Shape.of([2]))
        with pytest.raises(GraphFormatError, match=r"nodes\[1\]\.op\.LayerNorm\.eps: cannot write non-finite float nan"):
            graph_to_json(graph)

        graph = Graph("g")
        graph.add_node(ops.Constant(b"\x00\x00"), [], Shape.of([1]))
        with pytest.raises(GraphFormatError, match=r"nodes\[0\]\.op\.Constant\.data: payload has 2 bytes"):
            graph_to_json(graph)

        graph = Graph("g")
        x = graph.add_node(ops.Input("x"), [], Shape.of([2]))
        graph.add_node(ops.Narrow(-1, 0, 1), [x], Shape.of([2]))
        with pytest.raises(GraphFormatError, match=r"nodes\[1\]\.op\.Narrow\.axis: expected a non-negative integer"):
            graph_to_json(graph)

        graph = Graph("g")
        graph.add_node(ops.Input("x"), [], Shape.of([2]), name="bad\ud800")
        with pytest.raises(GraphFormatError, match=r"nodes\[0\]\.name: string contains a lone surrogate"):
            graph_to_json(graph)


def test_writing_accepts_numpy_integers_and_escapes_like_serde() -> None:
    with trusting_inference():
        graph = Graph('quote"back\\slash\nctrl\x01 \u00e9 \U0001f600')
        x = graph.add_node(ops.Input("x"), [], Shape.of([4]))
        graph.add_node(ops.Narrow(np.int64(0), np.uint8(1), np.int32(2)), [x], Shape.of([2]))
        graph.set_outputs([1])
        text = graph_to_json(graph)
    assert text.startswith('{"name":"quote\\"back\\\\slash\\nctrl\\u0001 \u00e9 \U0001f600"')
    assert '{"Narrow":{"axis":0,"start":1,"len":2}}' in text


def test_file_round_trip_and_errors_name_the_file(tmp_path: Path) -> None:
    graph = Graph.from_json(TINY_TEXT)
    path = tmp_path / "tiny.json"
    graph.to_json_file(path)
    assert path.read_bytes() == (TINY_TEXT + "\n").encode()
    assert signature(Graph.from_json_file(path)) == signature(graph)

    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"name": 1}')
    with pytest.raises(GraphFormatError, match=re.escape(f"{bad}: name: expected a string, got 1")):
        graph_from_json_file(bad)
    with pytest.raises(GraphFormatError, match="file has 11 bytes, more than the limit of 5"):
        graph_from_json_file(bad, limits=JsonLimits(max_text_length=5))
    with pytest.raises(FileNotFoundError):
        graph_from_json_file(tmp_path / "missing.json")


def test_indent_argument_is_validated() -> None:
    graph = Graph.from_json(TINY_TEXT)
    with pytest.raises(ValueError, match="indent"):
        graph_to_json(graph, indent=-1)
    assert graph_to_json(graph, indent=4).startswith('{\n    "name": "tiny",\n    "nodes": [\n        {\n')


# ============================================================================ fuzzing

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.sampled_from(
        ["Static", "Dynamic", "F32", "Bool", "MatMul", "Where", "Causal", "SlidingWindow", "Int8Block",
         "GgufQ4K", "Gelu", "Add", "Input", "Attention", "Constant"]
    ),
)
KEYS = st.one_of(
    st.sampled_from(["name", "nodes", "outputs", "id", "op", "inputs", "shape", "dims", "dtype", "origin",
                     "Static", "Dynamic", "Input", "Attention", "data", "num_heads", "mask_kind", "eps"]),
    st.text(max_size=4),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(KEYS, children, max_size=3)),
    max_leaves=6,
)


def fuzz_documents() -> list[Any]:
    docs: list[Any] = [pytest.param(tiny_doc, id="tiny"), pytest.param(with_attention_doc, id="attention")]
    for path in FIXTURE_PATHS:
        text = path.read_text(encoding="utf-8")
        docs.append(pytest.param(lambda text=text: json.loads(text), id=path.name))
    return docs


def container_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of every entry inside a container (the container itself is the prefix)."""
    found: list[tuple[Any, ...]] = []
    if isinstance(value, dict):
        items: Iterator[tuple[Any, Any]] = iter(value.items())
    elif isinstance(value, list):
        items = iter(enumerate(value))
    else:
        return found
    for key, item in items:
        found.append((*prefix, key))
        found.extend(container_paths(item, (*prefix, key)))
    return found


def resolve(doc: Any, path: tuple[Any, ...]) -> tuple[Any, Any]:
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    return parent, path[-1]


ALLOWED_CAUSES = (GraphError, GraphFormatError, json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError)


def assert_loads_or_rejects(text: str | bytes) -> None:
    """Loading either succeeds (then round-trips) or raises GraphFormatError, nothing else."""
    try:
        graph = graph_from_json(text)
    except GraphFormatError as err:
        cause = err.__cause__
        assert cause is None or isinstance(cause, ALLOWED_CAUSES), f"unexpected cause {cause!r}: {err}"
        # The loader wraps any non-GraphError raised by IR validation; that is a rule defect.
        assert "validation failed:" not in str(err), f"IR validation raised an untyped error: {err}"
        return
    again = graph_to_json(graph)
    assert graph_to_json(graph_from_json(again)) == again


MUTATIONS = ["delete", "replace", "swap", "duplicate", "wrap", "rename"]


@pytest.mark.parametrize("make_doc", fuzz_documents())
@given(data=st.data())
def test_structural_mutations_only_raise_graph_format_error(make_doc: Callable[[], Any], data: st.DataObject) -> None:
    doc = make_doc()
    for _ in range(data.draw(st.integers(1, 3))):
        paths = container_paths(doc)
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent, key = resolve(doc, path)
        mutation = data.draw(st.sampled_from(MUTATIONS))
        if mutation == "delete":
            del parent[key]
        elif mutation == "replace":
            parent[key] = data.draw(JSON_VALUES)
        elif mutation == "swap":
            other_parent, other_key = resolve(doc, data.draw(st.sampled_from(paths)))
            try:
                parent[key], other_parent[other_key] = copy.deepcopy(other_parent[other_key]), copy.deepcopy(parent[key])
            except (KeyError, IndexError):
                pass  # the two paths overlapped and one vanished
        elif mutation == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))
        elif mutation == "wrap":
            parent[key] = [parent[key]]
        elif mutation == "rename" and isinstance(parent, dict):
            parent[data.draw(KEYS)] = parent.pop(key)
    assert_loads_or_rejects(json.dumps(doc))


@pytest.mark.parametrize("make_doc", fuzz_documents())
@given(data=st.data())
def test_text_mutations_only_raise_graph_format_error(make_doc: Callable[[], Any], data: st.DataObject) -> None:
    raw = json.dumps(make_doc()).encode()
    start = data.draw(st.integers(0, len(raw)))
    end = data.draw(st.integers(start, min(len(raw), start + 8)))
    choice = data.draw(st.sampled_from(["truncate", "splice", "flip"]))
    if choice == "truncate":
        mutated_bytes = raw[:start]
    elif choice == "splice":
        mutated_bytes = raw[:start] + data.draw(st.binary(max_size=6)) + raw[end:]
    else:
        position = min(start, len(raw) - 1)
        mutated_bytes = raw[:position] + bytes([raw[position] ^ data.draw(st.integers(1, 255))]) + raw[position + 1 :]
    assert_loads_or_rejects(mutated_bytes)
    try:
        as_text = mutated_bytes.decode("utf-8")
    except UnicodeDecodeError:
        return
    assert_loads_or_rejects(as_text)


@given(st.binary(max_size=64) | st.text(max_size=64))
def test_random_input_only_raises_graph_format_error(blob: str | bytes) -> None:
    assert_loads_or_rejects(blob)


@given(JSON_VALUES)
def test_random_json_values_only_raise_graph_format_error(value: Any) -> None:
    assert_loads_or_rejects(json.dumps(value))
    assert_loads_or_rejects(json.dumps({"name": "g", "nodes": [value], "outputs": []}))
