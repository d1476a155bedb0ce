"""End-to-end: ScatterAdd, ScatterNd, ScatterElements (every reduction), GatherNd, GatherElements.

Indices are run-time inputs (f32-encoded with a fraction that truncates, or int32) or baked
constants, negative where the op allows it; data holds small integers so sums and products
are exact in fp16 and every difference is a real one. With reduction None the destinations
are distinct (Core ML leaves duplicate writes undefined); every combining reduction gets
duplicates.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from e2e.factory import Feeds, e2e_settings, integers, rng_for, seeds
from rlx_mil.errors import AttributeValueError, EvaluationError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import ScatterNdReduction

shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)
reductions = st.sampled_from(list(ScatterNdReduction))
index_kinds = st.sampled_from((("input", DType.F32), ("input", DType.I32), ("constant", DType.F32)))
data_dtypes = st.sampled_from((DType.F32, DType.F16, DType.I32))


def values(rng: np.random.Generator, dims: tuple[int, ...], dtype: DType, reduction: ScatterNdReduction) -> np.ndarray:
    low, high = (-3, 3) if reduction is ScatterNdReduction.MUL else (-40, 40)
    v = integers(rng, dims, low, high)
    return v if dtype is DType.I32 else v * np.float32(0.5)


def encode(rng: np.random.Generator, idx: np.ndarray, dtype: DType) -> np.ndarray:
    """Integer indices as fed: f32-encoded ones carry a fraction that truncates toward zero."""
    if not dtype.is_float:
        return idx.astype(np.float32)
    return (idx + np.sign(idx + 0.5) * rng.uniform(0.1, 0.8, idx.shape)).astype(np.float32)


def negate_some(rng: np.random.Generator, idx: np.ndarray, dims: np.ndarray | int) -> np.ndarray:
    """Spell some indices from the end (`i - dim`)."""
    return np.where(rng.random(idx.shape) < 0.4, idx - dims, idx)


@e2e_settings(4)
@given(dims=shapes, axis_pick=st.integers(0, 2), updates_len=st.integers(1, 5), extra=st.integers(0, 3),
       kind=index_kinds, dtype=data_dtypes, seed=seeds)
def test_scatter_add(dims: tuple[int, ...], axis_pick: int, updates_len: int, extra: int,
                     kind: tuple[str, DType], dtype: DType, seed: int) -> None:
    """Repeated indices accumulate; the destination axis may be longer than the updates'."""
    rng = rng_for(seed)
    axis = axis_pick % len(dims)
    out_dims = list(dims)
    out_dims[axis] += extra
    up_dims = list(dims)
    up_dims[axis] = updates_len
    f = Feeds("scatter_add")
    updates = f.input("updates", values(rng, tuple(up_dims), dtype, ScatterNdReduction.ADD), dtype)
    idx = rng.integers(0, out_dims[axis], size=updates_len)
    indices = f.leaf(kind[0], "indices", encode(rng, idx, kind[1]), kind[1])
    f.verify([f.graph.scatter_add(updates, indices, out_dims, axis=axis - len(dims) * (seed % 2), name="out")])


@st.composite
def nd_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], int, tuple[int, ...]]:
    data = draw(shapes)
    k = draw(st.integers(1, len(data)))
    positions = draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=4))
    return data, k, positions


@e2e_settings(6)
@given(case=nd_cases(), reduction=reductions, kind=index_kinds, dtype=data_dtypes, seed=seeds)
def test_scatter_nd(case: tuple[tuple[int, ...], int, tuple[int, ...]], reduction: ScatterNdReduction,
                    kind: tuple[str, DType], dtype: DType, seed: int) -> None:
    data_dims, k, positions = case
    rng = rng_for(seed)
    cells = int(np.prod(data_dims[:k]))
    count = int(np.prod(positions))
    if reduction is ScatterNdReduction.NONE:
        count = min(count, cells)
        positions = (count,)
        flat = rng.permutation(cells)[:count]
    else:
        flat = rng.integers(0, cells, size=count)
    idx = np.stack(np.unravel_index(flat, data_dims[:k]), axis=-1).reshape((*positions, k))
    idx = negate_some(rng, idx, np.asarray(data_dims[:k]))
    f = Feeds("scatter_nd")
    data = f.input("data", values(rng, data_dims, dtype, reduction), dtype)
    indices = f.leaf(kind[0], "indices", encode(rng, idx, kind[1]), kind[1])
    updates = f.input("updates", values(rng, (*positions, *data_dims[k:]), dtype, reduction), dtype)
    f.verify([f.graph.scatter_nd(data, indices, updates, reduction, name="out")])


