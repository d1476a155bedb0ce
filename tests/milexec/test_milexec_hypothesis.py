"""Property tests over shapes and attributes for the core kernels, against plain NumPy."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from milexec_util import build_function

from rlx_mil import milexec

dims = st.integers(min_value=1, max_value=5)
shapes = st.lists(dims, min_size=1, max_size=4).map(tuple)
float_dtypes = st.sampled_from([np.float32, np.float16])


def mb() -> Any:
    from coremltools.converters.mil import Builder

    return Builder


def data(draw: st.DrawFn, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    seed = draw(st.integers(0, 2**16))
    return np.random.default_rng(seed).uniform(-2, 2, size=shape).astype(dtype)


def run_one(feeds: dict[str, np.ndarray], build: Any, **kw: Any) -> np.ndarray:
    function = build_function(feeds, lambda v: [build(v)])
    (out,) = milexec.run(function, feeds, **kw).values()
    return out


@st.composite
def linear_case(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    lead = draw(st.lists(dims, min_size=0, max_size=2))
    d_in, d_out = draw(dims), draw(dims)
    dtype = draw(float_dtypes)
    bias = data(draw, (d_out,), dtype) if draw(st.booleans()) else None
    return data(draw, (*lead, d_in), dtype), data(draw, (d_out, d_in), dtype), bias


@given(linear_case())
def test_linear(case: tuple[np.ndarray, np.ndarray, np.ndarray | None]) -> None:
    x, w, b = case
    kwargs = {"bias": b} if b is not None else {}
    out = run_one({"x": x}, lambda v: mb().linear(x=v["x"], weight=w, **kwargs))
    expected = x.astype(np.float32) @ w.astype(np.float32).T + (0 if b is None else b.astype(np.float32))
    if x.dtype == np.float16:
        # fp32 accumulation, one rounding to fp16 at the end (BLAS summation order may move a
        # tie by one fp16 ulp).
        np.testing.assert_array_equal(out, out.astype(np.float16).astype(np.float32))
        np.testing.assert_allclose(out, expected.astype(np.float16), rtol=2**-10, atol=2**-24)
    else:
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@st.composite
def matmul_case(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, bool, bool]:
    batch = draw(st.lists(dims, min_size=0, max_size=2))
    other_batch = [draw(st.sampled_from([1, n])) for n in batch]
    m, k, n = draw(dims), draw(dims), draw(dims)
    tx, ty = draw(st.booleans()), draw(st.booleans())
    x = data(draw, (*batch, *((k, m) if tx else (m, k))))
    y = data(draw, (*other_batch, *((n, k) if ty else (k, n))))
    return x, y, tx, ty


@given(matmul_case())
def test_matmul_with_transposes_and_broadcast(case: tuple[np.ndarray, np.ndarray, bool, bool]) -> None:
    x, y, tx, ty = case
    out = run_one({"x": x, "y": y}, lambda v: mb().matmul(x=v["x"], y=v["y"], transpose_x=tx, transpose_y=ty))
    xx = np.swapaxes(x, -1, -2) if tx else x
    yy = np.swapaxes(y, -1, -2) if ty else y
    np.testing.assert_allclose(out, xx @ yy, rtol=1e-5, atol=1e-5)


@st.composite
def axis_case(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    shape = draw(shapes)
    return data(draw, shape, draw(float_dtypes)), draw(st.integers(-len(shape), len(shape) - 1))


@given(axis_case())
def test_softmax_any_axis(case: tuple[np.ndarray, int]) -> None:
    x, axis = case
    out = run_one({"x": x}, lambda v: mb().softmax(x=v["x"], axis=axis))
    wide = x.astype(np.float64)
    e = np.exp(wide - wide.max(axis=axis, keepdims=True))
    expected = e / e.sum(axis=axis, keepdims=True)
    np.testing.assert_allclose(out, expected, rtol=1e-3 if x.dtype == np.float16 else 1e-5, atol=1e-6)


@st.composite
def reduce_case(draw: st.DrawFn) -> tuple[np.ndarray, list[int], bool, str]:
    shape = draw(shapes)
    axes = draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True))
    op = draw(st.sampled_from(["reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_sum_square"]))
    return data(draw, shape), axes, draw(st.booleans()), op


@given(reduce_case())
def test_reductions_over_any_axes(case: tuple[np.ndarray, list[int], bool, str]) -> None:
    x, axes, keep, op = case
    out = run_one({"x": x}, lambda v: getattr(mb(), op)(x=v["x"], axes=axes, keep_dims=keep))
    fn = {
        "reduce_sum": np.sum,
        "reduce_mean": np.mean,
        "reduce_max": np.max,
        "reduce_min": np.min,
        "reduce_sum_square": lambda a, axis, keepdims: np.sum(a * a, axis=axis, keepdims=keepdims),
    }[op]
    np.testing.assert_allclose(out, fn(x, axis=tuple(axes), keepdims=keep), rtol=1e-5, atol=1e-5)


@st.composite
def transpose_case(draw: st.DrawFn) -> tuple[np.ndarray, list[int]]:
    shape = draw(shapes)
    return data(draw, shape), draw(st.permutations(list(range(len(shape)))))


@given(transpose_case())
def test_transpose_any_permutation(case: tuple[np.ndarray, list[int]]) -> None:
    x, perm = case
    np.testing.assert_array_equal(
        run_one({"x": x}, lambda v: mb().transpose(x=v["x"], perm=perm)), x.transpose(perm)
    )


@st.composite
def slice_case(draw: st.DrawFn) -> tuple[np.ndarray, list[int], list[int], list[int], list[bool], list[bool]]:
    shape = draw(shapes)
    begin, end, stride, begin_mask, end_mask = [], [], [], [], []
    for n in shape:
        step = draw(st.sampled_from([1, 2, 3, -1, -2]))
        lo, hi = draw(st.integers(-n, n - 1)), draw(st.integers(-n, n))
        begin.append(lo)
        end.append(hi)
        stride.append(step)
        begin_mask.append(draw(st.booleans()))
        end_mask.append(draw(st.booleans()))
    return data(draw, shape), begin, end, stride, begin_mask, end_mask


@given(slice_case())
def test_slice_by_index_is_python_slicing(
    case: tuple[np.ndarray, list[int], list[int], list[int], list[bool], list[bool]],
) -> None:
    x, begin, end, stride, bmask, emask = case
    expected = x[
        tuple(
            slice(None if bm else b, None if em else e, s)
            for b, e, s, bm, em in zip(begin, end, stride, bmask, emask, strict=True)
        )
    ]
    if 0 in expected.shape:
        return  # MIL has no empty tensors
    out = run_one(
        {"x": x},
        lambda v: mb().slice_by_index(
            x=v["x"], begin=begin, end=end, stride=stride, begin_mask=bmask, end_mask=emask
        ),
    )
    np.testing.assert_array_equal(out, expected)


@st.composite
def concat_case(draw: st.DrawFn) -> tuple[list[np.ndarray], int]:
    shape = draw(shapes)
    axis = draw(st.integers(0, len(shape) - 1))
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        part_shape = list(shape)
        part_shape[axis] = draw(dims)
        parts.append(data(draw, tuple(part_shape)))
    return parts, axis


@given(concat_case())
def test_concat_then_split_round_trips(case: tuple[list[np.ndarray], int]) -> None:
    parts, axis = case
    feeds = {f"p{i}": p for i, p in enumerate(parts)}
    sizes = [p.shape[axis] for p in parts]

    def build(v: dict[str, Any]) -> list[Any]:
        joined = mb().concat(values=[v[k] for k in feeds], axis=axis, name="joined")
        if len(parts) == 1:
            return [joined]
        return [joined, *mb().split(x=joined, split_sizes=sizes, axis=axis)]

    out = list(milexec.run(build_function(feeds, build), feeds).values())
    np.testing.assert_array_equal(out[0], np.concatenate(parts, axis=axis))
    for piece, part in zip(out[1:], parts, strict=False):
        np.testing.assert_array_equal(piece, part)
