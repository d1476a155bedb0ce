"""Reading and writing both JSON forms: upstream 0.2.2 and the newest upstream (spec part 2, section 1)."""

from __future__ import annotations

import json

import pytest
from catalogue import CATALOGUE

from rlx_mil.errors import GraphFormatError, JsonVersionError, UnsupportedOpError, UnsupportedOpFormatError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.json_io import NEWEST, V0_2_2, graph_from_json
from rlx_mil.ir.serde.forms import OP_FORMS


def _node(index: int, op: object, inputs: list[int], dims: list[int], dtype: str = "F32") -> dict[str, object]:
    return {
        "id": index, "op": op, "inputs": inputs,
        "shape": {"dims": [{"Static": d} for d in dims], "dtype": dtype}, "name": None, "origin": None,
    }


def _input(index: int, name: str, dims: list[int], dtype: str = "F32") -> dict[str, object]:
    node = _node(index, {"Input": {"name": name}}, [], dims, dtype)
    node["name"] = name
    return node


def _text(nodes: list[dict[str, object]], outputs: list[int] | None = None) -> str:
    doc = {"name": "g", "nodes": nodes, "outputs": [len(nodes) - 1] if outputs is None else outputs}
    return json.dumps(doc, separators=(",", ":"))


def _rope_doc(style: str | None) -> str:
    attrs: dict[str, object] = {"head_dim": 8, "n_rot": 8}
    if style is not None:
        attrs["style"] = style
    nodes = [_input(0, "x", [1, 4, 8]), _input(1, "cos", [4, 4]), _input(2, "sin", [4, 4]),
             _node(3, {"Rope": attrs}, [0, 1, 2], [1, 4, 8])]
    return _text(nodes)


def test_a_0_2_2_rope_is_neox_and_round_trips_in_its_own_form() -> None:
    text = _rope_doc(None)
    graph = graph_from_json(text)
    assert graph.nodes[3].op == ops.Rope(8, 8, ops.RopeStyle.NEOX)
    assert graph.json_version == V0_2_2
    assert graph.to_json() == text
    assert '"style":"NeoX"' in graph.to_json(version=NEWEST)


@pytest.mark.parametrize("style", ["NeoX", "GptJ"])
def test_a_newest_rope_keeps_its_style_and_round_trips(style: str) -> None:
    text = _rope_doc(style)
    graph = graph_from_json(text)
    assert graph.nodes[3].op.style.value == style
    assert graph.json_version == NEWEST
    assert graph.to_json() == text
    assert graph_from_json(graph.to_json(indent=2)).to_json(indent=2) == graph.to_json(indent=2)


def test_gptj_has_no_0_2_2_spelling() -> None:
    graph = graph_from_json(_rope_doc("GptJ"))
    with pytest.raises(JsonVersionError, match=r"nodes\[3\]\.op: .*style = GptJ has no 0\.2\.2 spelling"):
        graph.to_json(version=V0_2_2)
    # NeoX written as 0.2.2 simply leaves the field out.
    assert '"style"' not in graph_from_json(_rope_doc("NeoX")).to_json(version=V0_2_2)


def _attention_doc(v_head_dim: object = "absent") -> str:
    attrs: dict[str, object] = {"num_heads": 2, "head_dim": 8}
    if v_head_dim != "absent":
        attrs["v_head_dim"] = v_head_dim
    attrs.update({"mask_kind": "Causal", "score_scale": None, "attn_logit_softcap": None})
    width = 8 if v_head_dim in ("absent", None) else int(v_head_dim)  # type: ignore[call-overload]
    nodes = [_input(0, "q", [1, 2, 3, 8]), _input(1, "k", [1, 2, 3, 8]), _input(2, "v", [1, 2, 3, width]),
             _node(3, {"Attention": attrs}, [0, 1, 2], [1, 2, 3, width])]
    return _text(nodes)


@pytest.mark.parametrize(("v_head_dim", "version"), [("absent", V0_2_2), (None, NEWEST), (4, NEWEST)])
def test_attention_v_head_dim_both_forms(v_head_dim: object, version: str) -> None:
    text = _attention_doc(v_head_dim)
    graph = graph_from_json(text)
    assert graph.json_version == version
    assert graph.to_json() == text
    op = graph.nodes[3].op
    assert isinstance(op, ops.Attention)
    assert op.v_head_dim == (None if v_head_dim in ("absent", None) else v_head_dim)
    # The serde field order puts v_head_dim between head_dim and mask_kind.
    if version == NEWEST:
        assert '"head_dim":8,"v_head_dim":' in text


