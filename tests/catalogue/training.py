"""Catalogue cases of the losses and training pieces."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_mil.ir.graph import Graph


def _losses() -> Graph:
    g = Graph("losses_and_gradients")
    logits, targets = g.input("logits", [4, 6]), g.input("targets", [4, 6])
    labels = g.constant(np.array([0, 5, 2, 3], np.float32))
    x = g.input("x", [3, 5])
    g.set_outputs([
        *_backward_pieces(g),
        g.softmax_cross_entropy(logits, targets, name="soft"),
        g.softmax_cross_entropy_with_logits(logits, labels, name="hard"),
        g.fake_quantize_lsq(x, g.constant(np.array([0.1, 0.25, 0.05, 0.5, 0.2], np.float32)), 4, axis=1, name="lsq"),
        g.fake_quantize_lsq(x, g.constant(np.array([0.02], np.float32)), 8, name="lsq_tensor"),
    ])
    return g


def _backward_pieces(g: Graph) -> list[int]:
    x, dy = g.input("act_x", [2, 3, 8]), g.input("dy", [2, 3, 8])
    table_grad = g.gather_backward(g.input("rows", [2, 3, 4]), g.constant(np.array([[1, 0, 1], [4, 2, 1]], np.int32)),
                                   [5, 4], name="table")
    return [
        g.relu_backward(x, dy, name="relu"),
        g.activation_backward(x, dy, "Gelu", name="gelu"),
        g.activation_backward(x, dy, "Silu", name="silu"),
        g.activation_backward(x, dy, "GeluApprox", name="gelu_tanh"),
        g.cumsum_backward(dy, 1, name="cumsum"),
        g.cumsum_backward(dy, -1, exclusive=True, name="cumsum_exclusive"),
        table_grad,
        g.rope_backward(dy, g.input("cos", [3, 2]), g.input("sin", [3, 2]), 4, name="rope"),
    ]


CASES: dict[str, Callable[[], Graph]] = {
    "losses_and_gradients": _losses,
}
