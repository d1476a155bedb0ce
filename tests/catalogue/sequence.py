"""Catalogue cases of the sequence op family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph


def _kv_append_and_roll() -> Graph:
    g = Graph("kv_append_roll")
    cache, row = g.input("cache", [1, 2, 6, 4]), g.input("row", [1, 2, 1, 4])
    appended = g.kv_append(cache, row, 2, 3)
    g.set_outputs([g.roll(appended, [1, -3], [2, 3], name="y")])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "kv_append_roll": _kv_append_and_roll,
}
