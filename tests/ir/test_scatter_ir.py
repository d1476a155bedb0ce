"""Scatter / gather ops in the IR: shape rules (typed errors naming the operand), builders, JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlx_mil.errors import AttributeValueError, DTypeError, GraphError, GraphFormatError, ShapeError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import ScatterNd, ScatterNdReduction
from rlx_mil.ir.shape import Static


def test_inferred_shapes() -> None:
    g = Graph()
    data = g.input("data", [2, 5, 3])
    ids = g.input("ids", [2, 4, 1], "i32")
    nd = g.gather_nd(data, ids, batch_dims=1)
    assert g.node(nd).shape.sizes() == (2, 4, 3)
    idx = g.input("idx", [2, 2, 3])
    el = g.gather_elements(data, idx, axis=-2)
    assert g.node(el).shape.sizes() == (2, 2, 3)
    up = g.input("up", [2, 2, 3])
    se = g.scatter_elements(data, idx, up, axis=1, reduction="Add")
    assert g.node(se).shape == g.node(data).shape
    assert g.node(se).op.reduction is ScatterNdReduction.ADD
    rows = g.input("rows", [4])
    sa = g.scatter_add(g.input("u", [4, 3]), rows, [7, 3])
    assert g.node(sa).shape.sizes() == (7, 3)
    pts = g.input("pts", [6, 2])
    sn = g.scatter_nd(data, pts, g.input("vals", [6, 3]), "min")
    assert g.node(sn).shape.sizes() == (2, 5, 3)


@pytest.mark.parametrize(
    ("build", "error", "operand", "match"),
    [
        (lambda g, d: g.scatter_add(g.input("u", [3, 2]), g.input("i", [4]), [5, 2]), ShapeError, "indices", "one index per slice"),
        (lambda g, d: g.scatter_add(g.input("u", [3, 2]), g.input("i", [3]), [5, 3]), ShapeError, "updates", "every dim but axis"),
        (lambda g, d: g.scatter_add(g.input("u", [3, 2]), g.input("i", [3, 1]), [5, 2]), ShapeError, "indices", "one-dimensional"),
        (lambda g, d: g.scatter_add(g.input("u", [3, 2]), g.input("i", [3], "bool"), [5, 2]), DTypeError, "indices", "integer"),
        (lambda g, d: g.scatter_add(g.input("u", [3, 2]), g.input("i", [3]), [5, 2], axis=2), AttributeValueError, "updates", "axis 2"),
        (lambda g, d: g.scatter_nd(d, g.input("i", [2, 4]), g.input("u", [2])), ShapeError, "indices", "1..3"),
        (lambda g, d: g.scatter_nd(d, g.input("i", [2, 1]), g.input("u", [2, 5])), ShapeError, "updates", "indices.shape"),
        (lambda g, d: g.scatter_nd(d, g.input("i", [2, 1]), g.input("u", [2, 5, 3], "f16")), DTypeError, "updates", "F16"),
        (lambda g, d: g.scatter_nd(d, g.input("i", [4]), g.input("u", [1]), "sum"), ShapeError, "indices", "hold 4 coordinates"),
        (lambda g, d: g.scatter_nd(d, g.input("i", [2, 1]), g.input("u", [2, 5, 3]), "median"), AttributeValueError, "reduction", "unknown reduction"),
        (lambda g, d: g.scatter_elements(d, g.input("i", [2, 6, 3]), g.input("u", [2, 6, 3]), 0), ShapeError, "indices", "dim 1"),
        (lambda g, d: g.scatter_elements(d, g.input("i", [2, 2]), g.input("u", [2, 2]), 0), ShapeError, "indices", "rank"),
        (lambda g, d: g.scatter_elements(d, g.input("i", [1, 1, 1]), g.input("u", [1, 2, 1]), 0), ShapeError, "updates", "shape of indices"),
        (lambda g, d: g.scatter_elements(d, g.input("i", [1, 1, 1]), g.input("u", [1, 1, 1]), 3), AttributeValueError, "data", "axis 3"),
        (lambda g, d: g.gather_nd(d, g.input("i", [3, 2]), batch_dims=1), ShapeError, "indices", "batch_dims"),
        (lambda g, d: g.gather_nd(d, g.input("i", [2, 3]), batch_dims=1), ShapeError, "indices", "1..2"),
        (lambda g, d: g.gather_nd(d, g.input("i", [])), ShapeError, "indices", "need rank > batch_dims 0"),
        (lambda g, d: g.gather_elements(d, g.input("i", [2, 5]), 0), ShapeError, "indices", "rank"),
        (lambda g, d: g.gather_elements(d, g.input("i", [3, 1, 1]), 1), ShapeError, "indices", "dim 0"),
        (lambda g, d: g.gather_elements(d, g.input("i", [1, 1, 1], "bool"), 1), DTypeError, "indices", "Bool"),
    ],
)
def test_bad_graphs_get_typed_errors_naming_the_operand(build, error, operand, match) -> None:  # type: ignore[no-untyped-def]
    g = Graph()
    data = g.input("data", [2, 5, 3])
    with pytest.raises(error, match=match) as info:
        build(g, data)
    assert isinstance(info.value, GraphError)
    assert info.value.operand == operand
    assert info.value.node is not None


def test_scatter_add_needs_a_declared_shape_and_f32_indices_must_stay_exact() -> None:
    g = Graph()
    u = g.input("u", [2])
    with pytest.raises(ShapeError, match="declared"):
        g.add_node(g.node(g.scatter_add(u, g.input("i", [2]), [3])).op, [u, 1])
    big = 2**24 + 1
    with pytest.raises(DTypeError, match="2\\^24"):
        g.scatter_add(u, g.input("f", [2]), [big])
    g.scatter_add(u, g.input("n", [2], "i32"), [big])  # integer indices address any row


def test_negative_batch_dims_counts_as_zero() -> None:
    g = Graph()
    nd = g.gather_nd(g.input("d", [4, 3]), g.input("i", [5, 1]), batch_dims=-2)
    assert g.node(nd).shape.sizes() == (5, 3)


def test_attributes_are_type_checked() -> None:
    g = Graph()
    d = g.input("d", [3])
    with pytest.raises(AttributeValueError, match="reduction"):
        g.add_node(ScatterNd("Add"), [d, g.input("i", [1, 1]), g.input("u", [1])])  # type: ignore[arg-type]


def test_json_round_trip_and_forms() -> None:
    g = Graph("sg")
    data = g.input("data", [2, 5, 3])
    idx = g.input("idx", [2, 2, 3], "i64")
    outs = [
        g.scatter_add(g.input("u", [4, 3]), g.input("rows", [4]), [7, 3], name="sa"),
        g.scatter_nd(data, g.input("pts", [6, 2]), g.input("vals", [6, 3]), "Mul", name="sn"),
        g.scatter_elements(data, idx, g.input("up", [2, 2, 3]), axis=-1, reduction="None", name="se"),
        g.gather_nd(data, g.input("ids", [2, 4, 1]), batch_dims=1, name="gn"),
        g.gather_elements(data, idx, axis=1, name="ge"),
    ]
    g.set_outputs(outs)
    text = g.to_json()
    ops_json = [n["op"] for n in json.loads(text)["nodes"] if n["name"] in ("sa", "sn", "se", "gn", "ge")]
    assert ops_json == [
        {"ScatterAdd": {"axis": 0}},
        {"ScatterNd": {"reduction": "Mul"}},
        {"ScatterElements": {"axis": -1, "reduction": "None"}},
        {"GatherNd": {"batch_dims": 1}},
        {"GatherElements": {"axis": 1}},
    ]
    again = Graph.from_json(text)
    assert again.to_json() == text
    assert again.node(outs[0]).shape.dims[0] == Static(7)
    assert again.node(outs[3]).shape.dtype is DType.F32


def test_json_rejects_unknown_reduction() -> None:
    g = Graph("bad")
    data = g.input("data", [3])
    g.set_outputs([g.scatter_nd(data, g.input("i", [1, 1]), g.input("u", [1]), name="s")])
    text = g.to_json().replace('"reduction":"None"', '"reduction":"Mean"')
    with pytest.raises(GraphFormatError, match="ScatterNdReduction"):
        Graph.from_json(text)


def test_constant_indices_keep_their_values() -> None:
    g = Graph()
    idx = g.constant(np.array([[0, 1]], np.int32))
    nd = g.gather_nd(g.input("d", [2, 2]), idx)
    assert g.node(nd).shape.sizes() == (1,)