def test_mla_attention_cannot_be_written_as_0_2_2() -> None:
    graph = graph_from_json(_attention_doc(4))
    with pytest.raises(JsonVersionError, match="v_head_dim = 4"):
        graph.to_json(version=V0_2_2)
    # An MLA output is v_head_dim wide: a declaration of the wrong width is refused on load.
    doc = json.loads(_attention_doc(4))
    doc["nodes"][3]["shape"]["dims"][-1] = {"Static": 8}
    with pytest.raises(GraphFormatError, match="differs from the inferred"):
        graph_from_json(json.dumps(doc))


def _scatter_add_doc(op: object) -> str:
    nodes = [_input(0, "updates", [2, 3]), _input(1, "indices", [2]), _node(2, op, [0, 1], [5, 3])]
    return _text(nodes)


def test_scatter_add_unit_and_struct_forms() -> None:
    legacy = _scatter_add_doc("ScatterAdd")
    graph = graph_from_json(legacy)
    assert graph.nodes[2].op == ops.ScatterAdd(0) and graph.json_version == V0_2_2
    assert graph.to_json() == legacy
    newest = _scatter_add_doc({"ScatterAdd": {"axis": 0}})
    assert graph_from_json(newest).to_json() == newest
    assert graph.to_json(version=NEWEST) == newest
    other_axis = Graph("axis1")
    updates, indices = other_axis.input("updates", [2, 3]), other_axis.input("indices", [3])
    other_axis.set_outputs([other_axis.scatter_add(updates, indices, [2, 7], axis=1)])
    assert graph_from_json(other_axis.to_json()).nodes[2].op == ops.ScatterAdd(1)
    with pytest.raises(JsonVersionError, match="axis = 1"):
        other_axis.to_json(version=V0_2_2)


def test_newest_only_ops_kinds_and_dtypes_refuse_the_0_2_2_form() -> None:
    g = Graph("newest")
    x = g.input("x", [2, 3])
    g.set_outputs([g.clamp(g.hard_swish(x), -1.0, 1.0)])
    assert g.to_json().count('"Clamp"') == 1  # built graphs default to the oldest form that fits: newest here
    with pytest.raises(JsonVersionError, match=r"nodes\[1\].*ActivationKind HardSwish does not exist in 0\.2\.2"):
        g.to_json(version=V0_2_2)
    h = Graph("complex")
    h.input("z", [2], "C128")
    h.set_outputs([0])
    assert h.nodes[0].shape.dtype is DType.C128
    with pytest.raises(JsonVersionError, match="dtype C128"):
        h.to_json(version=V0_2_2)
    assert graph_from_json(h.to_json()).json_version == NEWEST


def test_graphs_built_in_code_default_to_0_2_2_when_it_fits() -> None:
    g = Graph("plain")
    x = g.input("x", [2])
    g.set_outputs([g.relu(x)])
    assert g.to_json() == g.to_json(version=V0_2_2) == g.to_json(version=NEWEST)
    with pytest.raises(ValueError, match="version must be one of"):
        g.to_json(version="0.3")


def test_new_quant_schemes_parse_and_round_trip() -> None:
    for scheme in ('"GgufIQ4XS"', '{"MlxAffine":{"bits":4,"group_size":64}}', '{"MxFp4x2Block":{"group_size":32}}'):
        nodes = [_input(0, "x", [1, 256]), _input(1, "w", [64], "U8"), _input(2, "s", [4]),
                 _node(3, json.loads('{"DequantMatMul":{"scheme":' + scheme + "}}"), [0, 1, 2], [1, 8])]
        if "Gguf" in scheme:
            nodes = [_input(0, "x", [1, 256]), _input(1, "w", [8 * 136], "U8"),
                     _node(2, json.loads('{"DequantMatMul":{"scheme":' + scheme + "}}"), [0, 1], [1, 8])]
        elif "Mlx" in scheme:
            nodes.insert(3, _input(3, "b", [4]))
            nodes[4]["id"], nodes[4]["inputs"] = 4, [0, 1, 2, 3]
        text = _text(nodes)
        graph = graph_from_json(text)
        assert graph.json_version == NEWEST and graph.to_json() == text
    bad = '{"MlxAffine":{"bits":4,"group_size":64,"extra":1}}'
    with pytest.raises(GraphFormatError, match=r'scheme\.MlxAffine\.extra: unknown field "extra"'):
        nodes = [_input(0, "x", [1, 8]), _input(1, "w", [8], "U8"), _input(2, "s", [4]), _input(3, "b", [4]),
                 _node(4, json.loads('{"DequantMatMul":{"scheme":' + bad + "}}"), [0, 1, 2, 3], [1, 8])]
        graph_from_json(_text(nodes))


