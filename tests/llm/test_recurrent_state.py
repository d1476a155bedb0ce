"""Carried recurrent states as Core ML states (kv_cache=, iOS18): several decode steps through
the executor's state support match the stateless model stepped by feeding `<input>_out` back."""

from __future__ import annotations

import json

import numpy as np
import pytest
from e2e.factory import Feeds, rng_for
from e2e.test_gated_delta_net_e2e import delta_rule_loop, gdn_graph, gdn_values
from e2e.test_rnn_e2e import rnn_graph, rnn_loop, rnn_values

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.coreml.metadata import LLM as LLM_METADATA_KEY
from rlx_mil.errors import GraphError, InvalidOptionError
from rlx_mil.ir.graph import Graph

STEPS = 4
#: Core ML states are fp16: the carried value is rounded to fp16 between calls.
STATE_TOL = {"fp32": 2e-3, "fp16": 2e-2}


def _step_values(values: dict[str, np.ndarray], t: int, carried: set[str]) -> dict[str, np.ndarray]:
    return {k: v[:, t:t + 1] for k, v in values.items() if k not in carried}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gated_delta_net_state_lives_in_a_core_ml_state(precision: str) -> None:
    values = gdn_values(rng_for(4), 1, STEPS, 2, 4, True)
    values["state"] = np.zeros_like(values["state"])  # a fresh Core ML state is zeros
    f = Feeds("gdn_decode")
    f.graph.set_outputs([gdn_graph(f, {k: (v if k == "state" else v[:, :1]) for k, v in values.items()}, 4, True, True)])
    model = rlx_mil.convert(f.graph, {}, precision=precision, kv_cache="auto")
    spec = model.get_spec().description
    assert [i.name for i in spec.input] == ["q", "k", "v", "g", "beta"]
    assert [o.name for o in spec.output] == ["o"]
    states: dict[str, np.ndarray] = {}
    stateless = values["state"]
    outs = []
    for t in range(STEPS):
        got = milexec.run(model, _step_values(values, t, {"state"}), states=states)
        outs.append(got["o"])
        want = reference.evaluate(f.graph, {**_step_values(values, t, {"state"}), "state": stateless})
        stateless = want["state_out"]
        np.testing.assert_allclose(got["o"], want["o"], atol=STATE_TOL[precision], rtol=STATE_TOL[precision])
    np.testing.assert_allclose(states["var_state"], stateless, atol=STATE_TOL[precision], rtol=STATE_TOL[precision])
    expected, final = delta_rule_loop(*(values[k] for k in ("q", "k", "v", "g", "beta")), None, True)
    np.testing.assert_allclose(stateless, final, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), expected, atol=STATE_TOL[precision], rtol=STATE_TOL[precision])


