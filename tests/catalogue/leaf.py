"""Catalogue cases of the leaf ops (Input, Param, Constant)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_mil.ir.graph import Graph


def _leaves() -> Graph:
    g = Graph("leaves")
    x = g.input("x", [2, 3])
    w = g.param("w", [2, 3])
    c = g.constant(np.arange(6, dtype=np.float32).reshape(2, 3) / 4)
    g.set_outputs([g.add(g.add(x, w), c, name="y")])
    return g


CASES: dict[str, Callable[[], Graph]] = {"leaves": _leaves}