def test_upstream_ops_without_ir_definitions_are_unsupported_not_parse_errors() -> None:
    nodes = [_input(0, "x", [4]), _node(1, {"Cholesky": {"n": 2}}, [0], [4])]
    with pytest.raises(UnsupportedOpFormatError,
                       match=r"nodes\[1\]\.op: upstream op Cholesky is not supported") as err:
        graph_from_json(_text(nodes))
    assert isinstance(err.value, GraphFormatError) and isinstance(err.value, UnsupportedOpError)


def test_every_upstream_kind_without_a_form_is_refused_by_name() -> None:
    """Spec part 2, section 1.11: each kind of upstream's newest `OpKind` list that rlx_mil has
    no form for is an UnsupportedOpFormatError naming it, spelled bare or with attributes."""
    from rlx_mil.ir.serde.forms import UNSUPPORTED_UPSTREAM_OPS
    from rlx_mil.ir.serde.upstream_kinds import UPSTREAM_OP_KINDS

    assert len(UPSTREAM_OP_KINDS) == len(set(UPSTREAM_OP_KINDS)) == 187
    assert set(OP_FORMS) <= set(UPSTREAM_OP_KINDS), sorted(set(OP_FORMS) - set(UPSTREAM_OP_KINDS))
    assert UNSUPPORTED_UPSTREAM_OPS == set(UPSTREAM_OP_KINDS) - set(OP_FORMS)
    for kind in sorted(UNSUPPORTED_UPSTREAM_OPS):
        for op in (kind, {kind: {"axis": 0}}, {kind: None}):
            nodes = [_input(0, "x", [4]), _node(1, op, [0], [4])]
            # Custom is read for the one name upstream's Core ML backend lowers; others are
            # refused naming the Custom op (tests/lower/test_custom_json.py).
            named = r"\.op\.Custom: upstream Custom op .* is not supported" if kind == "Custom" else rf"\.op: upstream op {kind} is not supported"
            with pytest.raises(UnsupportedOpFormatError, match=rf"nodes\[1\]{named}"):
                graph_from_json(_text(nodes))


def test_the_kind_list_is_read_from_op_rs() -> None:
    from rlx_mil.ir.serde.upstream_kinds import op_kinds_of

    text = "pub enum Other {\n    A,\n}\npub enum OpKind {\n    Input,\n    /// a Doc, comment\n    Det,\n    // B,\n    Roll,\n}\n"
    assert op_kinds_of(text) == ("Input", "Det", "Roll")
    with pytest.raises(ValueError, match="no `pub enum OpKind"):
        op_kinds_of("enum X {}")


# The If example of spec part 2, section 7.1, as a complete document.
IF_TEXT = (
    '{"name":"g","nodes":['
    '{"id":0,"op":{"Input":{"name":"p"}},"inputs":[],"shape":{"dims":[{"Static":1}],"dtype":"Bool"},"name":"p","origin":null},'
    '{"id":1,"op":{"Input":{"name":"x"}},"inputs":[],"shape":{"dims":[{"Static":4}],"dtype":"F32"},"name":"x","origin":null},'
    '{"id":2,"op":{"If":{'
    '"then_branch":{"name":"then","nodes":['
    '{"id":0,"op":{"Input":{"name":"a"}},"inputs":[],"shape":{"dims":[{"Static":4}],"dtype":"F32"},"name":"a","origin":null},'
    '{"id":1,"op":{"Activation":"Relu"},"inputs":[0],"shape":{"dims":[{"Static":4}],"dtype":"F32"},"name":null,"origin":null}],'
    '"outputs":[1]},'
    '"else_branch":{"name":"else","nodes":['
    '{"id":0,"op":{"Input":{"name":"a"}},"inputs":[],"shape":{"dims":[{"Static":4}],"dtype":"F32"},"name":"a","origin":null},'
    '{"id":1,"op":{"Activation":"Neg"},"inputs":[0],"shape":{"dims":[{"Static":4}],"dtype":"F32"},"name":null,"origin":null}],'
    '"outputs":[1]}}},'
    '"inputs":[0,1],"shape":{"dims":[{"Static":4}],"dtype":"F32"},"name":null,"origin":null}],"outputs":[2]}'
)


