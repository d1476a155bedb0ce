"""Catalogue cases of the shape op family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph


def _shapes() -> Graph:
    g = Graph("shapes")
    x = g.input("x", [2, 3, 4])
    t = g.transpose(g.reshape(x, [6, 4]), [1, 0])
    n = g.narrow(t, 1, 1, 4)
    c = g.concat([n, n], 0)
    e = g.expand(g.param("s", [1, 4]), [8, 4])
    ids = g.input("ids", [5], "i32")
    g.set_outputs([g.add(c, e, name="y"), g.gather(g.param("table", [10, 3]), ids, name="emb")])
    return g


def _structural() -> Graph:
    g = Graph("structural")
    x = g.input("x", [2, 3, 4])
    p = g.pad(x, [[0, 0], [1, 1], [2, 0]], "reflect")
    s = g.slice(p, 2, 5, 3, -2)
    t = g.tile(g.trilu(s, upper=False, diagonal=1), [1, 2, 1])
    g.set_outputs([g.reverse(t, [0, 2], name="y")])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "shapes": _shapes,
    "structural": _structural,
}
