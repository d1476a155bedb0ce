"""Control flow read from upstream JSON (nested graphs, 0.2.2 and newest forms): it loads,
converts and verifies; hostile nesting and oversized bodies are typed errors naming the node."""

from __future__ import annotations

import json

import numpy as np
import pytest

from e2e.factory import rng_for, verify
from rlx_mil.errors import AttributeValueError, GraphFormatError
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.json_io import JsonLimits, graph_from_json
from rlx_mil.ir.ops.control import MAX_SUBGRAPH_DEPTH
from rlx_mil.lowering.target import Target
from rlx_mil.reference import evaluate

_STATIC4 = {"dims": [{"Static": 4}], "dtype": "F32"}


def _node(i: int, op: object, inputs: list[int], shape: dict[str, object] | None = None, name: str | None = None) -> dict[str, object]:
    return {"id": i, "op": op, "inputs": inputs, "shape": shape or _STATIC4, "name": name, "origin": None}


def _branch(name: str, activation: str) -> dict[str, object]:
    return {"name": name, "nodes": [_node(0, {"Input": {"name": "a"}}, [], name="a"),
                                    _node(1, {"Activation": activation}, [0])], "outputs": [1]}


def _if_document() -> str:
    """The If of spec part 2, section 7.1 in a complete 0.2.2 document."""
    pred = _node(0, {"Input": {"name": "p"}}, [], {"dims": [{"Static": 1}], "dtype": "Bool"}, "p")
    x = _node(1, {"Input": {"name": "x"}}, [], name="x")
    node = _node(2, {"If": {"then_branch": _branch("then", "Relu"), "else_branch": _branch("else", "Neg")}}, [0, 1])
    return json.dumps({"name": "g", "nodes": [pred, x, node], "outputs": [2]}, separators=(",", ":"))


@pytest.mark.parametrize("truth", [True, False])
def test_the_spec_if_document_loads_converts_and_verifies(truth: bool) -> None:
    graph = graph_from_json(_if_document())
    assert graph.json_version == "0.2.2"
    x = np.array([1.5, -2.0, 0.25, -0.5], np.float32)
    feeds = {"p": np.array([truth]), "x": x}
    got = next(iter(evaluate(graph, feeds).values()))
    np.testing.assert_array_equal(got, np.maximum(x, 0) if truth else -x)
    verify(graph, feeds)


def _loops_graph() -> Graph:
    """While and Scan with bodies, and an If with two captures (newest-only arity)."""
    g = Graph("loops")
    x, xs, pred = g.input("x", [3]), g.input("xs", [4, 3]), g.input("pred", [1], "bool")
    cond = Graph("cond")
    c = cond.input("c", [3])
    cond.set_outputs([cond.lt_(cond.sum(c, [0]), cond.constant(np.array(6.0, np.float32)))])
    body = Graph("body")
    b = body.input("c", [3])
    body.set_outputs([body.add(b, body.constant(np.array(0.5, np.float32)))])
    looped = g.while_(cond, body, [x], 10)
    step = Graph("step")
    carry, row = step.input("carry", [3]), step.input("row", [3])
    step.set_outputs([step.mul(step.tanh(carry), row)])
    scanned = g.scan(step, looped, [xs], 4)
    pick = Graph("pick")
    a, c2 = pick.input("a", [3]), pick.input("b", [3])
    other = Graph("other")
    a2, _ = other.input("a", [3]), other.input("b", [3])
    pick.set_outputs([pick.sub(a, c2)])
    other.set_outputs([other.neg(a2)])
    g.set_outputs([g.if_(pred, pick, other, [scanned, looped], name="y")])
    return g


