"""Catalogue cases of the random op family."""

from __future__ import annotations

from collections.abc import Callable

from catalogue import Row
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Precision


def _generators() -> Graph:
    g = Graph("generators")
    x = g.input("x", [2, 3])
    normal = g.rng_normal([2, 3], 0.5, 2.0, key=7, template=x, name="normal")
    uniform = g.rng_uniform([4], -1.0, 3.0, key=2**64 - 1, op_seed=3.0, name="uniform")
    g.set_outputs([g.add(x, normal, name="y"), uniform])
    return g


def _sampling() -> Graph:
    g = Graph("sampling")
    logits = g.input("logits", [3, 10])
    g.set_outputs([
        g.sample(logits, top_k=4, top_p=0.9, temperature=0.7, seed=5, name="nucleus"),
        g.sample(g.input("row", [6]), top_k=1, name="greedy"),
    ])
    return g


_RANDOM = ("random streams: the executor draws with NumPy, the reference with upstream's generator; tests/e2e/test_rng_e2e.py compares their distributions")

CASES: dict[str, Callable[[], Graph] | Row] = {
    "generators": Row(_generators, differs={Precision.FP32: _RANDOM, Precision.FP16: _RANDOM}),
    "sampling": Row(_sampling, differs={Precision.FP32: _RANDOM, Precision.FP16: _RANDOM}),
}
