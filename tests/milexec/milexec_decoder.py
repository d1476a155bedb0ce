"""A Llama-style decoder stack built directly in MIL (for the executor's speed test), and the same
stack in NumPy float32 as its reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class DecoderSpec:
    layers: int
    hidden: int
    seq: int
    heads: int
    ffn: int


def make_weights(spec: DecoderSpec, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Random fp16 weights, scaled so activations stay O(1) through the stack."""
    rng = np.random.default_rng(seed)

    def matrix(out_dim: int, in_dim: int) -> np.ndarray:
        return (rng.standard_normal((out_dim, in_dim), dtype=np.float32) / np.sqrt(in_dim)).astype(np.float16)

    d, f = spec.hidden, spec.ffn
    return [
        {
            "norm1": (1 + 0.1 * rng.standard_normal(d)).astype(np.float16),
            "norm2": (1 + 0.1 * rng.standard_normal(d)).astype(np.float16),
            "q": matrix(d, d),
            "k": matrix(d, d),
            "v": matrix(d, d),
            "o": matrix(d, d),
            "gate": matrix(f, d),
            "up": matrix(f, d),
            "down": matrix(d, f),
        }
        for _ in range(spec.layers)
    ]


def build_decoder_program(spec: DecoderSpec, weights: list[dict[str, np.ndarray]]) -> Any:
    """[1, seq, hidden] fp32 input `x` -> fp32 output `y`. Per layer: RMSNorm as mul / reduce_mean /
    rsqrt / mul, q/k/v/o linear projections, causal softmax attention through matmul, a SwiGLU
    MLP with silu, residual adds."""
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Function, Program, types

    head_dim = spec.hidden // spec.heads
    causal = np.triu(np.full((spec.seq, spec.seq), -3e4, dtype=np.float16), k=1)
    scale = np.float16(1 / np.sqrt(head_dim))

    def rms_norm(h: Any, gamma: np.ndarray) -> Any:
        mean = mb.reduce_mean(x=mb.mul(x=h, y=h), axes=[-1], keep_dims=True)
        return mb.mul(x=mb.mul(x=h, y=mb.rsqrt(x=mean, epsilon=np.float16(1e-5))), y=gamma)

    def split_heads(t: Any) -> Any:
        return mb.transpose(x=mb.reshape(x=t, shape=[1, spec.seq, spec.heads, head_dim]), perm=[0, 2, 1, 3])

    inputs = {"x": mb.placeholder(shape=(1, spec.seq, spec.hidden), dtype=types.fp32)}
    with Function(inputs, opset_version=ct.target.iOS17) as fn:
        h = mb.cast(x=fn.inputs["x"], dtype="fp16")
        for w in weights:
            n = rms_norm(h, w["norm1"])
            q, k, v = (split_heads(mb.linear(x=n, weight=w[name])) for name in ("q", "k", "v"))
            scores = mb.add(x=mb.mul(x=mb.matmul(x=q, y=k, transpose_y=True), y=scale), y=causal)
            attn = mb.matmul(x=mb.softmax(x=scores, axis=-1), y=v)
            merged = mb.reshape(x=mb.transpose(x=attn, perm=[0, 2, 1, 3]), shape=[1, spec.seq, spec.hidden])
            h = mb.add(x=h, y=mb.linear(x=merged, weight=w["o"]))
            n = rms_norm(h, w["norm2"])
            gated = mb.mul(x=mb.silu(x=mb.linear(x=n, weight=w["gate"])), y=mb.linear(x=n, weight=w["up"]))
            h = mb.add(x=h, y=mb.linear(x=gated, weight=w["down"]))
        fn.set_outputs([mb.cast(x=h, dtype="fp32", name="y")])
    program = Program()
    program.add_function("main", fn)
    return program


def numpy_decoder(x: np.ndarray, spec: DecoderSpec, weights: list[dict[str, np.ndarray]]) -> np.ndarray:
    head_dim = spec.hidden // spec.heads
    causal = np.triu(np.full((spec.seq, spec.seq), -3e4, dtype=np.float32), k=1)

    def rms_norm(h: np.ndarray, gamma: np.ndarray) -> np.ndarray:
        return h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-5) * gamma

    def heads(t: np.ndarray) -> np.ndarray:
        return t.reshape(spec.seq, spec.heads, head_dim).transpose(1, 0, 2)

    h = x.reshape(spec.seq, spec.hidden).astype(np.float32)
    for w32 in ({k: v.astype(np.float32) for k, v in w.items()} for w in weights):
        n = rms_norm(h, w32["norm1"])
        q, k, v = (heads(n @ w32[name].T) for name in ("q", "k", "v"))
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(head_dim) + causal
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        h = h + (p @ v).transpose(1, 0, 2).reshape(spec.seq, spec.hidden) @ w32["o"].T
        n = rms_norm(h, w32["norm2"])
        gate = n @ w32["gate"].T
        h = h + (gate / (1 + np.exp(-gate)) * (n @ w32["up"].T)) @ w32["down"].T
    return h.reshape(1, spec.seq, spec.hidden)
