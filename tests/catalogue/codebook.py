"""Catalogue cases of the codebook-weight op family."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_mil.ir.graph import Graph


def _synth() -> Graph:
    g = Graph("synth")
    rng = np.random.default_rng(7)
    indices = g.constant(rng.integers(0, 12, size=(6, 4)).astype(np.uint8), "u8")
    known = g.synth_matmul(g.input("x", [3, 16]), indices, g.param("codebook", [12, 4]), 4, 12, name="y")
    run_time = g.synth_reconstruct(indices, g.input("live_codebook", [12, 4]), 4, 12, name="w")
    g.set_outputs([known, run_time])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "synth": _synth,
}
