"""End-to-end: GatedDeltaNet (part-2 spec 2.1) in both lowered forms (unrolled, while_loop),
with per-head and per-channel gates and carried state; checked against an independent
per-(batch, head) loop written here from the spec's formulas."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx_mil
from e2e.factory import Feeds, e2e_settings, rng_for, seeds, verify
from rlx_mil import milexec, reference
from rlx_mil.errors import UnsupportedOpError
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.rules import sequence_loop


@contextmanager
def lowered_form(looped: bool) -> Iterator[None]:
    """Lower recurrences as while_loops whatever S (`looped`), else with the usual limit."""
    saved = sequence_loop.UNROLL_MAX_STEPS
    sequence_loop.UNROLL_MAX_STEPS = 0 if looped else saved
    try:
        yield
    finally:
        sequence_loop.UNROLL_MAX_STEPS = saved


def delta_rule_loop(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray | None,
    per_channel: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Spec 2.1 one (b, h) at a time in float64: M <- diag(exp g) M (or exp(g) M);
    u = beta (v - M^T k); M <- M + k u^T; o = M^T q / sqrt(n)."""
    batch, steps, heads, n = q.shape
    out = np.zeros((batch, steps, heads, n))
    final = np.zeros((batch, heads, n, n))
    for b in range(batch):
        for h in range(heads):
            m = np.zeros((n, n)) if state is None else state[b, h].astype(np.float64)
            for t in range(steps):
                m = np.diag(np.exp(g[b, t, h].astype(np.float64))) @ m if per_channel else np.exp(float(g[b, t, h])) * m
                key = k[b, t, h].astype(np.float64)
                u = float(beta[b, t, h]) * (v[b, t, h] - m.T @ key)
                m = m + np.outer(key, u)
                out[b, t, h] = m.T @ q[b, t, h] / np.sqrt(n)
            final[b, h] = m
    return out, final


def gdn_values(rng: np.random.Generator, batch: int, steps: int, heads: int, n: int, per_channel: bool) -> dict[str, np.ndarray]:
    """q, k L2-normalised (as callers do), log-gates in [-1, 0), beta in (0, 1), a unit state."""

    def unit(dims: tuple[int, ...]) -> np.ndarray:
        x = rng.standard_normal(dims)
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    dims = (batch, steps, heads, n)
    return {
        "q": unit(dims), "k": unit(dims), "v": rng.standard_normal(dims).astype(np.float32),
        "g": -rng.uniform(0.0, 1.0, dims if per_channel else dims[:3]).astype(np.float32),
        "beta": rng.uniform(0.05, 1.0, dims[:3]).astype(np.float32),
        "state": (rng.standard_normal((batch, heads, n, n)) * 0.5).astype(np.float32),
    }


def gdn_graph(f: Feeds, values: dict[str, np.ndarray], n: int, per_channel: bool, carry: bool) -> int:
    ids = {key: f.input(key, values[key]) for key in ("q", "k", "v", "g", "beta")}
    state = f.input("state", values["state"]) if carry else None
    return f.graph.gated_delta_net(ids["q"], ids["k"], ids["v"], ids["g"], ids["beta"], n, state=state,
                                   gate_per_channel=per_channel, name="o")


@e2e_settings(3)
@given(
    batch=st.integers(1, 2), steps=st.integers(1, 6), heads=st.integers(1, 3), n=st.sampled_from([1, 2, 4, 8]),
    per_channel=st.booleans(), carry=st.booleans(), looped=st.booleans(), seed=seeds,
)
def test_gated_delta_net(
    batch: int, steps: int, heads: int, n: int, per_channel: bool, carry: bool, looped: bool, seed: int
) -> None:
    values = gdn_values(rng_for(seed), batch, steps, heads, n, per_channel)
    f = Feeds("gdn")
    out = gdn_graph(f, values, n, per_channel, carry)
    f.graph.set_outputs([out])
    want = reference.evaluate(f.graph, f.inputs)
    expected, final = delta_rule_loop(*(values[k] for k in ("q", "k", "v", "g", "beta")),
                                      values["state"] if carry else None, per_channel)
    np.testing.assert_allclose(want["o"], expected, rtol=1e-5, atol=1e-5)
    if carry:
        np.testing.assert_allclose(want["state_out"], final, rtol=1e-5, atol=1e-5)
    else:
        assert set(want) == {"o"}
    with lowered_form(looped):
        report = verify(f.graph, f.inputs)
    checked = {c.output for c in report.checks}
    assert checked == ({"o", "state_out"} if carry else {"o"})


