"""MatMul, LoraMatMul, FusedMatMulBiasAct and the fused blocks, against loop oracles and
float64 compositions of the oracles."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from oracles import attention_oracle, layer_norm_oracle, rope_oracle
from refgraph import run_kernel, run_op

from rlx_mil.errors import ArityError, ShapeError
from rlx_mil.ir import DType
from rlx_mil.ir.ops import (
    ActivationKind,
    FusedAttentionBlock,
    FusedMatMulBiasAct,
    FusedSwiGLU,
    FusedTransformerLayer,
    LoraMatMul,
    MatMul,
)


def _matmul_loop(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    out = np.zeros((*batch, m, n))
    for idx in itertools.product(*(range(s) for s in batch)):
        ia = tuple(0 if a.shape[d] == 1 else idx[len(batch) - (a.ndim - 2) + d] for d in range(a.ndim - 2))
        ib = tuple(0 if b.shape[d] == 1 else idx[len(batch) - (b.ndim - 2) + d] for d in range(b.ndim - 2))
        for i in range(m):
            for j in range(n):
                out[(*idx, i, j)] = math.fsum(float(a[(*ia, i, p)]) * float(b[(*ib, p, j)]) for p in range(k))
    return out


@given(data=st.data())
def test_matmul_broadcasts_batch_dims(data: st.DataObject) -> None:
    batch = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2, max_side=3))
    m, k, n = (data.draw(st.integers(1, 4)) for _ in range(3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    a = rng.standard_normal((*batch.input_shapes[0], m, k)).astype(np.float32)
    b = rng.standard_normal((*batch.input_shapes[1], k, n)).astype(np.float32)
    y = run_kernel(MatMul(), [a, b], (*batch.result_shape, m, n))
    np.testing.assert_allclose(y, _matmul_loop(a, b), rtol=1e-5, atol=1e-5)


def test_matmul_through_graph_and_fp16() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 4)).astype(np.float16), rng.standard_normal((4, 5)).astype(np.float16)
    y = run_op(MatMul(), [a, b], [2, 3, 5], DType.F16)
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.astype(np.float64), _matmul_loop(a, b[None]), rtol=2e-3, atol=2e-3)
    with pytest.raises(ShapeError):
        run_kernel(MatMul(), [np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32)], [2, 5])


def test_lora_matmul() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    w, a, b = (rng.standard_normal(s).astype(np.float32) for s in ((4, 5), (4, 2), (2, 5)))
    y = run_op(LoraMatMul(0.5), [x, w, a, b], [2, 3, 5])
    want = _matmul_loop(x, w[None]) + 0.5 * _matmul_loop(_matmul_loop(x, a[None]), b[None])
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def _act(kind: ActivationKind | None, v: np.ndarray) -> np.ndarray:
    scalar = {
        None: lambda t: t,
        ActivationKind.GELU: lambda t: 0.5 * t * (1 + math.erf(t / math.sqrt(2))),
        ActivationKind.SILU: lambda t: t / (1 + math.exp(-t)),
        ActivationKind.RELU: lambda t: max(t, 0.0),
        ActivationKind.TANH: math.tanh,
    }[kind]
    return np.vectorize(scalar, otypes=[np.float64])(np.asarray(v, np.float64))


@pytest.mark.parametrize("act", [None, ActivationKind.GELU, ActivationKind.SILU, ActivationKind.RELU, ActivationKind.TANH])
def test_fused_matmul_bias_act(act: ActivationKind | None) -> None:
    rng = np.random.default_rng(2)
    x, w, bias = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 6)), rng.standard_normal(6)
    x, w, bias = x.astype(np.float32), w.astype(np.float32), bias.astype(np.float32)
    y = run_op(FusedMatMulBiasAct(act), [x, w, bias], [2, 3, 6])
    np.testing.assert_allclose(y, _act(act, _matmul_loop(x, w[None]) + bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gate_first", [False, True])
def test_fused_swiglu_halves(gate_first: bool) -> None:
    x = np.array([[1.0, 2.0, -1.0, 0.5]], np.float32)
    y = run_op(FusedSwiGLU(None, gate_first), [x], [1, 2])
    up, gate = ([-1.0, 0.5], [1.0, 2.0]) if gate_first else ([1.0, 2.0], [-1.0, 0.5])
    want = [u * g / (1 + math.exp(-g)) for u, g in zip(up, gate, strict=True)]
    np.testing.assert_allclose(y[0], want, rtol=1e-6)
    cast = run_op(FusedSwiGLU(DType.F16, gate_first), [x], [1, 2], DType.F16)
    assert cast.dtype == np.float16
    np.testing.assert_allclose(cast[0].astype(np.float64), want, rtol=1e-3)


# ------------------------------------------------------------------------------ fused blocks


def _block_oracle(
    hidden: np.ndarray, qkv_w: np.ndarray, out_w: np.ndarray, mask: np.ndarray, heads: int, head_dim: int,
    qkv_b: np.ndarray | None = None, out_b: np.ndarray | None = None,
    cos: np.ndarray | None = None, sin: np.ndarray | None = None,
) -> np.ndarray:
    width = heads * head_dim
    qkv = hidden.astype(np.float64) @ qkv_w + (0 if qkv_b is None else qkv_b)
    q, k, v = qkv[..., :width], qkv[..., width : 2 * width], qkv[..., 2 * width :]
    if cos is not None and sin is not None:
        q, k = rope_oracle(q, cos, sin, head_dim, head_dim), rope_oracle(k, cos, sin, head_dim, head_dim)
    a = attention_oracle(q, k, v, mask, num_heads=heads, head_dim=head_dim, kind="custom",
                         score_scale=float(np.float32(head_dim**-0.5)))
    return a @ out_w + (0 if out_b is None else out_b)


@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("has_rope", [False, True])
def test_fused_attention_block(has_bias: bool, has_rope: bool) -> None:
    rng = np.random.default_rng(3)
    b, s, heads, d = 2, 3, 2, 4
    e = heads * d
    hidden = rng.standard_normal((b, s, e)).astype(np.float32)
    qkv_w = (rng.standard_normal((e, 3 * e)) / 3).astype(np.float32)
    out_w = (rng.standard_normal((e, e)) / 3).astype(np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 1]], np.float32)
    extra: list[np.ndarray] = []
    qkv_b = out_b = cos = sin = None
    if has_bias:
        qkv_b, out_b = rng.standard_normal(3 * e).astype(np.float32), rng.standard_normal(e).astype(np.float32)
        extra += [qkv_b, out_b]
    if has_rope:
        angle = np.arange(5)[:, None] * 10000.0 ** (-np.arange(d // 2) / (d // 2))
        cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
        extra += [cos, sin]
    y = run_op(FusedAttentionBlock(heads, d, has_bias, has_rope), [hidden, qkv_w, out_w, mask, *extra], [b, s, e])
    want = _block_oracle(hidden, qkv_w, out_w, mask, heads, d, qkv_b, out_b, cos, sin)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("form", [14, 10, 8])
def test_fused_transformer_layer_forms(form: int) -> None:
    rng = np.random.default_rng(form)
    b, s, heads, d, inter = 2, 3, 2, 2, 6
    e = heads * d

    def rnd(*shape: int, scale: float = 0.5) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    hidden, qkv_w, out_w, fc1_w, fc2_w = rnd(b, s, e, scale=1.0), rnd(e, 3 * e), rnd(e, e), rnd(e, inter), rnd(inter, e)
    qkv_b, out_b, fc1_b, fc2_b = rnd(3 * e), rnd(e), rnd(inter), rnd(e)
    ln1_g, ln1_b, ln2_g, ln2_b = rnd(e) + 1, rnd(e), rnd(e) + 1, rnd(e)
    mask = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
    eps1, eps2 = 1e-5, 1e-6
    op = FusedTransformerLayer(heads, d, inter, eps1, eps2, ActivationKind.GELU, form == 14)
    if form == 14:
        args = [hidden, qkv_w, qkv_b, out_w, out_b, ln1_g, ln1_b, fc1_w, fc1_b, fc2_w, fc2_b, ln2_g, ln2_b, mask]
    elif form == 10:
        args = [hidden, qkv_w, out_w, ln1_g, ln1_b, fc1_w, fc2_w, ln2_g, ln2_b, mask]
        qkv_b, out_b, fc1_b, fc2_b = np.zeros(3 * e), np.zeros(e), np.zeros(inter), np.zeros(e)
    else:
        args = [hidden, qkv_w, out_w, ln1_g, fc1_w, fc2_w, ln2_g, mask]
        qkv_b, out_b, fc1_b, fc2_b = np.zeros(3 * e), np.zeros(e), np.zeros(inter), np.zeros(e)
        ln1_b, ln2_b = np.zeros(e, np.float32), np.zeros(e, np.float32)
    y = run_op(op, args, [b, s, e])
    attn = _block_oracle(hidden, qkv_w, out_w, mask, heads, d, qkv_b, out_b)
    h1 = layer_norm_oracle(hidden + attn, ln1_g, ln1_b, float(np.float32(eps1)))
    f = _act(ActivationKind.GELU, h1 @ fc1_w + fc1_b) @ fc2_w + fc2_b
    want = layer_norm_oracle(h1 + f, ln2_g, ln2_b, float(np.float32(eps2)))
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_fused_transformer_layer_rejects_other_input_counts() -> None:
    op = FusedTransformerLayer(1, 2, 4, 1e-5, 1e-5, ActivationKind.GELU, False)
    with pytest.raises(ArityError):
        run_kernel(op, [np.zeros((1, 1, 2), np.float32)] * 9, [1, 1, 2])
