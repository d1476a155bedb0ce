"""Lowering of Softmax, Reduce, Cumsum and TopK (spec section 7).

Each case is converted, its MIL ops checked, and the converted program run and compared with
`rlx_mil.reference.evaluate`. TopK's tie order is checked against a topk kernel that orders
ties the "wrong" way, since Core ML does not specify it.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import ReduceOp
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


def unary_graph(op: ops.Op, in_shape: tuple[int, ...], out_shape: tuple[int, ...], dtype: DType = DType.F32,
                out_dtype: DType | None = None) -> Graph:
    g = Graph("unary")
    x = g.add_node(ops.Input("x"), [], Shape.of(in_shape, dtype))
    g.set_outputs([g.add_node(op, [x], Shape.of(out_shape, out_dtype or dtype), name="y")])
    return g


# ------------------------------------------------------------------------------ Softmax


@given(data=st.data(), shape=SHAPES, target=st.sampled_from(TARGETS), precision=st.sampled_from(PRECISIONS))
def test_softmax_on_any_axis(data: st.DataObject, shape: tuple[int, ...], target: str, precision: str) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32) * 4
    model = check_against_reference(unary_graph(ops.Softmax(axis), shape, shape), {"x": x}, target=target, precision=precision)
    (softmax,) = [op for op in model._mil_program.functions["main"].operations if op.op_type == "softmax"]
    assert softmax.axis.val in (axis, axis + len(shape))


# ------------------------------------------------------------------------------ Reduce


def reduced(shape: tuple[int, ...], axes: tuple[int, ...], keep: bool) -> tuple[int, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(shape)) if keep else tuple(
        d for i, d in enumerate(shape) if i not in axes
    )


@given(
    data=st.data(), shape=SHAPES, op=st.sampled_from(list(ReduceOp)), keep=st.booleans(),
    target=st.sampled_from(TARGETS), precision=st.sampled_from(PRECISIONS),
)
def test_reduce_over_any_axes(data: st.DataObject, shape: tuple[int, ...], op: ReduceOp, keep: bool, target: str,
                              precision: str) -> None:
    axes = tuple(data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, unique=True), label="axes"))
    rng = np.random.default_rng(sum(shape))
    # Prod of up to 256 terms: values near 1 keep it in range (and fp16-representable).
    x = rng.uniform(0.8, 1.25, shape) if op is ReduceOp.PROD else rng.standard_normal(shape)
    g = unary_graph(ops.Reduce(op, axes, keep), shape, reduced(shape, axes, keep))
    model = check_against_reference(g, {"x": x.astype(np.float32)}, target=target, precision=precision)
    assert f"reduce_{op.value.lower()}" in emitted_ops(model)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_reducing_every_axis_gives_a_scalar(precision: str) -> None:
    g = unary_graph(ops.Reduce(ReduceOp.MEAN, (0, 1), False), (2, 3), ())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = run_model(convert_and_cleanup(g, target="iOS15", precision=precision), {"x": x})["y"]
    assert np.asarray(out).size == 1 and float(np.asarray(out).reshape(())) == pytest.approx(2.5)


def _nan_propagating_reduce(fn: Any) -> Any:
    def kernel(op: Any) -> np.ndarray:
        return fn(op.x.val, axis=tuple(int(a) for a in op.axes.val), keepdims=bool(op.keep_dims.val))
    return kernel


@pytest.mark.parametrize(
    ("op", "fn", "unit_variants"),
    [(ReduceOp.MAX, np.fmax, (np.max, np.nanmax)), (ReduceOp.MIN, np.fmin, (np.min, np.nanmin))],
)
def test_reduce_max_min_skip_nan(op: ReduceOp, fn: Any, unit_variants: tuple[Any, ...]) -> None:
    g = unary_graph(ops.Reduce(op, (1,), False), (4, 3), (4,))
    model = convert_and_cleanup(g, target="iOS18", precision="fp32")
    x = np.float32([[np.nan, 1, 2], [np.nan, np.nan, np.nan], [-np.inf, np.nan, -5], [3, 4, 5]])
    want = fn.reduce(x, axis=1)
    np.testing.assert_array_equal(run_model(model, {"x": x})["y"], want)
    # Also with reductions that propagate NaN (np.max/np.min) or that skip it.
    for reduce_fn in unit_variants:
        kernels = {f"reduce_{op.value.lower()}": _nan_propagating_reduce(reduce_fn)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # nanmax of an all-NaN slice
            got = run_model(model, {"x": x}, engine="value_inference", kernels=kernels)["y"]
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", list(ReduceOp))
def test_integer_reductions(op: ReduceOp) -> None:
    g = unary_graph(ops.Reduce(op, (0,), True), (4, 2), (1, 2), DType.I32)
    x = np.int32([[3, -1], [2, 5], [-7, 1], [1, 2]])
    check_against_reference(g, {"x": x}, target="iOS16", precision="fp16", rtol=0, atol=0)


# ------------------------------------------------------------------------------ Cumsum


@given(data=st.data(), shape=SHAPES, exclusive=st.booleans(), target=st.sampled_from(TARGETS),
       precision=st.sampled_from(PRECISIONS))
def test_cumsum_on_any_axis(data: st.DataObject, shape: tuple[int, ...], exclusive: bool, target: str, precision: str) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    model = check_against_reference(unary_graph(ops.Cumsum(axis, exclusive), shape, shape), {"x": x},
                                    target=target, precision=precision)
    (cumsum,) = [op for op in model._mil_program.functions["main"].operations if op.op_type == "cumsum"]
    assert bool(cumsum.exclusive.val) is exclusive


def test_integer_cumsum_is_exact() -> None:
    g = unary_graph(ops.Cumsum(0, True), (4,), (4,), DType.I32)
    check_against_reference(g, {"x": np.int32([2**24, 1, 1, 3])}, target="iOS15", precision="fp16", rtol=0, atol=0)


# ------------------------------------------------------------------------------ TopK


def _topk_reversing_ties(op: Any) -> Any:
    """A topk whose values are right but whose tie order is largest-index-first."""
    x = op.x.val
    n = x.shape[-1]
    order = np.argsort(-x[..., ::-1], axis=-1, kind="stable")[..., : int(op.k.val)]
    indices = (n - 1 - order).astype(np.int32)
    values = np.take_along_axis(x, indices, axis=-1)
    return_indices = getattr(op, "return_indices", None)
    if return_indices is not None and not return_indices.val:
        return values
    return values, indices


@given(
    shape=SHAPES, data=st.data(), target=st.sampled_from(TARGETS), precision=st.sampled_from(PRECISIONS),
)
def test_topk_is_stable_descending(shape: tuple[int, ...], data: st.DataObject, target: str, precision: str) -> None:
    k = data.draw(st.integers(1, shape[-1]), label="k")
    # Few distinct values (exact in fp16): plenty of ties, also at the k boundary.
    x = np.random.default_rng(sum(shape) + k).integers(-2, 3, shape).astype(np.float32)
    g = unary_graph(ops.TopK(k), shape, (*shape[:-1], k))
    model = check_against_reference(g, {"x": x}, target=target, precision=precision, rtol=0, atol=0)
    want = np.argsort(-x, axis=-1, kind="stable")[..., :k].astype(np.float32)
    got = run_model(model, {"x": x}, engine="value_inference", kernels={"topk": _topk_reversing_ties})["y"]
    np.testing.assert_array_equal(got, want)
    (topk,) = [op for op in model._mil_program.functions["main"].operations if op.op_type == "topk"]
    # Only the values of topk are used: iOS16+ can skip computing its indices.
    assert len(topk.outputs) == (2 if target == "iOS15" else 1)


def test_topk_of_integers_with_int_output() -> None:
    g = unary_graph(ops.TopK(3), (2, 5), (2, 3), DType.I32, DType.I32)
    x = np.int32([[5, 1, 5, 7, 5], [-1, -1, -1, -1, -1]])
    model = check_against_reference(g, {"x": x}, target="iOS17", precision="fp16", rtol=0, atol=0)
    np.testing.assert_array_equal(run_model(model, {"x": x})["y"], [[3, 0, 2], [0, 1, 2]])