@st.composite
def element_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], int, tuple[int, ...]]:
    data = draw(shapes)
    axis = draw(st.integers(0, len(data) - 1))
    idx = tuple(draw(st.integers(1, 4)) if d == axis else draw(st.integers(1, n)) for d, n in enumerate(data))
    return data, axis, idx


@e2e_settings(6)
@given(case=element_cases(), reduction=reductions, kind=index_kinds, dtype=data_dtypes, signed=st.booleans(), seed=seeds)
def test_scatter_elements(case: tuple[tuple[int, ...], int, tuple[int, ...]], reduction: ScatterNdReduction,
                          kind: tuple[str, DType], dtype: DType, signed: bool, seed: int) -> None:
    """Indices as large as data off the axis (`scatter_along_axis`) or smaller (`scatter_nd`)."""
    data_dims, axis, idx_dims = case
    rng = rng_for(seed)
    n = data_dims[axis]
    if reduction is ScatterNdReduction.NONE:
        # Distinct destinations along the axis within every line of the index tensor.
        length = min(idx_dims[axis], n)
        idx_dims = tuple(length if d == axis else s for d, s in enumerate(idx_dims))
        lines = np.moveaxis(np.zeros(idx_dims, np.int64), axis, -1)
        for pos in np.ndindex(*lines.shape[:-1]):
            lines[pos] = rng.permutation(n)[:length]
        idx = np.moveaxis(lines, -1, axis)
    else:
        idx = rng.integers(0, n, size=idx_dims)
    idx = negate_some(rng, idx, n)
    f = Feeds("scatter_elements")
    data = f.input("data", values(rng, data_dims, dtype, reduction), dtype)
    indices = f.leaf(kind[0], "indices", encode(rng, idx, kind[1]), kind[1])
    updates = f.input("updates", values(rng, idx_dims, dtype, reduction), dtype)
    the_axis = axis - len(data_dims) if signed else axis
    f.verify([f.graph.scatter_elements(data, indices, updates, the_axis, reduction, name="out")])


@st.composite
def gather_nd_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], int, int, tuple[int, ...]]:
    data = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=3))
    b = draw(st.integers(0, len(data) - 1))
    k = draw(st.integers(1, len(data) - b))
    positions = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    return data, b, k, positions


@e2e_settings(6)
@given(case=gather_nd_cases(), kind=index_kinds, dtype=st.sampled_from((DType.F32, DType.I32, DType.BOOL)), seed=seeds)
def test_gather_nd(case: tuple[tuple[int, ...], int, int, tuple[int, ...]], kind: tuple[str, DType], dtype: DType,
                   seed: int) -> None:
    """batch_dims 0..rank-1 (native from iOS16, batch coordinates on iOS15)."""
    data_dims, b, k, positions = case
    rng = rng_for(seed)
    limits = np.asarray(data_dims[b:b + k])
    idx = np.floor(rng.random((*data_dims[:b], *positions, k)) * limits).astype(np.int64)
    idx = negate_some(rng, idx, limits)
    f = Feeds("gather_nd")
    raw = values(rng, data_dims, DType.I32, ScatterNdReduction.ADD)
    data = f.input("data", raw > 0 if dtype is DType.BOOL else raw, dtype)
    indices = f.leaf(kind[0], "indices", encode(rng, idx, kind[1]), kind[1])
    f.verify([f.graph.gather_nd(data, indices, batch_dims=b, name="out")])


@e2e_settings(5)
@given(case=element_cases(), kind=index_kinds, dtype=data_dtypes, seed=seeds)
def test_gather_elements(case: tuple[tuple[int, ...], int, tuple[int, ...]], kind: tuple[str, DType], dtype: DType,
                         seed: int) -> None:
    data_dims, axis, idx_dims = case
    rng = rng_for(seed)
    idx = negate_some(rng, rng.integers(0, data_dims[axis], size=idx_dims), data_dims[axis])
    f = Feeds("gather_elements")
    data = f.input("data", values(rng, data_dims, dtype, ScatterNdReduction.ADD), dtype)
    indices = f.leaf(kind[0], "indices", encode(rng, idx, kind[1]), kind[1])
    f.verify([f.graph.gather_elements(data, indices, axis - len(data_dims) * (seed % 2), name="out")])


# ------------------------------------------------------------------------------ edge cases


