"""Catalogue cases of the norm op family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph


def _norms() -> Graph:
    g = Graph("norms")
    x = g.input("x", [2, 3, 8])
    r = g.input("r", [2, 3, 8])
    gamma, beta = g.param("gamma", [8]), g.param("beta", [8])
    a = g.layer_norm(x, gamma, beta)
    b = g.rms_norm(a, gamma, beta)
    c = g.fused_residual_ln(b, r, gamma, beta)
    g.set_outputs([g.fused_residual_rms_norm(c, r, gamma, beta, bias=g.param("bias", [8]), name="y")])
    return g


def _group_norm() -> Graph:
    g = Graph("group_norm")
    x = g.input("x", [2, 4, 3, 3])
    g.set_outputs([g.group_norm(x, g.param("gamma", [4]), g.param("beta", [4]), 2, name="y")])
    return g


def _batch_norm_layer_norm_2d() -> Graph:
    g = Graph("batch_norm_layer_norm_2d")
    x = g.input("x", [2, 3, 4, 4])
    c = [g.param(name, [3]) for name in ("gamma", "beta")]
    stats = [g.param(name, [4]) for name in ("g4", "b4", "mean", "var")]
    normed = g.layer_norm_2d(x, *c)
    g.set_outputs([g.batch_norm_inference(normed, *stats, name="y")])
    return g


def _ada_layer_norm_gated_residual() -> Graph:
    g = Graph("ada_layer_norm_gated_residual")
    x = g.input("x", [2, 3, 8])
    scale, shift, gate = (g.input(name, [2, 1, 8]) for name in ("scale", "shift", "gate"))
    modulated = g.ada_layer_norm(x, scale, shift, "layer_norm")
    rms = g.ada_layer_norm(modulated, scale, shift, "rms_norm")
    g.set_outputs([g.gated_residual(x, rms, gate, name="y")])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "norms": _norms,
    "group_norm": _group_norm,
    "batch_norm_layer_norm_2d": _batch_norm_layer_norm_2d,
    "ada_layer_norm_gated_residual": _ada_layer_norm_gated_residual,
}
