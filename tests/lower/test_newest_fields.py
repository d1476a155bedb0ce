"""Fields the newest upstream added to existing ops, through reference, conversion and the
executor in fp32 and fp16: Rope `style` (GptJ pairs) and Attention `v_head_dim` (MLA)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_mil import MaskKind
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import RopeStyle
from rlx_mil.reference.attention import attention
from rlx_mil.reference.rope import rope
from rlx_mil.testing import check_conversion


def _gptj_loop(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_dim: int, n_rot: int) -> np.ndarray:
    """The spec's per-element GptJ formula on `[S, H*D]`."""
    out = x.astype(np.float64).copy()
    seq, width = x.shape
    for s in range(seq):
        for head in range(width // head_dim):
            base = head * head_dim
            for i in range(n_rot // 2):
                a, b = x[s, base + 2 * i], x[s, base + 2 * i + 1]
                out[s, base + 2 * i] = a * cos[s, i] - b * sin[s, i]
                out[s, base + 2 * i + 1] = b * cos[s, i] + a * sin[s, i]
    return out


def test_gptj_reference_is_the_spec_formula_and_differs_from_neox() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    cos, sin = rng.standard_normal((2, 3, 3)).astype(np.float32)
    got = rope(x, cos, sin, 8, 6, RopeStyle.GPTJ)
    np.testing.assert_allclose(got, _gptj_loop(x, cos, sin, 8, 6), rtol=1e-6, atol=1e-6)
    assert not np.allclose(got, rope(x, cos, sin, 8, 6, RopeStyle.NEOX))


@settings(deadline=None, max_examples=6)
@given(
    layout=st.sampled_from(["bsx", "bhsd", "sx"]),
    head_dim=st.sampled_from([4, 8]),
    partial=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_gptj_rope_converts(layout: str, head_dim: int, partial: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_rot = head_dim - 2 if partial else head_dim
    shape = {"bsx": [1, 5, 2 * head_dim], "bhsd": [1, 2, 5, head_dim], "sx": [5, head_dim]}[layout]
    g = Graph("gptj")
    x = g.input("x", shape)
    tables = [g.param(n, [5, head_dim // 2]) for n in ("cos", "sin")]
    g.set_outputs([g.rope(x, *tables, head_dim, n_rot, style="gptj", name="y")])
    angles = rng.uniform(0, 3, (5, head_dim // 2))
    params = {"cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    check_conversion(g, params, {"x": rng.standard_normal(shape).astype(np.float32)})


def test_mla_reference_matches_einsum() -> None:
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((2, 1, 2, 3, 8)).astype(np.float32)
    v = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    got = attention(q, k, v, num_heads=2, head_dim=8, mask_kind=MaskKind.NONE, v_head_dim=4)
    scores = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(8)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, np.einsum("bhqk,bhkd->bhqd", probs, v), rtol=1e-5, atol=1e-6)
    assert got.shape == (1, 2, 3, 4)


@pytest.mark.parametrize("attention_mode", ["auto", "decomposed"])
@pytest.mark.parametrize(
    ("q_shape", "k_shape", "v_shape", "heads"),
    [
        ([1, 2, 5, 8], [1, 2, 5, 8], [1, 2, 5, 4], 2),  # BHSD
        ([1, 5, 16], [1, 5, 16], [1, 5, 8], 2),  # fused heads
        ([1, 4, 3, 8], [1, 2, 3, 8], [1, 2, 3, 4], 4),  # GQA
    ],
)
def test_mla_attention_converts(
    q_shape: list[int], k_shape: list[int], v_shape: list[int], heads: int, attention_mode: str
) -> None:
    rng = np.random.default_rng(3)
    g = Graph("mla")
    q, k, v = g.input("q", q_shape), g.input("k", k_shape), g.input("v", v_shape)
    g.set_outputs([g.attention_kind(q, k, v, heads, 8, "causal", v_head_dim=4, name="y")])
    inputs = {n: rng.standard_normal(s).astype(np.float32) for n, s in (("q", q_shape), ("k", k_shape), ("v", v_shape))}
    check_conversion(g, {}, inputs, attention=attention_mode)
