"""Catalogue cases of the audio op family."""

from __future__ import annotations

from collections.abc import Callable

from catalogue import Row
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Precision


def _log_mel() -> Graph:
    g = Graph("log_mel")
    spectrum = g.input("spectrum", [2, 3, 16])  # n_fft = 8: 5 one-sided bins
    g.set_outputs([g.log_mel(spectrum, g.param("filters", [4, 5]), name="y")])
    return g


CASES: dict[str, Callable[[], Graph] | Row] = {
    "log_mel": Row(_log_mel, differs={Precision.FP16: (
        "a standard-normal spectrum squared and summed overflows fp16 (NaN); tests/e2e/test_vision_audio_e2e.py"
        " checks fp16 on magnitudes a spectrum has"
    )}),
}
