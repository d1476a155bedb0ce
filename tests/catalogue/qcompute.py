"""Catalogue cases of the quantized-compute op family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph


def _qmatmul() -> Graph:
    g = Graph("qmatmul")
    x = g.input("x", [3, 8], "i8")
    y = g.qmatmul(x, g.param("w", [8, 4], "i8"), g.param("bias", [4], "i32"), x_zp=3, w_zp=-1, out_zp=-5,
                  mult=0.0123, name="y")
    g.set_outputs([y])
    return g


def _qconv2d() -> Graph:
    g = Graph("qconv2d")
    x = g.input("x", [1, 4, 5, 6], "i8")
    y = g.qconv2d(x, g.param("w", [6, 2, 3, 3], "i8"), g.param("bias", [6], "i32"), stride=(2, 1),
                  padding=(1, 1), groups=2, x_zp=-2, w_zp=1, out_zp=4, mult=0.02, name="y")
    g.set_outputs([y])
    return g


def _fake_quantize() -> Graph:
    g = Graph("fake_quantize")
    x = g.input("x", [3, 5])
    per_batch = g.fake_quantize(x, 8, axis=0, name="per_batch")
    fixed = g.fake_quantize(x, 4, None, state=g.input("scale", [1]), scale_mode="Fixed", name="fixed")
    ema = g.fake_quantize(x, 2, 1, state=g.input("ema", [5]), scale_mode="EMA", decay=0.9, ste="Tanh", name="ema")
    g.set_outputs([per_batch, fixed, ema])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "qmatmul": _qmatmul,
    "qconv2d": _qconv2d,
    "fake_quantize": _fake_quantize,
}
