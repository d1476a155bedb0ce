"""Catalogue cases of the resample op family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph


def _resize_nearest_2x() -> Graph:
    g = Graph("resize_nearest_2x")
    g.set_outputs([g.resize_nearest_2x(g.input("x", [1, 2, 3, 4]), name="y")])
    return g


def _interpolate3d() -> Graph:
    g = Graph("interpolate3d")
    g.set_outputs([g.interpolate3d(g.input("x", [1, 2, 2, 3, 4]), [3, 3, 2], name="y")])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "resize_nearest_2x": _resize_nearest_2x,
    "interpolate3d": _interpolate3d,
}
