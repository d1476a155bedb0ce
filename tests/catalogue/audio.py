"""Catalogue cases of the audio op family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph


def _log_mel() -> Graph:
    g = Graph("log_mel")
    spectrum = g.input("spectrum", [2, 3, 16])  # n_fft = 8: 5 one-sided bins
    g.set_outputs([g.log_mel(spectrum, g.param("filters", [4, 5]), name="y")])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "log_mel": _log_mel,
}
