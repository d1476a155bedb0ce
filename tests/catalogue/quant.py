"""Catalogue cases of the quant op family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph


def _quant() -> Graph:
    g = Graph("quantize_dequantize")
    x = g.input("x", [2, 4])
    q = g.quantize(x, [0.1, 0.2], [0, 1], axis=0)
    g.set_outputs([g.dequantize(q, [0.1, 0.2], [0, 1], axis=0, name="y")])
    return g


def _dequant_matmul() -> Graph:
    g = Graph("dequant_matmul")
    x = g.input("x", [2, 8])
    y = g.dequant_matmul(x, g.param("w", [8, 6], "i8"), g.param("s", [2, 6]), g.param("z", [2, 6]),
                         scheme="int8_block:4", name="y")
    g.set_outputs([y])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "quantize_dequantize": _quant,
    "dequant_matmul": _dequant_matmul,
}