def test_lstm_states_named_in_a_mapping() -> None:
    """kv_cache={"h0": "h0_out", "c0": "c0_out"} keeps both states of a two-layer LSTM; one call
    per step equals the stateless graph stepped by feeding h0_out/c0_out back, and the whole
    sequence at once."""
    values = rnn_values(rng_for(8), "lstm", 1, STEPS, 3, 4, 2, 1, True)
    for name in ("h0", "c0"):
        values[name] = np.zeros_like(values[name])
    f = Feeds("lstm_decode")
    step_values = {k: (v[:, :1] if k == "x" else v) for k, v in values.items()}
    f.graph.set_outputs([rnn_graph(f, "lstm", step_values, 4, 2, False, False, True)])
    model = rlx_mil.convert(f.graph, f.params, precision="fp32", kv_cache={"h0": "h0_out", "c0": "c0_out"})
    assert [i.name for i in model.get_spec().description.input] == ["x"]
    assert [o.name for o in model.get_spec().description.output] == ["y"]
    states: dict[str, np.ndarray] = {}
    h, c = values["h0"], values["c0"]
    outs = []
    for t in range(STEPS):
        x_t = values["x"][:, t:t + 1]
        outs.append(milexec.run(model, {"x": x_t}, states=states)["y"])
        want = reference.evaluate(f.graph, {"x": x_t, "h0": h, "c0": c}, f.params)
        h, c = want["h0_out"], want["c0_out"]
        np.testing.assert_allclose(outs[t], want["y"], atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(states["h0"], h, atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(states["c0"], c, atol=2e-3, rtol=2e-3)
    expected, finals = rnn_loop("lstm", values, 4, 2, 1, False)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), expected, atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(c, finals["c0_out"], atol=1e-5, rtol=1e-5)


def test_a_state_input_read_elsewhere_is_refused() -> None:
    values = gdn_values(rng_for(1), 1, 1, 1, 2, False)
    f = Feeds("gdn_shared")
    out = gdn_graph(f, values, 2, False, True)
    state = next(n.id for n in f.graph if getattr(n.op, "name", None) == "state")
    f.graph.set_outputs([out, f.graph.neg(state, name="leak")])
    with pytest.raises(GraphError, match="also feeds"):
        rlx_mil.convert(f.graph, {}, kv_cache="auto")


def test_recurrent_states_need_ios18() -> None:
    values = gdn_values(rng_for(1), 1, 1, 1, 2, False)
    f = Feeds("gdn_old_target")
    f.graph.set_outputs([gdn_graph(f, values, 2, False, True)])
    with pytest.raises(InvalidOptionError, match="iOS18"):
        rlx_mil.convert(f.graph, {}, kv_cache="auto", target="iOS17")


def _hybrid_step_graph(past: int | None) -> Graph:
    """One decode step of a hybrid block: causal attention over a KV cache (upstream's decode
    form) and a GatedDeltaNet carrying its state, in one graph."""
    g = Graph("hybrid_step")
    q = g.input("q_att", [1, 2, 1, 4])
    k, v = g.input("k_new", [1, 2, 1, 4]), g.input("v_new", [1, 2, 1, 4])
    if past is not None:
        k = g.concat([g.input("past_k_0", [1, 2, past, 4]), k], 2, name="new_k_0")
        v = g.concat([g.input("past_v_0", [1, 2, past, 4]), v], 2, name="new_v_0")
    att = g.attention_kind(q, k, v, 2, 4, "causal", name="att")
    qg, kg, vg = (g.input(n, [1, 1, 2, 4]) for n in ("q", "k", "v"))
    gdn = g.gated_delta_net(qg, kg, vg, g.input("g", [1, 1, 2]), g.input("beta", [1, 1, 2]), 4,
                            state=g.input("state", [1, 2, 4, 4]), name="o")
    g.set_outputs([att, gdn] if past is None else [att, k, v, gdn])
    return g


@pytest.mark.filterwarnings("ignore::rlx_mil.lowering.state.kv_cache.NeuralEngineWarning")  # head_dim 4
def test_hybrid_block_keeps_kv_cache_and_recurrent_state_in_one_mechanism() -> None:
    rng = rng_for(12)
    model = rlx_mil.convert(_hybrid_step_graph(1), {}, precision="fp32", kv_cache="auto", max_context=32)
    meta = json.loads(model.user_defined_metadata[LLM_METADATA_KEY])
    assert set(meta["states"]) == {"key_cache", "value_cache", "var_state"}
    assert meta["recurrent_states"] == {"state": {"state": "var_state", "output": "state_out"}}
    states: dict[str, np.ndarray] = {}
    state = np.zeros((1, 2, 4, 4), np.float32)
    past_k = past_v = None
    for t in range(STEPS):
        gdn = gdn_values(rng, 1, 1, 2, 4, False)
        feeds = {"q_att": rng.standard_normal((1, 2, 1, 4)).astype(np.float32),
                 "k_new": rng.standard_normal((1, 2, 1, 4)).astype(np.float32),
                 "v_new": rng.standard_normal((1, 2, 1, 4)).astype(np.float32),
                 **{k: gdn[k] for k in ("q", "k", "v", "g", "beta")}}
        got = milexec.run(model, {**feeds, "cache_position": np.array([t], np.int32)}, states=states)
        stateless = dict(feeds, state=state)
        if past_k is not None:
            stateless.update(past_k_0=past_k, past_v_0=past_v)
        want = reference.evaluate(_hybrid_step_graph(None if past_k is None else t), stateless)
        past_k = want.get("new_k_0", feeds["k_new"])
        past_v = want.get("new_v_0", feeds["v_new"])
        state = want["state_out"]
        np.testing.assert_allclose(got["att"], want["att"], atol=2e-3, rtol=2e-3)
        np.testing.assert_allclose(got["o"], want["o"], atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(states["var_state"], state, atol=2e-3, rtol=2e-3)
