"""Catalogue cases of the control op family."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import ActivationKind, BinaryOp, ChainOperand, ChainSource, ChainStep


def _body(name: str, activation: str) -> Graph:
    body = Graph(name)
    a = body.input("a", [4])
    body.set_outputs([body.activation(activation, a)])
    return body


def _control_flow() -> Graph:
    g = Graph("control_flow")
    pred, x = g.input("pred", [1], "bool"), g.input("x", [4])
    chosen = g.if_(pred, _body("then", "relu"), _body("else", "neg"), [x])
    cond = Graph("cond")
    c = cond.input("c", [4])
    cond.set_outputs([cond.lt_(cond.sum(c, [0]), cond.constant(np.array(10.0, np.float32)))])
    looped = g.while_(cond, _body("step", "exp"), [chosen], 3)
    step = Graph("step")
    carry, row = step.input("carry", [4]), step.input("row", [4])
    step.set_outputs([step.add(carry, row)])
    scanned = g.scan(step, looped, [g.input("xs", [3, 4])], 3)
    chain = [
        ChainStep("Binary", BinaryOp.ADD, (ChainOperand(ChainSource.INPUT, 0), ChainOperand(ChainSource.INPUT, 1))),
        ChainStep("Activation", ActivationKind.SILU, (ChainOperand(ChainSource.STEP, 0),)),
    ]
    region = g.elementwise_region([scanned, x], chain, [4])
    g.set_outputs([g.add(region, x, name="y")])
    return g


def _structure() -> Graph:
    g = Graph("structure")
    body = Graph("fwd")
    a, b = body.input("a", [1, 2, 3, 4]), body.input("b", [1, 2, 3, 4])
    body.set_outputs([body.mul(body.activation("Tanh", a), b)])
    vjp = Graph("vjp")
    vjp.set_outputs([vjp.input("d_output", [1, 2, 3, 4])])
    x, y = g.input("x", [1, 2, 3, 4]), g.input("y", [1, 2, 3, 4])
    fused = g.custom_fn(body, [x, y], vjp_body=vjp, name="custom")
    resized = g.transform_region([("Input", 0), ("Step", 0), ("Input", 1)], [fused, x])
    planes = [g.narrow(resized, 2, 0, 2), g.narrow(resized, 2, 2, 2)]
    chain = [
        ChainStep("Activation", ActivationKind.SIGMOID, (ChainOperand(ChainSource.INPUT, 0),)),
        ChainStep("Binary", BinaryOp.MUL, (ChainOperand(ChainSource.STEP, 0), ChainOperand(ChainSource.INPUT, 0))),
    ]
    batched = g.batch_elementwise_region(planes, chain, resize_prologue=True, name="batched")
    g.set_outputs([fused, g.transform_region([("Input", 0), ("Step", 0)], [fused], name="up4"), resized, batched])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "control_flow": _control_flow,
    "structure": _structure,
}
