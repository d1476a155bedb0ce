"""End-to-end: SelectiveScan (part-2 spec 2.2) and Mamba2 (2.3), unrolled and as a while_loop,
against independent per-(batch, channel) loops written here from the spec's formulas."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import rlx_mil
from e2e.factory import Feeds, e2e_settings, rng_for, seeds, verify
from e2e.test_gated_delta_net_e2e import _op_count, lowered_form
from rlx_mil import milexec, reference
from rlx_mil.ir.graph import Graph


def selective_scan_loop(x: np.ndarray, delta: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """h[n] <- exp(delta a[n]) h[n] + delta b[n] x; y = sum_n c[n] h[n], one (b, channel) at a time."""
    batch, steps, heads = x.shape
    y = np.zeros((batch, steps, heads))
    for bi in range(batch):
        for ch in range(heads):
            h = np.zeros(a.shape[1])
            for t in range(steps):
                d = float(delta[bi, t, ch])
                h = np.exp(d * a[ch].astype(np.float64)) * h + d * b[bi, t] * float(x[bi, t, ch])
                y[bi, t, ch] = float(c[bi, t] @ h)
    return y


def mamba2_loop(x: np.ndarray, dt: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """St <- exp(dt a_h) St + dt x b^T; y = St c, one (b, head) at a time."""
    batch, steps, heads, p = x.shape
    y = np.zeros((batch, steps, heads, p))
    for bi in range(batch):
        for h in range(heads):
            st_ = np.zeros((p, b.shape[-1]))
            for t in range(steps):
                d = float(dt[bi, t, h])
                st_ = np.exp(d * float(a[h])) * st_ + d * np.outer(x[bi, t, h], b[bi, t, h])
                y[bi, t, h] = st_ @ c[bi, t, h]
    return y


def _scan_values(rng: np.random.Generator, batch: int, steps: int, heads: int, n: int) -> dict[str, np.ndarray]:
    return {
        "x": rng.standard_normal((batch, steps, heads)).astype(np.float32),
        "delta": rng.uniform(0.01, 0.5, (batch, steps, heads)).astype(np.float32),
        "a": -rng.uniform(0.1, 2.0, (heads, n)).astype(np.float32),
        "b": rng.standard_normal((batch, steps, n)).astype(np.float32),
        "c": rng.standard_normal((batch, steps, n)).astype(np.float32),
    }


@e2e_settings(3)
@given(batch=st.integers(1, 2), steps=st.integers(1, 6), heads=st.integers(1, 4), n=st.integers(1, 6),
       a_is_param=st.booleans(), looped=st.booleans(), seed=seeds)
def test_selective_scan(batch: int, steps: int, heads: int, n: int, a_is_param: bool, looped: bool, seed: int) -> None:
    values = _scan_values(rng_for(seed), batch, steps, heads, n)
    f = Feeds("selective_scan")
    ids = {k: (f.param(k, v) if k == "a" and a_is_param else f.input(k, v)) for k, v in values.items()}
    f.graph.set_outputs([f.graph.selective_scan(ids["x"], ids["delta"], ids["a"], ids["b"], ids["c"], n, name="y")])
    want = reference.evaluate(f.graph, f.inputs, f.params)["y"]
    np.testing.assert_allclose(want, selective_scan_loop(*values.values()), rtol=1e-5, atol=1e-5)
    with lowered_form(looped):
        verify(f.graph, f.inputs, f.params)


def _mamba_values(rng: np.random.Generator, batch: int, steps: int, heads: int, p: int, n: int) -> dict[str, np.ndarray]:
    return {
        "x": rng.standard_normal((batch, steps, heads, p)).astype(np.float32),
        "dt": rng.uniform(0.01, 0.5, (batch, steps, heads)).astype(np.float32),
        "a": -rng.uniform(0.1, 2.0, (heads,)).astype(np.float32),
        "b": rng.standard_normal((batch, steps, heads, n)).astype(np.float32),
        "c": rng.standard_normal((batch, steps, heads, n)).astype(np.float32),
    }


@e2e_settings(3)
@given(batch=st.integers(1, 2), steps=st.integers(1, 6), heads=st.integers(1, 3), p=st.integers(1, 4),
       n=st.integers(1, 5), looped=st.booleans(), seed=seeds)
def test_mamba2(batch: int, steps: int, heads: int, p: int, n: int, looped: bool, seed: int) -> None:
    values = _mamba_values(rng_for(seed), batch, steps, heads, p, n)
    f = Feeds("mamba2")
    ids = {k: f.input(k, v) for k, v in values.items()}
    f.graph.set_outputs([f.graph.mamba2(ids["x"], ids["dt"], ids["a"], ids["b"], ids["c"], p, n, name="y")])
    want = reference.evaluate(f.graph, f.inputs)["y"]
    np.testing.assert_allclose(want, mamba2_loop(*values.values()), rtol=1e-5, atol=1e-5)
    with lowered_form(looped):
        verify(f.graph, f.inputs)


def test_long_scans_keep_one_loop() -> None:
    """Op counts at S=40 and S=400 agree and the long program computes the recurrence."""
    def graph(steps: int) -> tuple[Graph, dict[str, np.ndarray]]:
        values = _mamba_values(rng_for(5), 1, steps, 2, 3, 4)
        f = Feeds(f"mamba2_{steps}")
        ids = {k: f.input(k, v) for k, v in values.items()}
        f.graph.set_outputs([f.graph.mamba2(ids["x"], ids["dt"], ids["a"], ids["b"], ids["c"], 3, 4, name="y")])
        return f.graph, values

    counts = {}
    for steps in (40, 400):
        g, values = graph(steps)
        model = rlx_mil.convert(g, {}, precision="fp32")
        counts[steps] = _op_count(model._mil_program)
    assert counts[40] == counts[400]
    got = milexec.run(model, values)["y"]
    np.testing.assert_allclose(got, mamba2_loop(*values.values()), rtol=1e-4, atol=1e-4)
