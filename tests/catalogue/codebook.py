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


def _synth_split() -> Graph:
    """Codes of 5 and 7 bits (29 and 100 entries), which iOS18+ holds split (a 4- / 6-bit vector
    LUT of entry pairs and a 1-bit select)."""
    g = Graph("synth_split")
    rng = np.random.default_rng(11)
    x = g.input("x", [2, 12])
    outs = []
    for entries, d in ((29, 3), (100, 2)):
        indices = rng.integers(0, entries, size=(5, 12 // d))
        indices[0, 0], indices[-1, -1] = entries - 1, 0
        idx = g.constant(indices.astype(np.uint8), "u8")
        outs.append(g.synth_matmul(x, idx, g.param(f"codebook{entries}", [entries, d]), d, entries, name=f"y{entries}"))
    g.set_outputs(outs)
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "synth": _synth,
    "synth_split": _synth_split,
}