@pytest.mark.parametrize("reduction", ["max", "min"])
def test_max_min_ignore_nan(reduction: str) -> None:
    """fmax/fmin: a NaN update loses, NaN data is replaced by a number, and stays NaN only
    when no number arrives; duplicates combine."""
    nan = np.float32(np.nan)
    f = Feeds("nan")
    data = f.input("data", np.array([nan, 1.0, nan, 4.0, 0.0], np.float32))
    indices = f.input("indices", np.array([[0], [1], [1], [2], [3]], np.float32))
    updates = f.input("updates", np.array([2.0, nan, 3.0, nan, -7.0], np.float32))
    report = f.verify([f.graph.scatter_nd(data, indices, updates, reduction, name="out")])
    assert report.checks
    from rlx_mil import reference

    got = reference.evaluate(f.graph, f.inputs)["out"]
    want = [2.0, 3.0 if reduction == "max" else 1.0, np.nan, 4.0 if reduction == "max" else -7.0, 0.0]
    np.testing.assert_array_equal(got, np.asarray(want, np.float32))


def test_scatter_elements_nan_updates_propagate_through_add() -> None:
    nan = np.float32(np.nan)
    f = Feeds("nan_add")
    data = f.input("data", np.array([[1.0, 2.0], [3.0, nan]], np.float32))
    indices = f.constant("indices", np.array([[1, 0]], np.float32))
    updates = f.input("updates", np.array([[nan, 5.0]], np.float32))
    f.verify([f.graph.scatter_elements(data, indices, updates, 0, "max", name="mx"),
              f.graph.scatter_elements(data, indices, updates, 0, "add", name="sum")])


def test_integer_scatter_add_wraps() -> None:
    """I32 accumulation wraps like two's-complement arithmetic (reference and executor agree)."""
    big = np.int32(2**31 - 1)
    f = Feeds("wrap")
    updates = f.input("updates", np.array([big, 5, -3], np.int32), DType.I32)
    indices = f.constant("indices", np.array([1, 1, 0], np.float32))
    f.verify([f.graph.scatter_add(updates, indices, [2], name="out")])
    from rlx_mil import reference

    got = reference.evaluate(f.graph, f.inputs)["out"]
    np.testing.assert_array_equal(got, np.array([-3, -(2**31) + 4], np.int32))


def test_narrow_integer_products_wrap() -> None:
    """I8 data: products beyond 127 wrap into the dtype after the int32 scatter."""
    f = Feeds("wrap8")
    data = f.input("data", np.array([100, 3, -5], np.float32), DType.I8)
    indices = f.input("indices", np.array([[0], [0], [2]], np.float32), DType.I32)
    updates = f.input("updates", np.array([2, 3, 30], np.float32), DType.I8)
    f.verify([f.graph.scatter_nd(data, indices, updates, "mul", name="out")])
    from rlx_mil import reference

    got = reference.evaluate(f.graph, f.inputs)["out"]
    np.testing.assert_array_equal(got, np.array([600 - 512, 3, -150 + 256], np.int8))


def test_constant_indices_out_of_range_are_refused_at_conversion() -> None:
    import rlx_mil

    g = Graph("oor")
    data = g.input("data", [3])
    idx = g.constant(np.array([[3]], np.float32), name="idx")
    g.set_outputs([g.gather_nd(data, idx, name="out")])
    with pytest.raises(AttributeValueError, match=r"outside \[-3, 3\).*indices|indices.*outside"):
        rlx_mil.convert(g, {})
    g2 = Graph("neg")
    updates = g2.input("updates", [1])
    idx2 = g2.constant(np.array([-1], np.float32), name="idx")
    g2.set_outputs([g2.scatter_add(updates, idx2, [4], name="out")])
    with pytest.raises(AttributeValueError, match=r"\[0, 4\)"):
        rlx_mil.convert(g2, {})


@pytest.mark.parametrize("bad", [3.0, -4.0, np.nan])
def test_run_time_indices_out_of_range_are_refused_by_reference_and_executor(bad: float) -> None:
    from rlx_mil import milexec, reference
    from rlx_mil.errors import MilExecError

    f = Feeds("oor_run")
    data = f.input("data", np.arange(3, dtype=np.float32))
    idx = f.input("idx", np.array([0, bad], np.float32))
    f.graph.set_outputs([f.graph.gather_elements(data, idx, 0, name="out")])
    with pytest.raises(EvaluationError, match=r"GatherElements index|finite"):
        reference.evaluate(f.graph, f.inputs)
    if np.isfinite(bad):
        import rlx_mil

        with pytest.raises(MilExecError, match="outside"):
            milexec.run(rlx_mil.convert(f.graph, {}, target="iOS18"), f.inputs)


def test_gather_nd_scalar_positions_and_whole_slices() -> None:
    """indices [k] (one position) picks a whole trailing slice."""
    f = Feeds("slice")
    data = f.input("data", np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    idx = f.input("idx", np.array([1, -2], np.float32), DType.I32)
    f.verify([f.graph.gather_nd(data, idx, name="out")])
