"""Upstream's `Custom` ops: `onnx.ScatterND` is read as ScatterNd (reduction from its attrs
bytes, as upstream's Core ML backend reads them), `onnx.Mod` as Binary Mod and `onnx.IsNaN` as
x != x (upstream's host reference kernels, checked here against their formulas); other names
are refused by name."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_mil import milexec, reference
from rlx_mil.errors import GraphFormatError, UnsupportedOpFormatError
from rlx_mil.ir import ops
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.json_io import graph_from_json, graph_to_json

from .conftest import convert_and_cleanup


def _custom_json(custom: dict[str, object]) -> str:
    g = Graph("c")
    g.set_outputs([g.scatter_nd(g.input("data", [4, 3]), g.input("idx", [2, 1], dtype="I32"),
                                g.input("upd", [2, 3]), name="out")])
    doc = json.loads(graph_to_json(g))
    for node in doc["nodes"]:
        if isinstance(node["op"], dict) and "ScatterNd" in node["op"]:
            node["op"] = {"Custom": custom}
    return json.dumps(doc)


@settings(max_examples=5, deadline=None)
@given(code=st.integers(0, 4), short=st.booleans(), seed=st.integers(0, 2**16))
def test_onnx_scatter_nd_custom_reads_as_scatter_nd(code: int, short: bool, seed: int) -> None:
    attrs = [] if short else [*code.to_bytes(4, "little"), 9, 9]
    g = graph_from_json(_custom_json({"name": "onnx.ScatterND", "num_inputs": 3, "attrs": attrs}))
    (op,) = [n.op for n in g.nodes if isinstance(n.op, ops.ScatterNd)]
    want = ops.ScatterNdReduction.NONE if short else list(ops.ScatterNdReduction)[code]
    assert op.reduction is want
    rng = np.random.default_rng(seed)
    feeds = {"data": rng.standard_normal((4, 3)).astype(np.float32), "idx": np.asarray([[3], [1]], np.int32),
             "upd": rng.standard_normal((2, 3)).astype(np.float32)}
    expected = feeds["data"].copy()
    for row, at in zip(feeds["upd"], (3, 1), strict=True):
        expected[at] = {0: row, 1: expected[at] + row, 2: expected[at] * row, 3: np.maximum(expected[at], row),
                        4: np.minimum(expected[at], row)}[0 if short else code]
    np.testing.assert_allclose(reference.evaluate(g, feeds)["out"], expected, rtol=1e-6)
    got = milexec.run(convert_and_cleanup(g, {}, target="iOS18", precision="fp32"), feeds)["out"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("custom", [
    {"name": "collective.all_reduce", "num_inputs": 1, "attrs": []},
    {"name": "onnx.ScatterND", "num_inputs": 2, "attrs": []},
    {"name": "onnx.ScatterND", "num_inputs": 3, "attrs": [5, 0, 0, 0]},
    {"name": "onnx.NonZero", "num_inputs": 1, "attrs": []},  # one input declared, three given
    {"name": "onnx.Mod", "num_inputs": 3, "attrs": []},
])
def test_other_custom_ops_are_refused_by_name(custom: dict[str, object]) -> None:
    with pytest.raises(UnsupportedOpFormatError, match=r"Custom|reduction|takes 1 input"):
        graph_from_json(_custom_json(custom))


def test_custom_attrs_must_be_bytes() -> None:
    with pytest.raises(GraphFormatError, match="attrs"):
        graph_from_json(_custom_json({"name": "onnx.ScatterND", "num_inputs": 3, "attrs": [300]}))


def _elementwise_custom_json(name: str, num_inputs: int, attrs: list[int], out_dtype: str) -> str:
    def node(i: int, op: object, inputs: list[int], dtype: str = "F32") -> dict[str, object]:
        return {"id": i, "op": op, "inputs": inputs, "shape": {"dims": [{"Static": 2}, {"Static": 5}], "dtype": dtype},
                "name": "out" if i == 2 else None, "origin": None}

    nodes = [node(0, {"Input": {"name": "a"}}, []), node(1, {"Input": {"name": "b"}}, []),
             node(2, {"Custom": {"name": name, "num_inputs": num_inputs, "attrs": attrs}}, [0, 1][:num_inputs], out_dtype)]
    return json.dumps({"name": "c", "nodes": nodes, "outputs": [2]})


@settings(max_examples=3, deadline=None)
@given(fmod=st.booleans(), seed=st.integers(0, 2**16))
def test_onnx_mod_and_is_nan_read_as_their_ir_ops(fmod: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((2, 5)) * 10).astype(np.float32)
    b = rng.choice(np.array([-3.0, -0.5, 0.75, 2.0, 0.0], np.float32), size=(2, 5))
    a[0, 0] = np.nan
    mod = graph_from_json(_elementwise_custom_json("onnx.Mod", 2, [int(fmod)], "F32"))
    assert [type(n.op).__name__ for n in mod.nodes][-1] == "Binary"
    with np.errstate(all="ignore"):
        want = a - np.trunc(a / b) * b  # upstream's kernel (fmod = 0; Rust's f32 % for fmod = 1)
    got = reference.evaluate(mod, {"a": a, "b": b})["out"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    is_nan = graph_from_json(_elementwise_custom_json("onnx.IsNaN", 1, [], "Bool"))
    np.testing.assert_array_equal(reference.evaluate(is_nan, {"a": a, "b": b})["out"], np.isnan(a))
    for g, feeds in ((mod, {"a": a, "b": b}), (is_nan, {"a": a, "b": b})):
        want_all = reference.evaluate(g, feeds)["out"]
        got_all = milexec.run(convert_and_cleanup(g, {}, target="iOS18", precision="fp32"), feeds)["out"]
        np.testing.assert_allclose(np.asarray(got_all, np.float32), np.asarray(want_all, np.float32), rtol=1e-5,
                                   atol=1e-5, equal_nan=True)


def _upstream_gather_nd(data: np.ndarray, indices: np.ndarray, batch_dims: int) -> np.ndarray:
    """rlx-cpu's `gather_nd_src_offsets` + `copy_slices`, transcribed: indices truncated to i64,
    a negative one + dim, then clamped into [0, dim - 1]."""
    k, b = indices.shape[-1], batch_dims
    idx = np.trunc(indices.astype(np.float64)).astype(np.int64).reshape(int(np.prod(data.shape[:b])), -1, k)
    blocks = data.reshape(-1, *data.shape[b:])
    out = []
    for block, tuples in zip(blocks, idx, strict=True):
        for t in tuples:
            at = []
            for m, i in enumerate(t):
                dim = block.shape[m]
                i = i + dim if i < 0 else i
                at.append(min(max(i, 0), max(dim - 1, 0)))
            out.append(block[tuple(at)])
    return np.asarray(out, data.dtype).reshape(*indices.shape[:-1], *data.shape[b + k:])


@settings(max_examples=4, deadline=None)
@given(batch_dims=st.integers(0, 1), k=st.integers(1, 2), dtype=st.sampled_from(["I64", "I32", "F32"]),
       seed=st.integers(0, 2**16))
def test_onnx_gather_nd_reads_indices_as_upstreams_kernel(batch_dims: int, k: int, dtype: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    data_dims, index_dims = [2, 4, 3, 2], [2, 3, k]
    nodes = [
        {"id": 0, "op": {"Input": {"name": "data"}}, "inputs": [], "name": None, "origin": None,
         "shape": {"dims": [{"Static": d} for d in data_dims], "dtype": "F32"}},
        {"id": 1, "op": {"Input": {"name": "idx"}}, "inputs": [], "name": None, "origin": None,
         "shape": {"dims": [{"Static": d} for d in index_dims], "dtype": dtype}},
    ]
    out_dims = [*index_dims[:-1], *data_dims[batch_dims + k:]]
    nodes.append({"id": 2, "op": {"Custom": {"name": "onnx.GatherND", "num_inputs": 2,
                                             "attrs": [*batch_dims.to_bytes(4, "little"), 7]}},
                  "inputs": [0, 1], "name": "out", "origin": None,
                  "shape": {"dims": [{"Static": d} for d in out_dims], "dtype": "F32"}})
    g = graph_from_json(json.dumps({"name": "g", "nodes": nodes, "outputs": [2]}))
    data = rng.standard_normal(data_dims).astype(np.float32)
    numpy_type = {"I64": np.int64, "I32": np.int32, "F32": np.float32}[dtype]
    indices = rng.integers(-6, 7, size=index_dims).astype(numpy_type)  # out of range both ways
    if dtype == "F32":
        indices = indices + np.float32(0.5) * np.sign(indices)  # truncated toward zero
    feeds = {"data": data, "idx": indices}
    want = _upstream_gather_nd(data, indices, batch_dims)
    np.testing.assert_array_equal(reference.evaluate(g, feeds)["out"], want)
    got = milexec.run(convert_and_cleanup(g, {}, target="iOS18", precision="fp32"), feeds)["out"]
    np.testing.assert_array_equal(got, want)


@settings(max_examples=4, deadline=None)
@given(axis=st.integers(-4, 3), dtype=st.sampled_from(["I64", "F32"]), seed=st.integers(0, 2**16))
def test_onnx_gather_elements_reads_axis_and_indices_as_upstreams_kernel(axis: int, dtype: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    data_dims, index_dims = [3, 4, 2], [2, 3, 2]
    nodes = [
        {"id": 0, "op": {"Input": {"name": "data"}}, "inputs": [], "name": None, "origin": None,
         "shape": {"dims": [{"Static": d} for d in data_dims], "dtype": "F32"}},
        {"id": 1, "op": {"Input": {"name": "idx"}}, "inputs": [], "name": None, "origin": None,
         "shape": {"dims": [{"Static": d} for d in index_dims], "dtype": dtype}},
        {"id": 2, "op": {"Custom": {"name": "onnx.GatherElements", "num_inputs": 2,
                                    "attrs": list(axis.to_bytes(4, "little", signed=True))}},
         "inputs": [0, 1], "name": "out", "origin": None,
         "shape": {"dims": [{"Static": d} for d in index_dims], "dtype": "F32"}},
    ]
    g = graph_from_json(json.dumps({"name": "g", "nodes": nodes, "outputs": [2]}))
    data = rng.standard_normal(data_dims).astype(np.float32)
    indices = rng.integers(-7, 8, size=index_dims).astype(np.int64 if dtype == "I64" else np.float32)
    # rlx-cpu's gather_elements_f32: the axis wrapped once and clamped into the rank, each index
    # + dim when negative and clamped into [0, dim - 1].
    ax = min(max(axis + 3 if axis < 0 else axis, 0), 2)
    idx = np.trunc(indices).astype(np.int64)
    idx = np.clip(np.where(idx < 0, idx + data_dims[ax], idx), 0, data_dims[ax] - 1)
    want = np.take_along_axis(data[tuple(slice(0, n) if i != ax else slice(None) for i, n in enumerate(index_dims))],
                              idx, axis=ax)
    feeds = {"data": data, "idx": indices}
    np.testing.assert_array_equal(reference.evaluate(g, feeds)["out"], want)
    got = milexec.run(convert_and_cleanup(g, {}, target="iOS18", precision="fp32"), feeds)["out"]
    np.testing.assert_array_equal(got, want)


@settings(max_examples=3, deadline=None)
@given(axis=st.integers(-3, 2), dtype=st.sampled_from(["I64", "F32"]), seed=st.integers(0, 2**16))
def test_onnx_one_hot_fills_as_upstreams_kernel(axis: int, dtype: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    depth, index_dims = 4, [2, 3]
    ax = max(3 + axis, 0) if axis < 0 else min(axis, 2)  # counted on the output's rank, as the kernel does
    out_dims = [*index_dims[:ax], depth, *index_dims[ax:]]

    def node(i: int, op: object, inputs: list[int], dims: list[int], dt: str, name: str | None = None) -> dict:
        return {"id": i, "op": op, "inputs": inputs, "name": name, "origin": None,
                "shape": {"dims": [{"Static": d} for d in dims], "dtype": dt}}

    nodes = [node(0, {"Input": {"name": "idx"}}, [], index_dims, dtype), node(1, {"Input": {"name": "depth"}}, [], [1], "I64"),
             node(2, {"Input": {"name": "values"}}, [], [2], "F32"),
             node(3, {"Custom": {"name": "onnx.OneHot", "num_inputs": 3,
                                 "attrs": list(axis.to_bytes(4, "little", signed=True))}}, [0, 1, 2], out_dims, "F32", "out")]
    g = graph_from_json(json.dumps({"name": "g", "nodes": nodes, "outputs": [3]}))
    indices = rng.integers(-6, 7, size=index_dims).astype(np.int64 if dtype == "I64" else np.float32)
    values = rng.standard_normal(2).astype(np.float32)
    # rlx-cpu's one_hot_fill: all off, then on at (index + depth when negative) if inside [0, depth).
    want = np.full(out_dims, values[0], np.float32)
    flat = np.trunc(indices).astype(np.int64).reshape(-1)
    inner = int(np.prod(out_dims[ax + 1:]))
    view = want.reshape(-1)
    for p, v in enumerate(flat):
        v = v + depth if v < 0 else v
        if 0 <= v < depth:
            view[(p // inner) * depth * inner + v * inner + p % inner] = values[1]
    feeds = {"idx": indices, "depth": np.array([depth]), "values": values}
    np.testing.assert_array_equal(reference.evaluate(g, feeds)["out"], want)
    got = milexec.run(convert_and_cleanup(g, {}, target="iOS18", precision="fp32"), feeds)["out"]
    np.testing.assert_array_equal(got, want)
    short = [dict(n) for n in nodes]
    short[3] = {**nodes[3], "inputs": [0, 1]}
    with pytest.raises(UnsupportedOpFormatError, match="takes 3 inputs"):
        graph_from_json(json.dumps({"name": "g", "nodes": short, "outputs": [3]}))


def _upstream_cumprod(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """rlx-cpu's `cumprod`, transcribed (a running product in float32, step by step)."""
    moved = np.moveaxis(x, axis, 0)
    out = np.empty_like(moved)
    running = np.ones(moved.shape[1:], x.dtype)
    for step in range(moved.shape[0]):
        k = moved.shape[0] - 1 - step if reverse else step
        if exclusive:
            out[k], running = running, running * moved[k]
        else:
            running = running * moved[k]
            out[k] = running
    return np.moveaxis(out, 0, axis)


