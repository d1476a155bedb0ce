"""Catalogue cases of the scatter op family."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_mil.ir.graph import Graph


def _scatters() -> Graph:
    g = Graph("scatters")
    updates = g.input("updates", [3, 4])
    rows = g.constant(np.array([4, 0, 4], dtype=np.float32), name="rows")
    added = g.scatter_add(updates, rows, [6, 4], name="added")
    data = g.input("data", [6, 4])
    points = g.constant(np.array([[1, 2], [-1, 0]], dtype=np.int32), name="points")
    values = g.input("values", [2])
    nd = g.scatter_nd(data, points, values, "max", name="nd")
    along = g.constant(np.array([[0, 5, 2, 1]], dtype=np.float32), name="along")
    elements = g.scatter_elements(data, along, g.input("row", [1, 4]), axis=0, reduction="add", name="elements")
    g.set_outputs([added, nd, elements])
    return g


def _gathers() -> Graph:
    g = Graph("gathers")
    data = g.input("data", [2, 5, 3])
    ids = g.input("ids", [2, 4, 1], "i32")
    nd = g.gather_nd(data, ids, batch_dims=1, name="nd")
    along = g.constant(np.array([[[0, 2], [4, -1]], [[1, 1], [3, 0]]], dtype=np.float32), name="along")
    elements = g.gather_elements(data, along, axis=1, name="elements")
    g.set_outputs([nd, elements])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "scatters": _scatters,
    "gathers": _gathers,
}
