"""Catalogue cases of the attention op family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph


def _attention() -> Graph:
    g = Graph("attention")
    q, k, v = g.input("q", [1, 8, 32]), g.input("k", [1, 8, 16]), g.input("v", [1, 8, 16])
    g.set_outputs([g.attention_kind(q, k, v, 4, 8, "causal", name="y")])
    return g


def _attention_backward() -> Graph:
    g = Graph("attention_backward")
    q, k, v, dy = (g.input(n, [1, 2, 4, 8]) for n in ("q", "k", "v", "dy"))
    g.set_outputs(list(g.attention_backward_all(q, k, v, dy, 2, 8, "causal")))
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "attention": _attention,
    "attention_backward": _attention_backward,
}
