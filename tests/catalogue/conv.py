"""Catalogue cases of the conv op family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph


def _conv_pool() -> Graph:
    g = Graph("conv_pool")
    x = g.input("x", [1, 2, 6, 6])
    c = g.conv(x, g.param("w", [4, 1, 3, 3]), stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=2)
    g.set_outputs([g.pool(c, "max", [2, 2], name="y")])
    return g


def _conv_transpose_2d_3d() -> Graph:
    g = Graph("conv_transpose_2d_3d")
    x = g.input("x", [1, 2, 3, 3])
    up = g.conv_transpose2d(x, g.param("w2", [2, 3, 3, 3]), stride=2, padding=1, output_padding=1)
    v = g.input("v", [1, 2, 2, 2, 2])
    g.set_outputs([up, g.conv_transpose3d(v, g.param("w3", [2, 2, 2, 2, 2]), stride=2, name="y3")])
    return g


def _conv3d_fused_conv_bias_act() -> Graph:
    g = Graph("conv3d_fused_conv_bias_act")
    v = g.input("v", [1, 2, 3, 4, 4])
    c3 = g.conv3d(v, g.param("w3", [4, 2, 3, 3, 3]), stride=[1, 2, 2], padding=1, name="c3")
    x = g.input("x", [1, 2, 5, 5])
    r = g.input("r", [1, 4, 5, 5])
    fused = g.fused_conv_bias_act(x, g.param("w", [4, 2, 3, 3]), g.param("b", [4]), "relu", residual=r,
                                  padding=1, name="fused")
    g.set_outputs([c3, fused])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "conv_pool": _conv_pool,
    "conv_transpose_2d_3d": _conv_transpose_2d_3d,
    "conv3d_fused_conv_bias_act": _conv3d_fused_conv_bias_act,
}
