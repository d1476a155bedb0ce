"""End-to-end: Softmax (any axis), Reduce (every op, axis sets, keep_dim), Cumsum, TopK."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from e2e.factory import Feeds, distinct_grid, e2e_settings, integers, normal, rng_for, seeds, uniform
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.ops import ReduceOp

small_dims = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4)


@st.composite
def dims_and_axis(draw: st.DrawFn) -> tuple[tuple[int, ...], int]:
    """A shape and a signed axis of it."""
    dims = draw(small_dims)
    return dims, draw(st.integers(-len(dims), len(dims) - 1))


@e2e_settings(4)
@given(case=dims_and_axis(), scale=st.sampled_from([1.0, 8.0]), seed=seeds)
def test_softmax(case: tuple[tuple[int, ...], int], scale: float, seed: int) -> None:
    """Any axis (negative too); logits up to +-30 need the max subtraction."""
    dims, axis = case
    f = Feeds("softmax")
    x = f.input("x", normal(rng_for(seed), dims, scale))
    f.verify([f.graph.softmax(x, axis, name="softmax")])


@st.composite
def reduce_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A shape and a non-empty set of distinct axes in any order (non-contiguous too)."""
    dims = draw(small_dims)
    axes = draw(st.lists(st.integers(0, len(dims) - 1), min_size=1, max_size=len(dims), unique=True))
    return dims, tuple(axes)


@e2e_settings(5)
@given(case=reduce_cases(), keep_dim=st.booleans(), with_nan=st.booleans(), seed=seeds)
def test_every_reduce_op(case: tuple[tuple[int, ...], tuple[int, ...]], keep_dim: bool, with_nan: bool, seed: int) -> None:
    """All 5 ops over the same axes; reducing every axis without keep_dim gives rank 0.
    Values near 1 keep Prod in range; NaNs propagate through Sum/Mean/Prod and are ignored
    by Max/Min (spec 7.2)."""
    dims, axes = case
    rng = rng_for(seed)
    values = uniform(rng, dims, 0.6, 1.4) * np.where(rng.random(dims) < 0.5, -1, 1).astype(np.float32)
    if with_nan:
        values[rng.random(dims) < 0.2] = np.nan
    f = Feeds("reduce")
    x = f.input("x", values)
    f.verify([f.graph.reduce(x, op, axes, keep_dim, name=op.value.lower()) for op in ReduceOp])


@e2e_settings(2)
@given(case=reduce_cases(), keep_dim=st.booleans(), seed=seeds)
def test_reduce_integer(case: tuple[tuple[int, ...], tuple[int, ...]], keep_dim: bool, seed: int) -> None:
    """I32 data stays integral (Mean of ints follows the reference's conversion)."""
    dims, axes = case
    f = Feeds("reduce_int")
    x = f.input("x", integers(rng_for(seed), dims, -3, 3), DType.I32)
    ops = (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PROD, ReduceOp.MEAN)
    f.verify([f.graph.reduce(x, op, axes, keep_dim, name=op.value.lower()) for op in ops])


@e2e_settings(4)
@given(case=dims_and_axis(), dtype=st.sampled_from((DType.F32, DType.I32)), seed=seeds)
def test_cumsum(case: tuple[tuple[int, ...], int], dtype: DType, seed: int) -> None:
    """Inclusive and exclusive scans along any axis (the CPU supports only the last)."""
    dims, axis = case
    rng = rng_for(seed)
    values = integers(rng, dims, -5, 5) if dtype is DType.I32 else normal(rng, dims)
    f = Feeds("cumsum")
    x = f.input("x", values, dtype)
    f.verify([
        f.graph.cumsum(x, axis, exclusive=False, name="inclusive"),
        f.graph.cumsum(x, axis, exclusive=True, name="exclusive"),
    ])


@e2e_settings(4)
@given(dims=small_dims, ties=st.booleans(), out_dtype=st.sampled_from((DType.F32, DType.I32)), seed=seeds)
def test_topk(dims: tuple[int, ...], ties: bool, out_dtype: DType, seed: int) -> None:
    """Indices of the k largest along the last axis, descending, ties to the smaller index.
    Values are multiples of 0.25 (exact in fp16), so fp16 neither creates nor breaks ties."""
    rng = rng_for(seed)
    values = integers(rng, dims, -2, 2) * 0.25 if ties else distinct_grid(rng, dims)
    n = dims[-1]
    f = Feeds("topk")
    x = f.input("x", values)
    outputs = [f.graph.topk(x, k, dtype=out_dtype, name=f"top{k}") for k in sorted({1, (n + 1) // 2, n})]
    f.verify(outputs)


def test_topk_ranks_nan_last() -> None:
    """NaN ranks after every number (the reference's stable argsort of -x), so a k that
    reaches past the numbers picks the NaN positions in index order; k below them never
    picks a NaN, whatever rank Core ML's topk would give it."""
    nan = np.nan
    values = np.array([[1.0, nan, 3.0, 2.0], [nan, nan, -1.0, 0.5], [nan, 2.0, nan, nan]], np.float32)
    f = Feeds("topk_nan")
    x = f.input("x", values)
    f.verify([f.graph.topk(x, k, name=f"top{k}") for k in (1, 2, 4)])
