"""Catalogue cases of the elementwise op family."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_mil.ir.graph import Graph


def _activation() -> Graph:
    g = Graph("activation")
    x = g.input("x", [2, 8])
    g.set_outputs([g.gelu(g.silu(g.tanh(x)), name="y")])
    return g


def _cast() -> Graph:
    g = Graph("cast")
    x = g.input("x", [2, 8])
    g.set_outputs([g.cast(g.cast(x, "f16"), "i32", name="y")])
    return g


def _binary() -> Graph:
    g = Graph("binary")
    x, y = g.input("x", [2, 3, 4]), g.constant(np.array([1.5, -2.0, 0.5, 3.0], np.float32))
    g.set_outputs([g.maximum(g.mul(x, y), g.div(x, y), name="z")])
    return g


def _compare_where() -> Graph:
    g = Graph("compare_where")
    x, y = g.input("x", [2, 4]), g.input("y", [2, 4])
    g.set_outputs([g.where_(g.lt_(x, y), x, y, name="z")])
    return g


def _newer_elementwise() -> Graph:
    g = Graph("newer_elementwise")
    x, y = g.input("x", [2, 8]), g.input("y", [2, 8])
    s = g.stop_gradient(g.clamp(g.mish(x), -1.0, 1.0))
    g.set_outputs([g.fma(s, g.atan2(x, y), g.mod(x, y), name="z")])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "activation": _activation,
    "cast": _cast,
    "binary": _binary,
    "compare_where": _compare_where,
    "newer_elementwise": _newer_elementwise,
}
