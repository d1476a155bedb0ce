"""Shape and data-movement ops against index-by-index loops."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from refgraph import run_kernel, run_op

from rlx_mil.errors import AttributeValueError, EvaluationError, ShapeError
from rlx_mil.ir import DType
from rlx_mil.ir.ops import Concat, Expand, Gather, Narrow, Reshape, Transpose

shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4)


def _counting(shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
    return np.arange(math.prod(shape)).astype(dtype).reshape(shape)


def _all(shape: tuple[int, ...]) -> itertools.product[tuple[int, ...]]:
    return itertools.product(*(range(n) for n in shape))


@given(data=st.data())
def test_reshape_is_row_major(data: st.DataObject) -> None:
    shape = data.draw(shapes)
    numel = math.prod(shape)
    divisors = [d for d in range(1, numel + 1) if numel % d == 0]
    first = data.draw(st.sampled_from(divisors))
    use_infer = data.draw(st.booleans())
    new = [first, -1 if use_infer else numel // first]
    x = _counting(shape, np.int32)
    y = run_op(Reshape(tuple(new)), [x], [first, numel // first], DType.I32)
    assert y.dtype == np.int32
    flat = [int(x[idx]) for idx in _all(shape)]
    assert [int(y[idx]) for idx in _all(y.shape)] == flat


def test_reshape_rejects_bad_targets() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(AttributeValueError):
        run_kernel(Reshape((-1, -1)), [x], [6])
    with pytest.raises(AttributeValueError):
        run_kernel(Reshape((-2, 3)), [x], [2, 3])
    with pytest.raises(ShapeError):
        run_kernel(Reshape((4, 2)), [x], [4, 2])


@given(data=st.data())
def test_transpose(data: st.DataObject) -> None:
    shape = data.draw(shapes)
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    x = _counting(shape)
    out_shape = tuple(shape[p] for p in perm)
    y = run_op(Transpose(perm), [x], out_shape)
    for idx in _all(out_shape):
        src = [0] * len(shape)
        for i, p in enumerate(perm):
            src[p] = idx[i]
        assert y[idx] == x[tuple(src)]


@given(data=st.data())
def test_narrow(data: st.DataObject) -> None:
    shape = data.draw(shapes)
    axis = data.draw(st.integers(0, len(shape) - 1))
    start = data.draw(st.integers(0, shape[axis] - 1))
    length = data.draw(st.integers(1, shape[axis] - start))
    x = _counting(shape)
    out_shape = tuple(length if d == axis else n for d, n in enumerate(shape))
    y = run_op(Narrow(axis, start, length), [x], out_shape)
    for idx in _all(out_shape):
        src = tuple(i + start if d == axis else i for d, i in enumerate(idx))
        assert y[idx] == x[src]


def test_narrow_out_of_range() -> None:
    with pytest.raises(AttributeValueError):
        run_kernel(Narrow(0, 2, 2), [np.zeros((3,), np.float32)], [2])


@given(data=st.data())
def test_concat(data: st.DataObject) -> None:
    shape = data.draw(shapes)
    axis = data.draw(st.integers(0, len(shape) - 1))
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
    parts = [
        _counting(tuple(s if d == axis else n for d, n in enumerate(shape))) + 100 * i for i, s in enumerate(sizes)
    ]
    out_shape = tuple(sum(sizes) if d == axis else n for d, n in enumerate(shape))
    y = run_op(Concat(axis), parts, out_shape)
    for idx in _all(out_shape):
        pos, part = idx[axis], 0
        while pos >= sizes[part]:
            pos -= sizes[part]
            part += 1
        assert y[idx] == parts[part][(*idx[:axis], pos, *idx[axis + 1:])]


def test_concat_rejects_mismatched_inputs() -> None:
    with pytest.raises(ShapeError) as info:
        run_kernel(Concat(0), [np.zeros((1, 2), np.float32), np.zeros((1, 3), np.float32)], [2, 2])
    assert info.value.operand == "1"


@given(data=st.data())
def test_expand(data: st.DataObject) -> None:
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3))
    extra = data.draw(st.lists(st.integers(1, 3), max_size=2))
    spec, target = list(extra), list(extra)
    for n in shape:
        keep = data.draw(st.booleans())  # -1 keeps the input's dim
        size = n if n != 1 else data.draw(st.integers(1, 3))
        spec.append(-1 if keep else size)
        target.append(n if keep else size)
    x = _counting(shape)
    y = run_op(Expand(tuple(spec)), [x], target)
    for idx in _all(tuple(target)):
        src = tuple(0 if shape[d] == 1 else idx[len(extra) + d] for d in range(len(shape)))
        assert y[idx] == x[src]


def test_expand_only_grows_unit_dims() -> None:
    with pytest.raises(ShapeError):
        run_kernel(Expand((2, 4)), [np.zeros((2, 3), np.float32)], [2, 4])


@given(data=st.data())
def test_gather_takes_along_axis(data: st.DataObject) -> None:
    shape = data.draw(shapes)
    axis = data.draw(st.integers(0, len(shape) - 1))
    idx_shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=3))
    as_float = data.draw(st.booleans())
    indices = data.draw(hnp.arrays(np.int64, idx_shape, elements=st.integers(0, shape[axis] - 1)))
    fed = indices.astype(np.float32) + (np.float32(0.75) if as_float else 0)  # truncates toward zero
    table = _counting(shape)
    out_shape = shape[:axis] + idx_shape + shape[axis + 1 :]
    y = run_op(Gather(axis), [table, fed if as_float else indices], out_shape)
    for idx in _all(out_shape):
        lead, mid, rest = idx[:axis], idx[axis : axis + len(idx_shape)], idx[axis + len(idx_shape) :]
        assert y[idx] == table[(*lead, int(indices[mid]), *rest)]


def test_gather_bounds_are_checked() -> None:
    table = _counting((4, 2))
    with pytest.raises(EvaluationError, match="out of range") as info:
        run_op(Gather(0), [table, np.array([0.0, 4.0, -1.0], np.float32)], [3, 2])
    assert "node %2" in str(info.value) and "2 indices outside [0, 4)" in info.value.problems[0]
    # -0.5 truncates to 0, which is in range.
    assert run_op(Gather(0), [table, np.array([-0.5], np.float32)], [1, 2]).tolist() == [[0.0, 1.0]]
    with pytest.raises(EvaluationError, match="finite"):
        run_kernel(Gather(0), [table, np.array([np.nan], np.float32)], [1, 2])


def test_embedding_lookup_keeps_table_dtype() -> None:
    table = np.arange(12, dtype=np.float16).reshape(6, 2)
    ids = np.array([[5, 0], [2, 2]], np.int64)
    y = run_op(Gather(0), [table, ids], [2, 2, 2], DType.F16)
    assert y.dtype == np.float16 and y.tolist() == [[[10, 11], [0, 1]], [[4, 5], [4, 5]]]
