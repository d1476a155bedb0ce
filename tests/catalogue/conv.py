"""Catalogue cases of the conv op family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph


def _conv_pool() -> Graph:
    g = Graph("conv_pool")
    x = g.input("x", [1, 2, 6, 6])
    c = g.conv(x, g.param("w", [4, 1, 3, 3]), stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=2)
    g.set_outputs([g.pool(c, "max", [2, 2], name="y")])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "conv_pool": _conv_pool,
}