def test_nested_graphs_load_and_round_trip() -> None:
    graph = graph_from_json(IF_TEXT)
    op = graph.nodes[2].op
    assert isinstance(op, ops.If)
    assert [n.op for n in op.then_branch.nodes][1] == ops.Activation(ops.ActivationKind.RELU)
    assert graph.to_json() == IF_TEXT
    bad = IF_TEXT.replace('{"Activation":"Neg"},"inputs":[0]', '{"Activation":"Neg"},"inputs":[5]')
    with pytest.raises(GraphFormatError, match=r"else_branch: nodes\[1\]\.inputs\[0\]"):
        graph_from_json(bad)


# The ElementwiseRegion example of spec part 2, section 7.5 (newest form, with the prologue fields).
REGION_OP = {"ElementwiseRegion": {
    "chain": [{"Binary": ["Add", {"Input": 0}, {"Input": 1}]}, {"Activation": ["Silu", {"Step": 0}]},
              {"Compare": ["Gt", {"Step": 1}, {"Input": 2}]}, {"Where": [{"Step": 2}, {"Step": 1}, {"Input": 2}]},
              {"Cast": ["F16", {"Step": 3}]}],
    "num_inputs": 3, "scalar_input_mask": 4, "input_modulus": [0, 64, 1, *([0] * 13)],
    "prologue": "None", "prologue_input": 0,
}}


@pytest.mark.parametrize("form", [NEWEST, V0_2_2])
def test_elementwise_regions_in_both_forms(form: str) -> None:
    op = json.loads(json.dumps(REGION_OP))
    if form == V0_2_2:
        del op["ElementwiseRegion"]["prologue"], op["ElementwiseRegion"]["prologue_input"]
    nodes = [_input(0, "a", [2, 64]), _input(1, "b", [64]), _input(2, "c", [1]), _node(3, op, [0, 1, 2], [2, 64], "F16")]
    text = _text(nodes)
    graph = graph_from_json(text)
    assert graph.json_version == form and graph.to_json() == text
    region = graph.nodes[3].op
    assert isinstance(region, ops.ElementwiseRegion) and region.chain[4].attr is DType.F16
    bad = json.loads(text)
    bad["nodes"][3]["op"]["ElementwiseRegion"]["chain"][1]["Activation"][1] = {"Step": 3}
    with pytest.raises(GraphFormatError, match=r"chain\[1\] reads Step\(3\)"):
        graph_from_json(json.dumps(bad))


#: Op kinds of upstream 0.2.2 that rlx_mil has IR ops for (from the 0.2.2 `OpKind` list); every
#: other op exists only in newest upstream and has no 0.2.2 spelling.
OPS_OF_0_2_2 = frozenset(
    "Input Param Constant Activation Cast Quantize Dequantize FakeQuantize Binary Compare Where"
    " ElementwiseRegion MatMul DotGeneral LayerNorm LayerNorm2d GroupNorm RmsNorm ResizeNearest2x"
    " Attention Rope AxialRope2d Reshape Transpose Narrow Concat Expand Gather Reduce Softmax Cumsum"
    " TopK Sample Conv ConvTranspose2d Pool AttentionBackward GroupedMatMul DequantGroupedMatMul"
    " DequantMoEWeights ScatterAdd LoraMatMul DequantMatMul QMatMul QConv2d SelectiveScan GatedDeltaNet"
    " FusedSwiGLU FusedMatMulBiasAct FusedResidualLN FusedResidualRmsNorm FusedAttentionBlock"
    " FusedTransformerLayer If While Scan".split()
)


def test_every_json_form_knows_whether_0_2_2_has_it() -> None:
    wrong = {name: form.since for name, form in OP_FORMS.items() if (form.since == V0_2_2) != (name in OPS_OF_0_2_2)}
    assert not wrong, f"JSON forms whose `since` disagrees with upstream 0.2.2: {wrong}"


@pytest.mark.parametrize("op_name", ["Conv3d", "ConvTranspose3d", "FusedConvBiasAct", "Interpolate3d", "LogMel"])
def test_newest_only_vision_and_audio_ops_refuse_0_2_2(op_name: str) -> None:
    cases = [build for build in CATALOGUE.values() if any(n.op.type_name == op_name for n in build())]
    assert cases, f"no catalogue case builds {op_name}"
    graph = cases[0]()
    text = graph.to_json()
    assert graph_from_json(text).to_json() == text and graph_from_json(text).json_version == NEWEST
    newest_only = sorted({n.op.type_name for n in graph} - OPS_OF_0_2_2)
    assert op_name in newest_only
    with pytest.raises(JsonVersionError, match=rf"op ({'|'.join(newest_only)}) does not exist in 0\.2\.2"):
        graph.to_json(version=V0_2_2)