@settings(max_examples=4, deadline=None)
@given(axis=st.integers(-4, 3), exclusive=st.booleans(), reverse=st.booleans(), axis_input=st.booleans(),
       seed=st.integers(0, 2**16))
def test_onnx_cum_prod_scans_as_upstreams_kernel(axis: int, exclusive: bool, reverse: bool, axis_input: bool,
                                                 seed: int) -> None:
    dims = [2, 3, 4]
    attrs = [*(0 if axis_input else axis).to_bytes(4, "little", signed=True), int(exclusive), int(reverse)]

    def node(i: int, op: object, inputs: list[int], shape: list[int], dt: str, name: str | None = None) -> dict:
        return {"id": i, "op": op, "inputs": inputs, "name": name, "origin": None,
                "shape": {"dims": [{"Static": d} for d in shape], "dtype": dt}}

    nodes = [node(0, {"Input": {"name": "x"}}, [], dims, "F32")]
    if axis_input:  # the kernel prefers an I64 axis operand over the attrs
        nodes.append(node(1, {"Constant": {"data": list(axis.to_bytes(8, "little", signed=True))}}, [], [1], "I64"))
    nodes.append(node(len(nodes), {"Custom": {"name": "onnx.CumProd", "num_inputs": len(nodes), "attrs": attrs}},
                      list(range(len(nodes))), dims, "F32", "out"))
    g = graph_from_json(json.dumps({"name": "g", "nodes": nodes, "outputs": [len(nodes) - 1]}))
    x = np.random.default_rng(seed).uniform(-2, 2, size=dims).astype(np.float32)
    ax = min(max(axis + 3 if axis < 0 else axis, 0), 2)
    want = _upstream_cumprod(x, ax, exclusive, reverse)
    np.testing.assert_allclose(reference.evaluate(g, {"x": x})["out"], want, rtol=1e-6)
    got = milexec.run(convert_and_cleanup(g, {}, target="iOS18", precision="fp32"), {"x": x})["out"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_onnx_cum_prod_axis_read_at_run_time_is_refused() -> None:
    nodes = [
        {"id": 0, "op": {"Input": {"name": "x"}}, "inputs": [], "name": None, "origin": None,
         "shape": {"dims": [{"Static": 3}], "dtype": "F32"}},
        {"id": 1, "op": {"Input": {"name": "axis"}}, "inputs": [], "name": None, "origin": None,
         "shape": {"dims": [{"Static": 1}], "dtype": "I64"}},
        {"id": 2, "op": {"Custom": {"name": "onnx.CumProd", "num_inputs": 2, "attrs": []}}, "inputs": [0, 1],
         "name": None, "origin": None, "shape": {"dims": [{"Static": 3}], "dtype": "F32"}},
    ]
    with pytest.raises(UnsupportedOpFormatError, match="axis from input 1 at run time"):
        graph_from_json(json.dumps({"name": "g", "nodes": nodes, "outputs": [2]}))


@settings(max_examples=4, deadline=None)
@given(equation=st.sampled_from(["ij,jk->ik", "bij,bjk->bik", "ij->ji", "ij,ij->", "i,j->ij", "ijk,kj", "bhqd,bhkd->bhqk",
                                 "ij,jk,kl->li"]),
       seed=st.integers(0, 2**16))
def test_onnx_einsum_contracts_as_numpy_does(equation: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = dict(zip("bhijklqd", [2, 2, 3, 4, 2, 3, 2, 3], strict=True))
    terms = equation.split("->")[0].split(",")
    values = {f"x{i}": rng.standard_normal([size[c] for c in term]).astype(np.float32) for i, term in enumerate(terms)}
    want = np.einsum(equation, *values.values())

    def node(i: int, op: object, inputs: list[int], dims: Sequence[int], name: str | None = None) -> dict:
        return {"id": i, "op": op, "inputs": inputs, "name": name, "origin": None,
                "shape": {"dims": [{"Static": d} for d in dims], "dtype": "F32"}}

    nodes = [node(i, {"Input": {"name": key}}, [], value.shape) for i, (key, value) in enumerate(values.items())]
    nodes.append(node(len(nodes), {"Custom": {"name": "onnx.Einsum", "num_inputs": len(nodes),
                                              "attrs": list(equation.encode())}}, list(range(len(nodes))), want.shape, "out"))
    g = graph_from_json(json.dumps({"name": "g", "nodes": nodes, "outputs": [len(nodes) - 1]}))
    np.testing.assert_allclose(reference.evaluate(g, values)["out"], want, rtol=1e-5, atol=1e-5)
    got = milexec.run(convert_and_cleanup(g, {}, target="iOS18", precision="fp32"), values)["out"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("equation", "dims", "message"), [
    ("ii->i", [[3, 3]], "repeats a label"),
    ("ij,jk->ik", [[2, 3], [4, 2]], "sizes 3 and 4"),
    ("...i->i", [[2, 3]], "ellipsis"),
    ("ij->ik", [[2, 3]], "names one no input has"),
])
def test_onnx_einsum_refuses_what_it_cannot_spell(equation: str, dims: list[list[int]], message: str) -> None:
    nodes = [{"id": i, "op": {"Input": {"name": f"x{i}"}}, "inputs": [], "name": None, "origin": None,
              "shape": {"dims": [{"Static": d} for d in shape], "dtype": "F32"}} for i, shape in enumerate(dims)]
    nodes.append({"id": len(nodes), "op": {"Custom": {"name": "onnx.Einsum", "num_inputs": len(nodes),
                                                      "attrs": list(equation.encode())}},
                  "inputs": list(range(len(nodes))), "name": None, "origin": None,
                  "shape": {"dims": [{"Static": 3}], "dtype": "F32"}})
    with pytest.raises(UnsupportedOpFormatError, match=message):
        graph_from_json(json.dumps({"name": "g", "nodes": nodes, "outputs": [len(nodes) - 1]}))


def _upstream_scatter_elements(data: np.ndarray, indices: np.ndarray, updates: np.ndarray, axis: int,
                               reduction: int) -> np.ndarray:
    """rlx-cpu's `scatter_elements_f32`, transcribed (float data)."""
    apply = {0: lambda d, s: s, 1: lambda d, s: d + s, 2: lambda d, s: d * s, 3: np.fmax, 4: np.fmin}[reduction]
    out = np.where(np.isfinite(data), data, 0).astype(np.float32).reshape(-1)
    idx, upd = np.trunc(indices.astype(np.float64)).astype(np.int64).reshape(-1), updates.reshape(-1)
    if data.ndim == 1:
        for i, j in enumerate(np.maximum(idx, 0)):
            if j < out.size:
                out[j] = apply(out[j], upd[i])
        return out
    axis = min(max(axis + data.ndim if axis < 0 else axis, 0), data.ndim - 1)
    outer, inner = int(np.prod(data.shape[:axis])), int(np.prod(data.shape[axis + 1:]))
    axis_dim, n = data.shape[axis], idx.size
    for flat_i in range(n):
        row = min(max(idx[flat_i], 0), axis_dim - 1)
        if n == outer * inner and n != outer * axis_dim * inner:
            o, i = flat_i // inner, flat_i % inner
        else:
            o, i = flat_i // (axis_dim * inner), flat_i % (axis_dim * inner) % inner
        dst = min(o, outer - 1) * axis_dim * inner + row * inner + i
        out[dst] = apply(out[dst], upd[flat_i])
    return out.reshape(data.shape)


@settings(max_examples=4, deadline=None)
@given(dims=st.sampled_from([[6], [3, 4], [2, 3, 2]]), axis=st.integers(-3, 2), squeeze=st.booleans(),
       reduction=st.integers(0, 4), seed=st.integers(0, 2**16))
def test_onnx_scatter_elements_reads_as_upstreams_kernel(dims: list[int], axis: int, squeeze: bool, reduction: int,
                                                         seed: int) -> None:
    rng = np.random.default_rng(seed)
    rank = len(dims)
    ax = min(max(axis + rank if axis < 0 else axis, 0), rank - 1)
    index_dims = [1 if squeeze and i == ax else d for i, d in enumerate(dims)] if rank > 1 else [4]

    def node(i: int, op: object, inputs: list[int], shape: list[int], dt: str, name: str | None = None) -> dict:
        return {"id": i, "op": op, "inputs": inputs, "name": name, "origin": None,
                "shape": {"dims": [{"Static": d} for d in shape], "dtype": dt}}

    attrs = [*axis.to_bytes(4, "little", signed=True), *reduction.to_bytes(4, "little")]
    nodes = [node(0, {"Input": {"name": "data"}}, [], dims, "F32"), node(1, {"Input": {"name": "idx"}}, [], index_dims, "I64"),
             node(2, {"Input": {"name": "upd"}}, [], index_dims, "F32"),
             node(3, {"Custom": {"name": "onnx.ScatterElements", "num_inputs": 3, "attrs": attrs}}, [0, 1, 2], dims,
                  "F32", "out")]
    g = graph_from_json(json.dumps({"name": "g", "nodes": nodes, "outputs": [3]}))
    data = rng.standard_normal(dims).astype(np.float32)
    data.reshape(-1)[:2] = [np.inf, np.nan]  # zeroed by the kernel before it scatters
    indices = rng.integers(-2, max(dims) + 2, size=index_dims).astype(np.int64)  # negative and past the end
    feeds = {"data": data, "idx": indices, "upd": rng.standard_normal(index_dims).astype(np.float32)}
    want = _upstream_scatter_elements(data, indices, feeds["upd"], axis, reduction)
    np.testing.assert_allclose(reference.evaluate(g, feeds)["out"], want, rtol=1e-6)
    got = milexec.run(convert_and_cleanup(g, {}, target="iOS18", precision="fp32"), feeds)["out"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_custom_names_table_is_what_the_reader_does() -> None:
    """Every name the coverage doc's Custom table reads is one the reader reads; every name it
    refuses is refused by name with the table's reason in the error."""
    from rlx_mil.ir.serde.custom import EINSUM_NAME, READ_AS, READ_FORMS, REFUSED_NAMES

    assert set(READ_FORMS) == set(READ_AS) | {EINSUM_NAME}
    assert not set(READ_FORMS) & set(REFUSED_NAMES)
    for name, why in REFUSED_NAMES.items():
        for num_inputs in (1, 2, 3):
            with pytest.raises(UnsupportedOpFormatError) as err:
                graph_from_json(_custom_json({"name": name, "num_inputs": num_inputs, "attrs": []}))
            assert name in str(err.value) and why in str(err.value)
    with pytest.raises(UnsupportedOpFormatError, match="run-time op registry"):
        graph_from_json(_custom_json({"name": "acme.Frobnicate", "num_inputs": 3, "attrs": []}))
