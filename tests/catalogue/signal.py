"""Catalogue cases of the signal family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph


def _signal() -> Graph:
    g = Graph("signal")
    x = g.input("x", [2, 3, 5, 6])
    g.set_outputs([
        g.histogram(x, 8, -2.0, 2.0, name="hist"),
        g.spline_activation(g.input("h", [4, 3]), g.param("coeff", [3, 5]), 5, -2.0, 2.0, name="kan"),
        g.im2col(x, [3, 2], stride=[2, 1], padding=[1, 0], dilation=[1, 2], name="cols"),
        g.partitioned_conv(g.input("sig", [2, 12]), g.param("ir", [5]), 4, name="conv"),
        g.fft(g.input("spec", [3, 16]), name="fft"),
        g.fft(g.input("spec2", [2, 1, 12]), inverse=True, norm="Forward", name="ifft"),
        g.fft_butterfly_stage(g.input("state", [2, 16]), g.constant([1.0, 0.0, 1.0, 1.0]),
                              g.constant([0.0, 0.0, 1.0, 0.0]), g.input("tw_re", [4]), g.input("tw_im", [4]), 1, 8,
                              name="butterfly"),
        g.complex_norm_sq(g.input("z", [2, 3, 8]), name="norm_sq"),
        g.conjugate(g.input("zc", [3, 10]), name="conj"),
        g.welch_peaks(g.input("segs", [4, 16]), 3, 2, name="peaks"),
    ])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "signal": _signal,
}
