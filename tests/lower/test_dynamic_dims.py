"""Graphs with dynamic dims convert once their symbols are bound."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.errors import ShapeError, UnsupportedOpError
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.shape import SEQ, Dynamic


def _graph() -> Graph:
    g = Graph("dyn")
    x = g.input("x", [1, Dynamic(SEQ), 8])
    w = g.param("w", [8, 4])
    g.set_outputs([g.relu(g.matmul(x, w), name="y")])
    return g


def test_unbound_dynamic_dims_are_a_typed_error() -> None:
    with pytest.raises(UnsupportedOpError, match="dims=") as err:
        rlx_mil.lower(_graph(), {"w": np.ones((8, 4), np.float32)})
    assert "dynamic shape" in str(err.value)


def test_bound_graph_converts_and_matches_reference() -> None:
    graph = _graph()
    params = {"w": np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)}
    x = np.random.default_rng(1).standard_normal((1, 5, 8)).astype(np.float32)
    model = rlx_mil.convert(graph, params, dims={SEQ: 5}, precision="fp32")
    try:
        got = milexec.run(model, {"x": x})["y"]
    finally:
        shutil.rmtree(model.package_path, ignore_errors=True)
    np.testing.assert_allclose(got, reference.evaluate(graph, {"x": x}, params)["y"], rtol=1e-5, atol=1e-6)


def test_bind_checks_every_symbol() -> None:
    with pytest.raises(ShapeError, match=r"no size given for dynamic symbols \[1\]"):
        _graph().bind({})
    with pytest.raises(ShapeError, match="must be an int >= 0"):
        _graph().bind({SEQ: -3})
    bound = _graph().bind({SEQ: 7})
    assert bound.node(0).shape.sizes() == (1, 7, 8)
    assert not bound.dynamic_symbols()
