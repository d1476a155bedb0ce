"""Catalogue cases of the moe op family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import QuantKind, QuantScheme


def _experts() -> Graph:
    g = Graph("experts")
    x, ids = g.input("x", [3, 32]), g.input("ids", [3])
    w = g.dequant_moe_weights(g.param("packed", [2 * 4 * 34], "u8"), QuantScheme(QuantKind.GGUF_Q8_0), 2, 32, 4)
    y = g.grouped_matmul(x, w, ids)
    z = g.dequant_grouped_matmul(x, g.param("packed2", [2 * 4 * 34], "u8"), ids, QuantScheme(QuantKind.GGUF_Q8_0), 4)
    g.set_outputs([g.add(y, z, name="y")])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "experts": _experts,
}
