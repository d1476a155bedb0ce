"""Catalogue cases of the linalg op family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph


def _matmul() -> Graph:
    g = Graph("matmul")
    x = g.input("x", [2, 3, 8])
    g.set_outputs([g.matmul(x, g.param("w", [8, 4]), name="y")])
    return g


def _lora() -> Graph:
    g = Graph("lora")
    x = g.input("x", [2, 8])
    y = g.lora_matmul(x, g.param("w", [8, 4]), g.param("a", [8, 2]), g.param("b", [2, 4]), 0.5, name="y")
    g.set_outputs([y])
    return g


def _fused_mm() -> Graph:
    g = Graph("fused_matmul_bias_act")
    x = g.input("x", [2, 8])
    residual = g.fused_matmul_residual(x, g.param("w2", [8, 4]), g.input("skip", [2, 4]), name="with_skip")
    g.set_outputs([g.fused_matmul_bias_act(x, g.param("w", [8, 4]), g.param("b", [4]), "relu", name="y"), residual])
    return g


def _dot_general() -> Graph:
    g = Graph("dot_general")
    a, b = g.input("a", [2, 3, 4]), g.input("b", [2, 4, 5])
    g.set_outputs([g.dot_general(a, b, [2], [1], [0], [0], name="y")])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "matmul": _matmul,
    "lora": _lora,
    "fused_matmul_bias_act": _fused_mm,
    "dot_general": _dot_general,
}
