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


def _scans_and_sorting() -> Graph:
    g = Graph("scans_and_sorting")
    x = g.input("x", [2, 5])
    c = g.cummax(g.cumprod(x, -1), 1, exclusive=True)
    outs = [g.argmax(c, 1, name="amax"), g.argmin(x, 0, keep_dim=True, name="amin"),
            g.sort(x, 1, descending=True, name="sorted"), g.argsort(x, 1, name="order")]
    g.set_outputs(outs)
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "reductions": _reductions,
    "scans_and_sorting": _scans_and_sorting,
}
