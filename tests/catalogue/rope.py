"""Catalogue cases of the rope op family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph


def _rope() -> Graph:
    g = Graph("rope")
    x = g.input("x", [1, 4, 16])
    g.set_outputs([g.rope(x, g.param("cos", [4, 4]), g.param("sin", [4, 4]), 8, name="y")])
    return g


def _axial_rope2d() -> Graph:
    g = Graph("axial_rope2d")
    x = g.input("x", [2, 12, 16])
    g.set_outputs([g.axial_rope2d(x, 3, 2, 8, num_heads=2, theta=100.0, repeat_factor=2, name="y")])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "rope": _rope,
    "axial_rope2d": _axial_rope2d,
}
