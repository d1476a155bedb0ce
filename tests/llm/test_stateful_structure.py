"""Structure of stateful conversions and the typed errors for graphs that are not in the form."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from rlx_mil.errors import GraphError, InvalidOptionError, UnsupportedOpError
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.state.kv_cache import NeuralEngineWarning, find_cache_pairs

from .decode_graphs import TinyLM, decode_graph, tiny_params
from .stepping import convert_stateful

C = TinyLM(layers=3)
PARAMS = tiny_params(C)


def _op_counts(model: object) -> Counter[str]:
    return Counter(op.op_type for op in model._mil_program.functions["main"].operations)  # type: ignore[attr-defined]


@pytest.mark.parametrize("layout", ["stacked", "per_layer"])
@pytest.mark.parametrize("new", [1, 3])
def test_one_write_per_cache_fused_sdpa_per_layer_no_cache_sized_io(layout: str, new: int) -> None:
    model = convert_stateful(decode_graph(C, new, 2), PARAMS, max_context=64, cache_layout=layout)
    ops = _op_counts(model)
    caches = 2 * C.layers
    assert ops["slice_update"] == caches
    assert ops["coreml_update_state"] == caches
    assert ops["read_state"] == (2 if layout == "stacked" else caches)
    assert ops["scaled_dot_product_attention"] == C.layers
    # no cache Concat is left: the concats that remain build write offsets and RoPE halves
    concats = [op for op in model._mil_program.functions["main"].operations if op.op_type == "concat"]  # type: ignore[attr-defined]
    assert concats and all(64 not in tuple(op.outputs[0].shape) for op in concats)
    assert ops["concat"] <= 2 * caches + 2  # + the two head-wide RoPE tables, built once
    spec = model.get_spec()
    states = {s.name: list(s.type.stateType.arrayType.shape) for s in spec.description.state}
    if layout == "stacked":
        assert states == {"key_cache": [3, 1, 2, 64, 8], "value_cache": [3, 1, 2, 64, 8]}
    else:
        assert states == {f"{r}_cache_{i}": [1, 2, 64, 8] for i in range(C.layers) for r in "kv"}
    cache_size = 1 * C.kv_heads * 64 * C.head_dim
    interface = [*spec.description.input, *spec.description.output]
    assert {f.name for f in spec.description.input} == {"input_ids", "position_ids", "cache_position"}
    assert [f.name for f in spec.description.output] == ["logits"]
    for feature in interface:
        assert int(np.prod(feature.type.multiArrayType.shape)) < cache_size, feature.name


def test_custom_mask_input_covers_the_cache_slots() -> None:
    c = TinyLM(mask="custom")
    model = convert_stateful(decode_graph(c, 1, 5), tiny_params(c), max_context=32)
    shapes = {f.name: list(f.type.multiArrayType.shape) for f in model.get_spec().description.input}
    assert shapes["attention_mask"] == [1, 32]


def test_explicit_pairs_equal_auto_detection() -> None:
    graph = decode_graph(C, 1, 2)
    auto = find_cache_pairs(graph, "auto")
    named = find_cache_pairs(graph, {f"past_{r}_{i}": f"new_{r}_{i}" for i in range(C.layers) for r in "kv"})
    assert auto == named
    assert [(p.layer, p.role) for p in auto] == [(i, r) for i in range(C.layers) for r in "kv"]


def _tiny_attention(concat_is_output: bool, feed_other: bool = False) -> Graph:
    g = Graph("t")
    q = g.input("q", [1, 2, 1, 8])
    past = g.input("past_k", [1, 2, 3, 8])
    k = g.concat([past, g.input("k", [1, 2, 1, 8])], 2, name="new_k")
    v = g.concat([g.input("past_v", [1, 2, 3, 8]), g.input("v", [1, 2, 1, 8])], 2, name="new_v")
    a = g.attention_kind(q, k, v, 2, 8, "causal", name="attn")
    outs = [a]
    if concat_is_output:
        outs += [k, v]
    if feed_other:
        outs.append(g.neg(past, name="other_use"))
    g.set_outputs(outs)
    return g


def test_concat_that_is_not_an_output_is_named() -> None:
    with pytest.raises(GraphError, match=r"node %\d+ 'new_k' \(Concat\).*not a graph output"):
        find_cache_pairs(_tiny_attention(concat_is_output=False), "auto")


def test_past_input_with_other_uses_is_named() -> None:
    with pytest.raises(GraphError, match=r"'past_k' \(Input\).*feeds nodes"):
        find_cache_pairs(_tiny_attention(concat_is_output=True, feed_other=True), "auto")


def test_explicit_pair_that_is_not_the_pattern() -> None:
    with pytest.raises(GraphError, match=r"'attn' \(Attention\).*Concat"):
        find_cache_pairs(_tiny_attention(True), {"past_k": "attn"})
    with pytest.raises(InvalidOptionError, match="no Input named 'nope'"):
        find_cache_pairs(_tiny_attention(True), {"nope": "new_k"})
    with pytest.raises(InvalidOptionError, match="no output named 'nope'"):
        find_cache_pairs(_tiny_attention(True), {"past_k": "nope"})


def test_only_k_cached_is_refused() -> None:
    with pytest.raises(GraphError, match="v is not a cache"):
        find_cache_pairs(_tiny_attention(True), {"past_k": "new_k"})


def test_graph_without_cache() -> None:
    with pytest.raises(GraphError, match="no KV cache"):
        find_cache_pairs(decode_graph(C, 1, None), "auto")


def test_bias_mask_over_the_cache_is_refused() -> None:
    g2 = Graph("bias")
    q = g2.input("q", [1, 2, 1, 8])
    k = g2.concat([g2.input("past_k", [1, 2, 3, 8]), g2.input("k", [1, 2, 1, 8])], 2, name="new_k")
    v = g2.concat([g2.input("past_v", [1, 2, 3, 8]), g2.input("v", [1, 2, 1, 8])], 2, name="new_v")
    g2.set_outputs([g2.attention_bias(q, k, v, g2.input("bias", [1, 1, 1, 4]), 2, 8), k, v])
    with pytest.raises(UnsupportedOpError, match="Bias mask"):
        find_cache_pairs(g2, "auto")


def test_options_are_checked_before_conversion() -> None:
    graph = decode_graph(C, 1, 2)
    with pytest.raises(InvalidOptionError, match="iOS18"):
        convert_stateful(graph, PARAMS, max_context=32, target="iOS17")
    with pytest.raises(InvalidOptionError, match="max_context"):
        convert_stateful(graph, PARAMS, max_context=None)
    with pytest.raises(InvalidOptionError, match="smaller than the 4 new tokens"):
        convert_stateful(decode_graph(C, 4, 2), PARAMS, max_context=3)
    with pytest.raises(InvalidOptionError, match="cache_layout"):
        convert_stateful(graph, PARAMS, max_context=32, cache_layout="rows")


def test_neural_engine_unfriendly_dims_are_reported() -> None:
    import rlx_mil

    with pytest.warns(NeuralEngineWarning, match="max_context=40 is not a multiple of 32"):
        model = rlx_mil.convert(decode_graph(C, 1, 2), PARAMS, kv_cache="auto", max_context=40)
    import json

    notes = json.loads(model.user_defined_metadata["rlx_mil.llm"])["neural_engine_notes"]
    assert any("max_context=40" in n for n in notes) and any("head_dim=8" in n for n in notes)


def _dynamic_past_attention(new: int) -> Graph:
    """One attention layer in upstream's decode form with the past length left dynamic
    (PAST_SEQ) and the joined length a second symbol."""
    from rlx_mil.ir.ops import Concat
    from rlx_mil.ir.shape import PAST_SEQ, Dynamic, Shape, Static

    g = Graph("dynamic_past")
    q = g.input("q", [1, 4, new, 8])
    caches = []
    for r in "kv":
        past = g.input(f"past_{r}", [1, 2, Dynamic(PAST_SEQ), 8])
        rows = g.input(r, [1, 2, new, 8])
        joined = Shape((Static(1), Static(2), Dynamic(7), Static(8)))
        caches.append(g.add_node(Concat(2), [past, rows], joined, name=f"new_{r}"))
    g.set_outputs([g.attention_kind(q, caches[0], caches[1], 4, 8, "causal", name="attn"), *caches])
    return g


def test_dynamic_past_length_needs_no_binding() -> None:
    from rlx_mil import milexec, reference

    graph = _dynamic_past_attention(2)
    model = convert_stateful(graph, {}, max_context=16, precision="fp32")
    rng = np.random.default_rng(0)
    states: dict[str, np.ndarray] = {}
    past = {r: np.zeros((1, 2, 0, 8), np.float32) for r in "kv"}
    for step in range(4):
        feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in
                 (("q", (1, 4, 2, 8)), ("k", (1, 2, 2, 8)), ("v", (1, 2, 2, 8)))}
        got = milexec.run(model, {**feeds, "cache_position": np.array([2 * step], np.int32)}, states=states,
                          precision_model="float32")
        want = reference.evaluate(graph, {**feeds, "past_k": past["k"], "past_v": past["v"]})
        np.testing.assert_allclose(got["attn"], want["attn"], atol=1e-5, rtol=0)
        past = {r: want[f"new_{r}"] for r in "kv"}


def test_inspect_lists_the_states_of_a_single_function_model() -> None:
    from rlx_mil.coreml.package_info import package_info

    model = convert_stateful(decode_graph(C, 1, 2), PARAMS, max_context=64)
    text = package_info(model).to_text()
    assert "states:\n  key_cache: fp16[3, 1, 2, 64, 8]\n  value_cache: fp16[3, 1, 2, 64, 8]" in text
    assert "kv cache: stacked, 3 layers, max_context 64, write position input 'cache_position'" in text
    assert "  cache_position: int32[1]" in text
