"""Lowering of Reshape, Transpose, Narrow, Concat, Expand and Gather (spec sections 8.1-8.6).

Data movement must be exact: every case is compared with `rlx_mil.reference.evaluate` with
zero tolerance (on the inputs as the program holds them).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlx_mil.errors import AttributeValueError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.shape import Shape

from .conftest import (
    PRECISIONS,
    TARGETS,
    check_against_reference,
    convert_and_cleanup,
    emitted_ops,
    run_model,
)

SHAPES = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4)
EXACT = {"rtol": 0.0, "atol": 0.0}


def rand(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def unary_graph(op: ops.Op, in_shape: tuple[int, ...], out_shape: tuple[int, ...], dtype: DType = DType.F32) -> Graph:
    g = Graph("unary")
    x = g.add_node(ops.Input("x"), [], Shape.of(in_shape, dtype))
    g.set_outputs([g.add_node(op, [x], Shape.of(out_shape, dtype), name="y")])
    return g


def check(g: Graph, inputs: dict[str, Any], target: str, precision: str, params: dict[str, Any] | None = None) -> Any:
    return check_against_reference(g, inputs, params, target=target, precision=precision, **EXACT)


# ------------------------------------------------------------------------------ Reshape / Transpose


@st.composite
def reshapes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    shape = draw(SHAPES)
    total = math.prod(shape)
    dims: list[int] = []
    rest = total
    for _ in range(draw(st.integers(0, 3))):
        d = draw(st.sampled_from([d for d in range(1, rest + 1) if rest % d == 0]))
        dims.append(d)
        rest //= d
    dims.append(rest)
    new = list(draw(st.permutations(dims)))
    if draw(st.booleans()):
        new[draw(st.integers(0, len(new) - 1))] = -1
    return shape, tuple(new)


@given(case=reshapes(), target=st.sampled_from(TARGETS), precision=st.sampled_from(PRECISIONS))
def test_reshape_with_inferred_dim(case: Any, target: str, precision: str) -> None:
    shape, new = case
    total = math.prod(shape)
    known = math.prod(d for d in new if d != -1)
    out = tuple(total // known if d == -1 else d for d in new)
    model = check(unary_graph(ops.Reshape(new), shape, out), {"x": rand(shape)}, target, precision)
    assert ("reshape" in emitted_ops(model)) == (out != shape)


@given(shape=SHAPES, data=st.data(), target=st.sampled_from(TARGETS), precision=st.sampled_from(PRECISIONS))
def test_transpose(shape: tuple[int, ...], data: st.DataObject, target: str, precision: str) -> None:
    perm = tuple(data.draw(st.permutations(range(len(shape))), label="perm"))
    out = tuple(shape[p] for p in perm)
    model = check(unary_graph(ops.Transpose(perm), shape, out), {"x": rand(shape)}, target, precision)
    assert ("transpose" in emitted_ops(model)) == (perm != tuple(range(len(shape))))


# ------------------------------------------------------------------------------ Narrow / Concat


@given(shape=SHAPES, data=st.data(), target=st.sampled_from(TARGETS), precision=st.sampled_from(PRECISIONS))
def test_narrow_slices_one_axis(shape: tuple[int, ...], data: st.DataObject, target: str, precision: str) -> None:
    axis = data.draw(st.integers(0, len(shape) - 1), label="axis")
    start = data.draw(st.integers(0, shape[axis] - 1), label="start")
    length = data.draw(st.integers(1, shape[axis] - start), label="len")
    out = tuple(length if i == axis else d for i, d in enumerate(shape))
    model = check(unary_graph(ops.Narrow(axis, start, length), shape, out), {"x": rand(shape)}, target, precision)
    assert ("slice_by_size" in emitted_ops(model)) == (length != shape[axis])


@given(shape=SHAPES, data=st.data(), target=st.sampled_from(TARGETS), precision=st.sampled_from(PRECISIONS))
def test_concat_of_several_inputs(shape: tuple[int, ...], data: st.DataObject, target: str, precision: str) -> None:
    axis = data.draw(st.integers(0, len(shape) - 1), label="axis")
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=4), label="sizes")
    g = Graph("concat")
    inputs, nodes = {}, []
    for i, size in enumerate(sizes):
        piece = tuple(size if d == axis else s for d, s in enumerate(shape))
        nodes.append(g.add_node(ops.Input(f"x{i}"), [], Shape.of(piece)))
        inputs[f"x{i}"] = rand(piece, i)
    out = tuple(sum(sizes) if d == axis else s for d, s in enumerate(shape))
    g.set_outputs([g.add_node(ops.Concat(axis), nodes, Shape.of(out), name="y")])
    model = check(g, inputs, target, precision)
    assert ("concat" in emitted_ops(model)) == (len(sizes) > 1)


def test_concat_with_a_param_and_an_int_input_converted() -> None:
    g = Graph("concat_mixed")
    x = g.add_node(ops.Input("x"), [], Shape.of([2, 2]))
    p = g.add_node(ops.Param("p"), [], Shape.of([2, 1]))
    g.set_outputs([g.add_node(ops.Concat(1), [x, p], Shape.of([2, 3]), name="y")])
    for precision in PRECISIONS:
        check(g, {"x": rand((2, 2))}, "iOS15", precision, {"p": rand((2, 1), 5)})


# ------------------------------------------------------------------------------ Expand


@st.composite
def expansions(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    target = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=3))
    rank = draw(st.integers(1, len(target)))
    source = tuple(d if draw(st.booleans()) else 1 for d in target[len(target) - rank:])
    spelled = tuple(-1 if (draw(st.booleans()) and i >= len(target) - rank and source[i - len(target) + rank] == d) else d
                    for i, d in enumerate(target))
    return source, spelled


@given(case=expansions(), target=st.sampled_from(TARGETS), precision=st.sampled_from(PRECISIONS))
def test_expand_broadcasts_size_one_dims(case: Any, target: str, precision: str) -> None:
    source, spelled = case
    padded = (1,) * (len(spelled) - len(source)) + source
    out = tuple(p if s == -1 else s for p, s in zip(padded, spelled, strict=True))
    model = check(unary_graph(ops.Expand(spelled), source, out), {"x": rand(source)}, target, precision)
    assert ("tile" in emitted_ops(model)) == (out != padded)


# ------------------------------------------------------------------------------ Gather


@given(
    table=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
    idx_shape=hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3),
    data=st.data(),
    idx_dtype=st.sampled_from([DType.F32, DType.I32]),
    target=st.sampled_from(TARGETS),
    precision=st.sampled_from(PRECISIONS),
)
def test_gather_takes_along_any_axis(table: tuple[int, ...], idx_shape: tuple[int, ...], data: st.DataObject,
                                     idx_dtype: DType, target: str, precision: str) -> None:
    axis = data.draw(st.integers(0, len(table) - 1), label="axis")
    rng = np.random.default_rng(len(table) * 7 + axis)
    idx = rng.integers(0, table[axis], idx_shape)
    # Float indices carry fractions: they truncate toward zero.
    idx_value = (idx + rng.uniform(0, 0.9, idx_shape)).astype(np.float32) if idx_dtype is DType.F32 else idx.astype(np.int32)
    g = Graph("gather")
    t = g.add_node(ops.Input("t"), [], Shape.of(table))
    i = g.add_node(ops.Input("i"), [], Shape.of(idx_shape, idx_dtype))
    out = (*table[:axis], *idx_shape, *table[axis + 1:])
    g.set_outputs([g.add_node(ops.Gather(axis), [t, i], Shape.of(out), name="y")])
    model = check(g, {"t": rand(table), "i": idx_value}, target, precision)
    assert "gather" in emitted_ops(model)


def test_embedding_ids_above_2048_stay_exact_under_fp16() -> None:
    vocab, dim = 4100, 2
    g = Graph("embedding")
    table = g.add_node(ops.Param("table"), [], Shape.of([vocab, dim]))
    ids = g.add_node(ops.Input("ids"), [], Shape.of([1, 4]))
    g.set_outputs([g.add_node(ops.Gather(0), [table, ids], Shape.of([1, 4, dim]), name="y")])
    weights = np.stack([np.arange(vocab), -np.arange(vocab)], axis=1).astype(np.float32) / 4096
    model = convert_and_cleanup(g, {"table": weights}, target="iOS18", precision="fp16")
    id_values = np.float32([[2049, 4097, 3, 4099]])  # not fp16 values: 2049 rounds to 2048 in fp16
    got = run_model(model, {"ids": id_values})["y"]
    want = weights.astype(np.float16).astype(np.float32)[id_values.astype(np.int64)]
    np.testing.assert_array_equal(got, want)


def test_constant_indices_become_an_int32_const() -> None:
    g = Graph("const_ids")
    x = g.add_node(ops.Input("x"), [], Shape.of([5, 2]))
    ids = g.add_node(ops.Constant(np.float32([4.7, 0.0, 2.2]).tobytes()), [], Shape.of([3]))
    g.set_outputs([g.add_node(ops.Gather(0), [x, ids], Shape.of([3, 2]), name="y")])
    model = check(g, {"x": rand((5, 2))}, "iOS16", "fp32")
    assert "floor" not in emitted_ops(model)


def test_out_of_range_constant_indices_are_rejected() -> None:
    g = Graph("bad_ids")
    x = g.add_node(ops.Input("x"), [], Shape.of([5, 2]))
    ids = g.add_node(ops.Constant(np.int32([1, 5]).tobytes()), [], Shape.of([2], DType.I32))
    g.set_outputs([g.add_node(ops.Gather(0), [x, ids], Shape.of([2, 2]), name="y")])
    with pytest.raises(AttributeValueError, match=r"indices must lie in \[0, 5\)") as err:
        convert_and_cleanup(g, target="iOS15", precision="fp32")
    assert err.value.operand == "indices" and err.value.op == "Gather"


def test_gather_from_a_bool_table() -> None:
    g = Graph("bool_gather")
    x = g.add_node(ops.Input("x"), [], Shape.of([4]))
    zero = g.add_node(ops.Constant(np.float32(0).tobytes()), [], Shape.of([]))
    mask = g.add_node(ops.Compare(ops.CmpOp.GT), [x, zero], Shape.of([4], DType.BOOL))
    ids = g.add_node(ops.Input("ids"), [], Shape.of([3], DType.I32))
    g.set_outputs([g.add_node(ops.Gather(0), [mask, ids], Shape.of([3], DType.BOOL), name="y")])
    check(g, {"x": np.float32([1, -1, 2, 0]), "ids": np.int32([3, 0, 1])}, "iOS17", "fp16")


def test_zero_length_narrow_is_unsupported() -> None:
    from rlx_mil.errors import UnsupportedOpError

    g = Graph("empty")
    x = g.add_node(ops.Input("x"), [], Shape.of([3, 2]))
    g.set_outputs([g.add_node(ops.Narrow(0, 1, 0), [x], Shape.of([0, 2]), name="y")])
    with pytest.raises(UnsupportedOpError, match="zero-size"):
        convert_and_cleanup(g, target="iOS15", precision="fp32")


def test_rules_are_registered_with_notes() -> None:
    from rlx_mil.lowering.registry import registered_rules
    from rlx_mil.lowering.target import Target

    rules = registered_rules()
    families = {"elementwise": (ops.Activation, ops.Cast, ops.Binary, ops.Compare, ops.Where),
                "linalg": (ops.MatMul, ops.LoraMatMul, ops.FusedMatMulBiasAct),
                "reduce": (ops.Softmax, ops.Reduce, ops.Cumsum, ops.TopK),
                "shape": (ops.Reshape, ops.Transpose, ops.Narrow, ops.Concat, ops.Expand, ops.Gather)}
    for family, op_types in families.items():
        for op_type in op_types:
            info = rules[op_type]
            assert info.family == family and info.min_target is Target.IOS15
            assert len(info.notes) > 40, op_type.type_name
