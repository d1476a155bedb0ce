"""Catalogue cases of the reduce op family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph


def _reductions() -> Graph:
    g = Graph("reductions")
    x = g.input("x", [2, 3, 4])
    s = g.softmax(x, axis=1)
    c = g.cumsum(s, axis=-1, exclusive=True)
    g.set_outputs([g.sum(c, [0, 2], name="y"), g.topk(x, 2, name="k")])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "reductions": _reductions,
}
