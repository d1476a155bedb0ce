"""End-to-end: FusedSwiGLU, Rope, FusedAttentionBlock, FusedTransformerLayer, plus one smoke
case each for Attention and AttentionBackward (their full suites live elsewhere)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from e2e.factory import Feeds, e2e_settings, normal, rng_for, seeds, uniform, weight_kinds
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.ops import ActivationKind

# ------------------------------------------------------------------------------ FusedSwiGLU


@e2e_settings(4)
@given(
    lead=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3),
    half=st.integers(1, 6),
    seed=seeds,
)
def test_fused_swiglu(lead: tuple[int, ...], half: int, seed: int) -> None:
    """`up * silu(gate)`: canonical and gate-first splits x no cast / F32 / F16 (one node
    each; F16 output under fp32 precision is rounded to F16 like the reference)."""
    rng = rng_for(seed)
    f = Feeds("swiglu")
    x = f.input("x", normal(rng, (*lead, 2 * half), 2.0))
    outputs = [
        f.graph.fused_swiglu(x, cast_to=cast_to, gate_first=gate_first,
                             name=f"{'gate' if gate_first else 'up'}_first_{cast_to.value if cast_to else 'none'}")
        for gate_first in (False, True)
        for cast_to in (None, DType.F32, DType.F16)
    ]
    f.verify(outputs)


# ------------------------------------------------------------------------------ Rope


def rope_tables(rows: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    positions = np.arange(rows, dtype=np.float64)[:, None]
    freq = 10000.0 ** (-np.arange(head_dim // 2, dtype=np.float64) * 2 / head_dim)
    angles = positions * freq
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


@st.composite
def rope_cases(draw: st.DrawFn, layout: str) -> tuple[tuple[int, ...], int, int, int]:
    """x dims in `layout`, head_dim, n_rot (even, <= head_dim), table rows (>= S, or 1 for a
    broadcast decode row)."""
    head_dim = draw(st.sampled_from([2, 4, 6, 8]))
    n_rot = draw(st.sampled_from([r for r in range(2, head_dim + 1, 2)]))
    heads = draw(st.integers(1, 3))
    seq = draw(st.integers(1, 5))
    batch = draw(st.integers(1, 2))
    dims = {
        "sx": (seq, heads * head_dim),
        "bsx": (batch, seq, heads * head_dim),
        "bhsd": (batch, heads, seq, head_dim),
    }[layout]
    rows = draw(st.sampled_from([seq, seq + 3])) if seq > 1 and draw(st.booleans()) else draw(st.sampled_from([1, seq, seq + 2]))
    return dims, head_dim, n_rot, rows


@pytest.mark.parametrize("layout", ["sx", "bsx", "bhsd"])
@e2e_settings(2)
@given(data=st.data(), table_kind=weight_kinds, seed=seeds)
def test_rope(layout: str, data: st.DataObject, table_kind: str, seed: int) -> None:
    """NeoX rotate-half on `[S, H*D]`, `[B, S, H*D]` and `[B, H, S, D]`, full and partial
    rotary; tables longer than S or one broadcast row."""
    dims, head_dim, n_rot, rows = data.draw(rope_cases(layout))
    rng = rng_for(seed)
    cos_t, sin_t = rope_tables(rows, head_dim)
    f = Feeds("rope")
    x = f.input("x", normal(rng, dims))
    cos = f.leaf(table_kind, "cos", cos_t)
    sin = f.leaf(table_kind, "sin", sin_t)
    f.verify([f.graph.rope(x, cos, sin, head_dim, n_rot, name="rope")])


# ------------------------------------------------------------------------------ fused attention


def key_padding_mask(rng: np.random.Generator, batch: int, keys: int) -> np.ndarray:
    """1 = attend; every row keeps at least one key (fully masked rows: fp16 hazard tests)."""
    mask = (rng.random((batch, keys)) > 0.3).astype(np.float32)
    mask[:, 0] = 1.0
    return mask


@pytest.mark.parametrize(("has_bias", "has_rope"), [(False, False), (True, False), (False, True), (True, True)])
@e2e_settings(2)
@given(
    batch=st.integers(1, 2),
    seq=st.integers(1, 4),
    heads=st.integers(1, 2),
    head_dim=st.sampled_from([2, 4]),
    weight_kind=weight_kinds,
    seed=seeds,
)
def test_fused_attention_block(
    has_bias: bool, has_rope: bool, batch: int, seq: int, heads: int, head_dim: int, weight_kind: str, seed: int
) -> None:
    """QKV projection (+bias), optional rope, Custom-mask attention, output projection."""
    rng = rng_for(seed)
    embed = heads * head_dim
    f = Feeds("attention_block")
    hidden = f.input("hidden", normal(rng, (batch, seq, embed)))
    qkv_w = f.leaf(weight_kind, "qkv_w", normal(rng, (embed, 3 * embed), embed**-0.5))
    out_w = f.leaf(weight_kind, "out_w", normal(rng, (embed, embed), embed**-0.5))
    mask = f.input("mask", key_padding_mask(rng, batch, seq))
    qkv_b = f.leaf(weight_kind, "qkv_b", normal(rng, (3 * embed,), 0.1)) if has_bias else None
    out_b = f.leaf(weight_kind, "out_b", normal(rng, (embed,), 0.1)) if has_bias else None
    cos = sin = None
    if has_rope:
        cos_t, sin_t = rope_tables(seq + 1, head_dim)
        cos, sin = f.leaf(weight_kind, "cos", cos_t), f.leaf(weight_kind, "sin", sin_t)
    out = f.graph.fused_attention_block(hidden, qkv_w, out_w, mask, heads, head_dim, qkv_b, out_b, cos, sin,
                                        name="block")
    f.verify([out])


#: Activations a transformer FFN uses (the others are covered by FusedMatMulBiasAct).
FFN_ACTIVATIONS = (ActivationKind.GELU, ActivationKind.GELU_APPROX, ActivationKind.RELU, ActivationKind.SILU)


@pytest.mark.parametrize("form", ["biases", "betas", "bare"])
@e2e_settings(2)
@given(
    batch=st.integers(1, 2),
    seq=st.integers(1, 4),
    heads=st.integers(1, 2),
    head_dim=st.sampled_from([2, 4]),
    ffn=st.integers(2, 8),
    activation=st.sampled_from(FFN_ACTIVATIONS),
    eps=st.sampled_from([1e-12, 1e-5]),
    weight_kind=weight_kinds,
    seed=seeds,
)
def test_fused_transformer_layer(
    form: str, batch: int, seq: int, heads: int, head_dim: int, ffn: int, activation: ActivationKind,
    eps: float, weight_kind: str, seed: int,
) -> None:
    """Post-norm BERT layer in its three input forms: 14 (biases + betas), 10 (betas, no
    biases) and 8 (neither: zero betas)."""
    rng = rng_for(seed)
    embed = heads * head_dim
    f = Feeds("transformer_layer")
    w = {name: f.leaf(weight_kind, name, normal(rng, dims, dims[0] ** -0.5))
         for name, dims in (("qkv_w", (embed, 3 * embed)), ("out_w", (embed, embed)),
                            ("fc1_w", (embed, ffn)), ("fc2_w", (ffn, embed)))}
    gammas = {name: f.leaf(weight_kind, name, uniform(rng, (embed,), 0.5, 1.5)) for name in ("ln1_gamma", "ln2_gamma")}
    optional: dict[str, int] = {}
    if form in ("biases", "betas"):
        optional.update({name: f.leaf(weight_kind, name, normal(rng, (embed,), 0.3)) for name in ("ln1_beta", "ln2_beta")})
    if form == "biases":
        for name, width in (("qkv_b", 3 * embed), ("out_b", embed), ("fc1_b", ffn), ("fc2_b", embed)):
            optional[name] = f.leaf(weight_kind, name, normal(rng, (width,), 0.1))
    hidden = f.input("hidden", normal(rng, (batch, seq, embed)))
    mask = f.input("mask", key_padding_mask(rng, batch, seq))
    out = f.graph.fused_transformer_layer(
        hidden, mask, num_heads=heads, head_dim=head_dim, eps1=eps, eps2=eps, activation=activation,
        name="layer", **w, **gammas, **optional,
    )
    f.verify([out])


# ------------------------------------------------------------------------------ attention smoke


def test_attention_smoke() -> None:
    """One causal `[B, S, H*D]` self-attention and one Custom-mask decode step (full suites
    for Attention live in the attention tests)."""
    rng = rng_for(11)
    f = Feeds("attention_smoke")
    q = f.input("q", normal(rng, (2, 3, 8)))
    k = f.input("k", normal(rng, (2, 3, 8)))
    v = f.input("v", normal(rng, (2, 3, 8)))
    causal = f.graph.attention_kind(q, k, v, 2, 4, "causal", name="causal")
    q1 = f.input("q_step", normal(rng, (2, 1, 8)))
    mask = f.input("mask", key_padding_mask(rng, 2, 3))
    custom = f.graph.attention(q1, k, v, mask, 2, 4, name="custom")
    f.verify([causal, custom])


def test_attention_backward_smoke() -> None:
    """dQ, dK, dV of causal `[B, H, S, D]` attention (full suite lives elsewhere)."""
    rng = rng_for(12)
    f = Feeds("attention_backward_smoke")
    q, k, v, dy = (f.input(name, normal(rng, (1, 2, 3, 4))) for name in ("q", "k", "v", "dy"))
    grads = f.graph.attention_backward_all(q, k, v, dy, 2, 4, "causal", names=("dq", "dk", "dv"))
    f.verify(list(grads))
