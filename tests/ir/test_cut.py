"""`rlx_mil.ir.cut` on hand-built graphs: layer boundaries from numbered Param names, context
copied into each piece, values passed straight to the piece that reads them (a skip over a
piece included), and the pieces run one after another computing the whole graph."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_mil.errors import GraphError
from rlx_mil.ir import Graph
from rlx_mil.ir.cut import cut_graph, layer_segments
from rlx_mil.reference import evaluate

WIDTH = 4


def _graph(skip: bool = True, shared_state: bool = False) -> Graph:
    """tokens -> embed -> blk.0 -> blk.1 -> blk.2 -> head; blk.2 also reads blk.0's output
    (when `skip`); a `scale` table read at the position by every block (context)."""
    g = Graph("toy")
    ids = g.input("tokens", [1, 2], "i32")
    pos = g.input("pos", [1], "i32")
    table = g.param("embed.weight", [10, WIDTH])
    scale = g.gather(g.param("scale", [8, WIDTH]), pos, name="scale_row")
    state = g.input("state", [1, 2, WIDTH])
    x = g.gather(table, ids, name="embed")
    first = x
    for i in range(3):
        w = g.param(f"blk.{i}.w", [WIDTH, WIDTH])
        h = g.matmul(x, w, name=f"blk.{i}.mm")
        if i == 0 or (shared_state and i == 2):
            h = g.add(h, state, name=f"blk.{i}.state")
        h = g.mul(h, scale, name=f"blk.{i}.scaled")
        if i == 2 and skip:
            h = g.add(h, first, name="blk.2.skip")
        x = g.activation("tanh", h, name=f"blk.{i}.out")
        if i == 0:
            first = x
    head = g.matmul(x, g.param("head.weight", [WIDTH, 6]), name="logits")
    g.set_outputs([head])
    return g


def _run(graph: Graph, feeds: dict[str, np.ndarray], params: dict[str, np.ndarray], groups: list[int]) -> np.ndarray:
    pieces = cut_graph(graph, {"tokens", "state"}, groups)
    values = dict(feeds)
    for piece in pieces:
        inputs = {n.op.name for n in piece.graph if n.op.type_name == "Input"}
        values.update(evaluate(piece.graph, {k: values[k] for k in inputs}, {k: params[k] for k in piece.params}))
    return values["logits"]


def test_pieces_compute_the_whole_graph_and_pass_values_to_their_readers() -> None:
    graph = _graph()
    segments = layer_segments(graph, {"tokens", "state"})
    assert [s.layers for s in segments] == [("blk.0",), ("blk.1",), ("blk.2",)]
    assert "embed.weight" in segments[0].params and "head.weight" in segments[2].params
    assert "scale" in segments[0].params and "scale" in segments[2].params  # context: read by each
    rng = np.random.default_rng(0)
    params = {n.op.name: rng.standard_normal(n.shape.sizes()).astype(np.float32)
              for n in graph if n.op.type_name == "Param"}
    feeds = {"tokens": np.array([[3, 7]], np.int32), "pos": np.array([5], np.int32),
             "state": rng.standard_normal((1, 2, WIDTH)).astype(np.float32)}
    want = evaluate(graph, feeds, params)["logits"]
    for groups in ([1, 1, 1], [2, 1], [1, 2]):
        np.testing.assert_array_equal(_run(graph, feeds, params, groups), want)
    pieces = cut_graph(graph, {"tokens", "state"}, [1, 1, 1])
    # blk.0's output reaches blk.2 directly, not through piece 1
    assert pieces[2].received == {"blk_0_out": 0, "blk_1_out": 1} and pieces[1].received == {"blk_0_out": 0}
    assert pieces[0].passed == ("blk_0_out",) and pieces[1].passed == ("blk_1_out",) and not pieces[2].passed
    assert "embed.weight" not in pieces[1].params and "scale" in pieces[1].params
    inputs = [{n.op.name for n in p.graph if n.op.type_name == "Input"} for p in pieces]
    assert "tokens" in inputs[0] and "tokens" not in inputs[1] and "pos" in inputs[1]


def test_a_state_read_on_both_sides_of_a_boundary_is_an_error() -> None:
    graph = _graph(skip=False, shared_state=True)
    with pytest.raises(GraphError, match="'state' is read on both sides"):
        cut_graph(graph, {"tokens", "state"}, [1, 1, 1])
    with pytest.raises(GraphError, match="cannot be grouped"):
        cut_graph(graph, {"tokens", "state"}, [1, 1])


def test_a_graph_without_numbered_layers_is_one_segment() -> None:
    g = Graph("flat")
    x = g.input("tokens", [1, 2], "i32")
    y = g.gather(g.param("table", [10, WIDTH]), x)
    g.set_outputs([g.matmul(y, g.param("proj", [WIDTH, WIDTH]))])
    assert len(layer_segments(g, {"tokens"})) == 1
    with pytest.raises(GraphError, match="no Input named 'ids'"):
        layer_segments(g, {"ids"})
