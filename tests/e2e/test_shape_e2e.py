"""End-to-end: Reshape, Transpose, Narrow, Concat, Expand, Gather (float, int and bool data)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from e2e.factory import Feeds, e2e_settings, integers, leaf_kinds, rng_for, seeds
from rlx_mil.ir.dtype import DType

small_dims = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4)
data_dtypes = st.sampled_from((DType.F32, DType.F16, DType.I32, DType.BOOL))


def data(rng: np.random.Generator, dims: tuple[int, ...], dtype: DType) -> np.ndarray:
    """Distinguishable values: integers (exact in every dtype), 0/1 for Bool."""
    if dtype is DType.BOOL:
        return integers(rng, dims, 0, 1)
    return integers(rng, dims, -500, 500) * (0.5 if dtype.is_float else 1.0)


@st.composite
def reshape_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    dims = draw(small_dims)
    total = math.prod(dims)
    new: list[int] = []
    rest = total
    for _ in range(draw(st.integers(0, 3))):
        divisor = draw(st.sampled_from([d for d in range(1, rest + 1) if rest % d == 0]))
        new.append(divisor)
        rest //= divisor
    new.append(rest)
    new = list(draw(st.permutations(new)))
    if draw(st.booleans()):
        new[draw(st.integers(0, len(new) - 1))] = -1
    return dims, tuple(new)


@e2e_settings(4)
@given(case=reshape_cases(), dtype=data_dtypes, seed=seeds)
def test_reshape(case: tuple[tuple[int, ...], tuple[int, ...]], dtype: DType, seed: int) -> None:
    dims, new_shape = case
    f = Feeds("reshape")
    x = f.input("x", data(rng_for(seed), dims, dtype), dtype)
    f.verify([f.graph.reshape(x, new_shape, name="reshape")])


@st.composite
def transpose_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    dims = draw(hnp.array_shapes(min_dims=1, max_dims=5, min_side=1, max_side=3))
    return dims, tuple(draw(st.permutations(list(range(len(dims))))))


@e2e_settings(4)
@given(case=transpose_cases(), dtype=data_dtypes, seed=seeds)
def test_transpose(case: tuple[tuple[int, ...], tuple[int, ...]], dtype: DType, seed: int) -> None:
    dims, perm = case
    f = Feeds("transpose")
    x = f.input("x", data(rng_for(seed), dims, dtype), dtype)
    f.verify([f.graph.transpose(x, perm, name="transpose")])


@st.composite
def narrow_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], int, int, int]:
    dims = draw(small_dims)
    axis = draw(st.integers(0, len(dims) - 1))
    start = draw(st.integers(0, dims[axis] - 1))
    length = draw(st.integers(1, dims[axis] - start))
    return dims, axis, start, length


@e2e_settings(4)
@given(case=narrow_cases(), signed_axis=st.booleans(), dtype=data_dtypes, seed=seeds)
def test_narrow(case: tuple[tuple[int, ...], int, int, int], signed_axis: bool, dtype: DType, seed: int) -> None:
    """Slices anywhere along any axis (including the whole axis); the builder takes -1 style
    axes and stores them unsigned."""
    dims, axis, start, length = case
    f = Feeds("narrow")
    x = f.input("x", data(rng_for(seed), dims, dtype), dtype)
    the_axis = axis - len(dims) if signed_axis else axis
    f.verify([f.graph.narrow(x, the_axis, start, length, name="narrow")])


@st.composite
def concat_cases(draw: st.DrawFn) -> tuple[list[tuple[int, ...]], int]:
    dims = draw(small_dims)
    axis = draw(st.integers(0, len(dims) - 1))
    count = draw(st.integers(1, 4))
    pieces = []
    for _ in range(count):
        piece = list(dims)
        piece[axis] = draw(st.integers(1, 3))
        pieces.append(tuple(piece))
    return pieces, axis


@e2e_settings(4)
@given(case=concat_cases(), kinds=st.lists(leaf_kinds, min_size=4, max_size=4), dtype=data_dtypes, seed=seeds)
def test_concat(case: tuple[list[tuple[int, ...]], int], kinds: list[str], dtype: DType, seed: int) -> None:
    """1 to 4 pieces along any axis, each an input, a weight or a constant."""
    pieces, axis = case
    kinds = ["input", *kinds[1:]] if "input" not in kinds[: len(pieces)] else kinds  # a model needs an input
    rng = rng_for(seed)
    f = Feeds("concat")
    ids = [
        f.leaf(kind, f"piece{i}", data(rng, dims, dtype), dtype)
        for i, (kind, dims) in enumerate(zip(kinds[: len(pieces)], pieces, strict=True))
    ]
    f.verify([f.graph.concat(ids, axis, name="concat")])


@st.composite
def expand_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """An input shape with some 1s, and a target that grows them, left-pads, and keeps
    some dims with -1."""
    target = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4))
    drop = draw(st.integers(0, len(target) - 1))
    source = tuple(1 if draw(st.booleans()) else d for d in target[drop:])
    spelled = list(target)
    for i in range(drop, len(target)):
        if draw(st.integers(0, 3)) == 0:
            spelled[i] = -1 if source[i - drop] == target[i] else target[i]
    return source, tuple(spelled)


@e2e_settings(4)
@given(case=expand_cases(), dtype=data_dtypes, seed=seeds)
def test_expand(case: tuple[tuple[int, ...], tuple[int, ...]], dtype: DType, seed: int) -> None:
    source, target = case
    f = Feeds("expand")
    x = f.input("x", data(rng_for(seed), source, dtype), dtype)
    f.verify([f.graph.expand(x, target, name="expand")])


@st.composite
def gather_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], int, tuple[int, ...]]:
    table = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    axis = draw(st.integers(0, len(table) - 1))
    indices = draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=4))
    return table, axis, indices


@e2e_settings(5)
@given(
    case=gather_cases(),
    table_kind=leaf_kinds,
    index_kind=st.sampled_from(("input", "constant", "param")),
    index_dtype=st.sampled_from((DType.F32, DType.I32)),
    dtype=st.sampled_from((DType.F32, DType.I32)),
    seed=seeds,
)
def test_gather(
    case: tuple[tuple[int, ...], int, tuple[int, ...]], table_kind: str, index_kind: str, index_dtype: DType,
    dtype: DType, seed: int,
) -> None:
    """`np.take(table, indices, axis)` (leading table dims kept, spec 8.6); float indices
    carry a fraction that must truncate."""
    table_dims, axis, index_dims = case
    rng = rng_for(seed)
    f = Feeds("gather")
    table = f.leaf(table_kind, "table", data(rng, table_dims, dtype), dtype)
    indices = integers(rng, index_dims, 0, table_dims[axis] - 1)
    if index_dtype.is_float:
        indices = indices + 0.25
    if table_kind != "input":
        index_kind = "input"  # a model needs an input
    idx = f.leaf(index_kind, "indices", indices, index_dtype)
    f.verify([f.graph.gather(table, idx, axis, name="gather")])
