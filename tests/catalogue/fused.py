"""Catalogue cases of the fused op family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph


def _swiglu() -> Graph:
    g = Graph("swiglu")
    x = g.input("x", [2, 8])
    g.set_outputs([g.fused_swiglu(x, name="y")])
    return g


def _attention_block() -> Graph:
    g = Graph("fused_attention_block")
    h, m = g.input("h", [1, 4, 16]), g.input("mask", [1, 4])
    y = g.fused_attention_block(h, g.param("qkv", [16, 48]), g.param("out", [16, 16]), m, 2, 8, name="y")
    g.set_outputs([y])
    return g


def _transformer_layer() -> Graph:
    g = Graph("fused_transformer_layer")
    h, m = g.input("h", [1, 4, 16]), g.input("mask", [1, 4])
    y = g.fused_transformer_layer(
        h, m, qkv_w=g.param("qkv", [16, 48]), out_w=g.param("out", [16, 16]), ln1_gamma=g.param("g1", [16]),
        fc1_w=g.param("fc1", [16, 32]), fc2_w=g.param("fc2", [32, 16]), ln2_gamma=g.param("g2", [16]),
        num_heads=2, head_dim=8, name="y",
    )
    g.set_outputs([y])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "swiglu": _swiglu,
    "attention_block": _attention_block,
    "transformer_layer": _transformer_layer,
}
