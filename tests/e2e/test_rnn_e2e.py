"""End-to-end: Lstm, Gru, Rnn (part-2 spec 2.8-2.10) over every attribute combination the spec
allows (layers, bidirectional, carry, relu; packed weights known at conversion or fed at run
time), unrolled and as while_loops, against an independent loop written here per batch row."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import rlx_mil
from e2e.factory import Feeds, e2e_settings, rng_for, seeds, verify
from e2e.test_gated_delta_net_e2e import _op_count, lowered_form
from rlx_mil import milexec, reference

GATES = {"lstm": 4, "gru": 3, "rnn": 1}


def _sig(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def rnn_loop(kind: str, values: dict[str, np.ndarray], hidden: int, layers: int, directions: int, relu: bool
             ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """PyTorch nn.LSTM / nn.GRU / nn.RNN semantics in float64, one batch row at a time; packed
    blocks located by running offsets, layer l reading the previous layer's [S, D*H] rows."""
    x = values["x"].astype(np.float64)
    batch, steps, _ = x.shape
    gates = GATES[kind] * hidden
    bias_names = ["b_ih", "b_hh"] if kind == "gru" else ["bias"]
    offsets = dict.fromkeys(["w_ih", "w_hh", *bias_names], 0)

    def take(name: str, count: int, shape: tuple[int, ...]) -> np.ndarray:
        start = offsets[name]
        offsets[name] += count
        return values[name].reshape(-1)[start:start + count].astype(np.float64).reshape(shape)

    h_n = np.zeros((layers * directions, batch, hidden))
    c_n = np.zeros_like(h_n)
    if "h0" in values:
        h_n = values["h0"].astype(np.float64).copy()
    if "c0" in values:
        c_n = values["c0"].astype(np.float64).copy()
    seq = x
    for layer in range(layers):
        width = seq.shape[-1]
        out = np.zeros((batch, steps, directions * hidden))
        for d in range(directions):
            w_ih = take("w_ih", gates * width, (gates, width))
            w_hh = take("w_hh", gates * hidden, (gates, hidden))
            bias = {name: take(name, gates, (gates,)) for name in bias_names}
            r = layer * directions + d
            for b in range(batch):
                h, c = h_n[r, b].copy(), c_n[r, b].copy()
                order = range(steps) if d == 0 else reversed(range(steps))
                for t in order:
                    xt = seq[b, t]
                    if kind == "lstm":
                        z = w_ih @ xt + w_hh @ h + bias["bias"]
                        i, f, g, o = (z[k * hidden:(k + 1) * hidden] for k in range(4))
                        c = _sig(f) * c + _sig(i) * np.tanh(g)
                        h = _sig(o) * np.tanh(c)
                    elif kind == "gru":
                        gi, gh = w_ih @ xt + bias["b_ih"], w_hh @ h + bias["b_hh"]
                        rr = _sig(gi[:hidden] + gh[:hidden])
                        zz = _sig(gi[hidden:2 * hidden] + gh[hidden:2 * hidden])
                        nn = np.tanh(gi[2 * hidden:] + rr * gh[2 * hidden:])
                        h = (1 - zz) * nn + zz * h
                    else:
                        pre = w_ih @ xt + w_hh @ h + bias["bias"]
                        h = np.maximum(pre, 0) if relu else np.tanh(pre)
                    out[b, t, d * hidden:(d + 1) * hidden] = h
                h_n[r, b], c_n[r, b] = h, c
        seq = out
    finals = {"h0_out": h_n, "c0_out": c_n} if kind == "lstm" else {"h0_out": h_n}
    return seq, finals


def rnn_values(rng: np.random.Generator, kind: str, batch: int, steps: int, features: int, hidden: int, layers: int,
               directions: int, carry: bool) -> dict[str, np.ndarray]:
    gates = GATES[kind] * hidden
    w_ih = sum(gates * (features if layer == 0 else directions * hidden) for layer in range(layers)) * directions
    scale = 1.0 / np.sqrt(hidden)
    values = {
        "x": rng.standard_normal((batch, steps, features)).astype(np.float32),
        "w_ih": rng.uniform(-scale, scale, w_ih).astype(np.float32),
        "w_hh": rng.uniform(-scale, scale, layers * directions * gates * hidden).astype(np.float32),
    }
    for name in ["b_ih", "b_hh"] if kind == "gru" else ["bias"]:
        values[name] = rng.uniform(-scale, scale, layers * directions * gates).astype(np.float32)
    if carry:
        for name in ["h0", "c0"] if kind == "lstm" else ["h0"]:
            values[name] = rng.uniform(-1, 1, (layers * directions, batch, hidden)).astype(np.float32)
    return values