def test_gated_delta_net_state_out_is_the_next_steps_state() -> None:
    """Decode threading: two steps of S=1 feeding state_out back equal one S=2 run."""
    values = gdn_values(rng_for(7), 1, 2, 2, 4, False)
    f = Feeds("gdn_step")
    f.graph.set_outputs([gdn_graph(f, {k: (v[:, :1] if k not in ("state",) else v) for k, v in values.items()}, 4, False, True)])
    model = rlx_mil.convert(f.graph, {}, precision="fp32")
    state = values["state"]
    outs = []
    for t in range(2):
        feeds = {k: (v[:, t:t + 1] if k != "state" else state) for k, v in values.items()}
        got = milexec.run(model, feeds)
        outs.append(got["o"])
        state = got["state_out"]
    expected, final = delta_rule_loop(*(values[k] for k in ("q", "k", "v", "g", "beta")), values["state"], False)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state, final, rtol=1e-5, atol=1e-5)


def test_gated_delta_net_empty_sequence_keeps_the_state() -> None:
    values = gdn_values(rng_for(3), 1, 0, 2, 4, False)
    f = Feeds("gdn_empty")
    f.graph.set_outputs([gdn_graph(f, values, 4, False, True)])
    got = reference.evaluate(f.graph, f.inputs)
    assert got["o"].shape == (1, 0, 2, 4)
    np.testing.assert_array_equal(got["state_out"], values["state"])
    with pytest.raises(UnsupportedOpError, match="empty sequence"):
        rlx_mil.convert(f.graph, {})


def _op_count(program: object) -> int:
    """Ops of the program, nested blocks included; consts are not counted (Core ML's passes
    merge consts of equal value, so their number depends on the values, e.g. of S)."""

    def walk(block: object) -> int:
        return sum((op.op_type != "const") + sum(walk(inner) for inner in op.blocks)  # type: ignore[attr-defined]
                   for op in block.operations)  # type: ignore[attr-defined]

    return sum(walk(fn) for fn in program.functions.values())  # type: ignore[attr-defined]


def _gdn_layer(steps: int, heads: int = 2, n: int = 8) -> Graph:
    g = Graph(f"gdn_layer_{steps}")
    q, k, v = (g.input(name, [1, steps, heads, n]) for name in ("q", "k", "v"))
    gate, beta = g.input("g", [1, steps, heads]), g.input("beta", [1, steps, heads])
    state = g.input("state", [1, heads, n, n])
    g.set_outputs([g.gated_delta_net(q, k, v, gate, beta, n, state=state, name="o")])
    return g


def test_long_sequence_program_size_does_not_grow_with_s() -> None:
    """Done-when (issue 13): a GatedDeltaNet layer at S=2048 converts to a program with as many
    ops as at S=64 (one while_loop), and that program computes the recurrence."""
    counts = {}
    models = {}
    for steps in (64, 2048):
        models[steps] = rlx_mil.convert(_gdn_layer(steps), {}, precision="fp16")
        counts[steps] = _op_count(models[steps]._mil_program)
    assert counts[64] == counts[2048], counts
    unrolled = rlx_mil.convert(_gdn_layer(sequence_loop.UNROLL_MAX_STEPS), {}, precision="fp16")
    assert counts[2048] < _op_count(unrolled._mil_program) * 2
    op_types = {op.op_type for op in models[2048]._mil_program.functions["main"].operations}
    assert "while_loop" in op_types
    values = gdn_values(rng_for(11), 1, 2048, 2, 8, False)
    got = milexec.run(models[2048], values)
    expected, final = delta_rule_loop(*(values[k] for k in ("q", "k", "v", "g", "beta")), values["state"], False)
    np.testing.assert_allclose(got["o"], expected, atol=2e-2, rtol=2e-2)
    np.testing.assert_allclose(got["state_out"], final, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_state_output_names_follow_the_state_input(precision: str) -> None:
    g = _gdn_layer(3)
    model = rlx_mil.convert(g, {}, precision=precision)
    names = {o.name for o in model.get_spec().description.output}
    assert names == {"o", "state_out"}