@pytest.mark.parametrize("version", ["0.2.2", "newest"])
def test_loops_round_trip_through_json_and_verify(version: str) -> None:
    rng = rng_for(2)
    feeds = {"x": rng.uniform(0, 1, 3).astype(np.float32), "xs": rng.standard_normal((4, 3)).astype(np.float32),
             "pred": np.array([True])}
    built = _loops_graph()
    text = built.to_json(version=version)
    loaded = Graph.from_json(text)
    assert loaded.to_json() == text
    want = evaluate(built, feeds)["y"]
    np.testing.assert_array_equal(evaluate(loaded, feeds)["y"], want)
    c = feeds["x"].astype(np.float64)
    for _ in range(10):
        if c.sum() >= 6:
            break
        c = c + 0.5
    looped, s = c, c
    for row in feeds["xs"]:
        s = np.tanh(s) * row
    np.testing.assert_allclose(want, s - looped, rtol=1e-5, atol=1e-6)
    verify(loaded, feeds)


def _nested(depth: int) -> Graph:
    """`depth` levels of bodies: each level's body is an If over the next level's."""
    def level(d: int) -> Graph:
        g = Graph(f"level{d}")
        p, x = g.input("p", [1], "bool"), g.input("x", [4])
        if d == 1:
            g.set_outputs([g.relu(x)])
        else:
            inner = level(d - 1)
            g.set_outputs([g.if_(p, inner, inner, [p, x])])
        return g

    g = Graph("nested")
    p, x = g.input("p", [1], "bool"), g.input("x", [4])
    body = level(depth)
    g.set_outputs([g.if_(p, body, body, [p, x], name="y")])
    return g


def test_nesting_depth_is_bounded() -> None:
    deep = _nested(4)
    feeds = {"p": np.array([True]), "x": np.array([1.0, -1.0, 2.0, -2.0], np.float32)}
    np.testing.assert_array_equal(evaluate(deep, feeds)["y"], [1.0, 0.0, 2.0, 0.0])
    verify(deep, feeds, targets=[Target.IOS18])
    text = deep.to_json()
    assert graph_from_json(text, limits=JsonLimits(max_subgraph_depth=4)).to_json() == text
    with pytest.raises(GraphFormatError, match=r"nodes\[2\]\.op\.If\.then_branch: .*bodies nest more than 3 deep"):
        graph_from_json(text, limits=JsonLimits(max_subgraph_depth=3))
    _nested(MAX_SUBGRAPH_DEPTH)
    with pytest.raises(AttributeValueError, match=f"more than the {MAX_SUBGRAPH_DEPTH} rlx_mil accepts"):
        _nested(MAX_SUBGRAPH_DEPTH + 1)


def test_body_sizes_are_bounded_and_bad_bodies_name_the_node() -> None:
    text = _if_document()
    with pytest.raises(GraphFormatError, match=r"else_branch\.nodes: the bodies hold more than 3 nodes together"):
        graph_from_json(text, limits=JsonLimits(max_subgraph_nodes=3))
    doc = json.loads(text)
    doc["nodes"][2]["op"]["If"]["else_branch"]["nodes"][0]["op"] = {"Param": {"name": "w"}}
    with pytest.raises(GraphFormatError, match=r"nodes\[2\].*else_branch has 0 Input nodes but receives 1 operands"):
        graph_from_json(json.dumps(doc))
    doc = json.loads(text)
    doc["nodes"][2]["op"]["If"]["then_branch"]["nodes"][0]["shape"] = {"dims": [{"Static": 5}], "dtype": "F32"}
    doc["nodes"][2]["op"]["If"]["then_branch"]["nodes"][1]["shape"] = {"dims": [{"Static": 5}], "dtype": "F32"}
    with pytest.raises(GraphFormatError, match=r"nodes\[2\].*then_branch input 0 is declared F32\[5\]"):
        graph_from_json(json.dumps(doc))
    doc = json.loads(text)
    doc["nodes"][2]["op"]["If"]["then_branch"] = [1, 2]
    with pytest.raises(GraphFormatError, match=r"nodes\[2\]\.op\.If\.then_branch: expected a graph object"):
        graph_from_json(json.dumps(doc))