def rnn_graph(f: Feeds, kind: str, values: dict[str, np.ndarray], hidden: int, layers: int, bidirectional: bool,
              relu: bool, weights_known: bool) -> int:
    ids = {}
    for name, value in values.items():
        runtime = name in ("x", "h0", "c0") or not weights_known
        ids[name] = f.input(name, value) if runtime else f.param(name, value)
    g = f.graph
    if kind == "lstm":
        return g.lstm(ids["x"], ids["w_ih"], ids["w_hh"], ids["bias"], hidden, layers, bidirectional,
                      h0=ids.get("h0"), c0=ids.get("c0"), name="y")
    if kind == "gru":
        return g.gru(ids["x"], ids["w_ih"], ids["w_hh"], ids["b_ih"], ids["b_hh"], hidden, layers, bidirectional,
                     h0=ids.get("h0"), name="y")
    return g.rnn(ids["x"], ids["w_ih"], ids["w_hh"], ids["bias"], hidden, layers, bidirectional, h0=ids.get("h0"),
                 relu=relu, name="y")


@e2e_settings(4)
@given(
    kind=st.sampled_from(sorted(GATES)), batch=st.integers(1, 2), steps=st.integers(1, 5), features=st.integers(1, 4),
    hidden=st.integers(1, 4), layers=st.integers(1, 2), bidirectional=st.booleans(), carry=st.booleans(),
    relu=st.booleans(), weights_known=st.booleans(), looped=st.booleans(), seed=seeds,
)
def test_rnn_stacks(
    kind: str, batch: int, steps: int, features: int, hidden: int, layers: int, bidirectional: bool, carry: bool,
    relu: bool, weights_known: bool, looped: bool, seed: int,
) -> None:
    directions = 2 if bidirectional else 1
    values = rnn_values(rng_for(seed), kind, batch, steps, features, hidden, layers, directions, carry)
    f = Feeds(kind)
    f.graph.set_outputs([rnn_graph(f, kind, values, hidden, layers, bidirectional, relu, weights_known)])
    want = reference.evaluate(f.graph, f.inputs, f.params)
    expected, finals = rnn_loop(kind, values, hidden, layers, directions, relu)
    np.testing.assert_allclose(want["y"], expected, rtol=1e-5, atol=1e-5)
    assert set(want) == ({"y", *finals} if carry else {"y"})
    for name in set(want) - {"y"}:
        np.testing.assert_allclose(want[name], finals[name], rtol=1e-5, atol=1e-5)
    with lowered_form(looped):
        verify(f.graph, f.inputs, f.params)


def test_every_rnn_attribute_combination_matches_the_loop() -> None:
    """All (kind, layers, bidirectional, carry, relu) combinations, reference vs the loop and the
    fp32 executor (iOS18; the property test covers the other targets and fp16)."""
    rng = rng_for(1)
    for kind in sorted(GATES):
        for layers in (1, 2):
            for bidirectional in (False, True):
                for carry in (False, True):
                    for relu in ((False, True) if kind == "rnn" else (False,)):
                        directions = 2 if bidirectional else 1
                        values = rnn_values(rng, kind, 2, 3, 3, 2, layers, directions, carry)
                        f = Feeds(kind)
                        f.graph.set_outputs([rnn_graph(f, kind, values, 2, layers, bidirectional, relu, True)])
                        expected, finals = rnn_loop(kind, values, 2, layers, directions, relu)
                        got = milexec.run(rlx_mil.convert(f.graph, f.params, precision="fp32"), f.inputs)
                        np.testing.assert_allclose(got["y"], expected, rtol=1e-5, atol=1e-5)
                        for name in set(got) - {"y"}:
                            np.testing.assert_allclose(got[name], finals[name], rtol=1e-5, atol=1e-5)
                        assert len(got) == (1 + len(finals) if carry else 1)


def test_long_lstm_keeps_one_loop_per_layer_and_direction() -> None:
    counts = {}
    for steps in (24, 240):
        values = rnn_values(rng_for(2), "lstm", 1, steps, 3, 4, 2, 2, True)
        f = Feeds(f"lstm_{steps}")
        f.graph.set_outputs([rnn_graph(f, "lstm", values, 4, 2, True, False, True)])
        model = rlx_mil.convert(f.graph, f.params, precision="fp32")
        counts[steps] = _op_count(model._mil_program)
    assert counts[24] == counts[240]
    got = milexec.run(model, f.inputs)
    expected, finals = rnn_loop("lstm", values, 4, 2, 2, False)
    np.testing.assert_allclose(got["y"], expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["c0_out"], finals["c0_out"], rtol=1e-4, atol=1e-4)
