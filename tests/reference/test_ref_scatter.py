"""Reference scatter / gather kernels against loop-by-loop formulations of the spec, plus the
section 9 edge cases: duplicates, NaN, out-of-range and negative indices, empty dims, overflow."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlx_mil import reference
from rlx_mil.errors import EvaluationError
from rlx_mil.ir.graph import Graph

_COMBINE = {"None": lambda o, u: u, "Add": lambda o, u: o + u, "Mul": lambda o, u: o * u,
            "Max": np.fmax, "Min": np.fmin}


def loop_scatter_nd(data: np.ndarray, idx: np.ndarray, updates: np.ndarray, reduction: str) -> np.ndarray:
    out = data.copy()
    for p in np.ndindex(*idx.shape[:-1]):
        c = tuple(int(v) + (data.shape[i] if v < 0 else 0) for i, v in enumerate(idx[p]))
        out[c] = _COMBINE[reduction](out[c], updates[p])
    return out


def loop_scatter_elements(data: np.ndarray, idx: np.ndarray, updates: np.ndarray, axis: int, reduction: str) -> np.ndarray:
    out = data.copy()
    ax = axis % data.ndim
    for p in np.ndindex(*idx.shape):
        i = int(idx[p])
        i += data.shape[ax] if i < 0 else 0
        q = (*p[:ax], i, *p[ax + 1:])
        out[q] = _COMBINE[reduction](out[q], updates[p])
    return out


def loop_gather_nd(data: np.ndarray, idx: np.ndarray, b: int) -> np.ndarray:
    k = idx.shape[-1]
    out = np.empty(idx.shape[:-1] + data.shape[b + k:], data.dtype)
    for p in np.ndindex(*idx.shape[:-1]):
        c = tuple(int(v) + (data.shape[b + i] if v < 0 else 0) for i, v in enumerate(idx[p]))
        out[p] = data[p[:b] + c]
    return out


def _run(g: Graph, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return reference.evaluate(g, feeds)["out"]


@settings(max_examples=40, deadline=None)
@given(data=hnp.array_shapes(min_dims=1, max_dims=3, max_side=4), seed=st.integers(0, 2**31),
       reduction=st.sampled_from(list(_COMBINE)))
def test_scatter_nd_matches_the_loop(data: tuple[int, ...], seed: int, reduction: str) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, len(data) + 1))
    n = int(rng.integers(1, 7))
    idx = np.stack([rng.integers(-d, d, size=n) for d in data[:k]], axis=-1)
    x = rng.normal(size=data).astype(np.float32)
    u = rng.normal(size=(n, *data[k:])).astype(np.float32)
    g = Graph()
    out = g.scatter_nd(g.input("x", list(data)), g.input("i", [n, k], "i64"), g.input("u", [n, *data[k:]]), reduction, name="out")
    g.set_outputs([out])
    np.testing.assert_allclose(_run(g, {"x": x, "i": idx, "u": u}), loop_scatter_nd(x, idx, u, reduction), rtol=1e-6)


@settings(max_examples=40, deadline=None)
@given(data=hnp.array_shapes(min_dims=1, max_dims=3, max_side=4), seed=st.integers(0, 2**31),
       reduction=st.sampled_from(list(_COMBINE)))
def test_scatter_and_gather_elements_match_the_loop(data: tuple[int, ...], seed: int, reduction: str) -> None:
    rng = np.random.default_rng(seed)
    axis = int(rng.integers(-len(data), len(data)))
    shape = tuple(int(rng.integers(1, d + 1)) if i != axis % len(data) else int(rng.integers(1, 5)) for i, d in enumerate(data))
    n = data[axis]
    idx = rng.integers(-n, n, size=shape).astype(np.float32) + np.float32(0.5) * np.sign(rng.normal(size=shape)).astype(np.float32)
    idx = np.clip(idx, -n + 0.25, n - 0.75).astype(np.float32)
    x = rng.normal(size=data).astype(np.float32)
    u = rng.normal(size=shape).astype(np.float32)
    g = Graph()
    xi, ii = g.input("x", list(data)), g.input("i", list(shape))
    g.set_outputs([g.scatter_elements(xi, ii, g.input("u", list(shape)), axis, reduction, name="out"),
                   g.gather_elements(xi, ii, axis, name="gathered")])
    got = reference.evaluate(g, {"x": x, "i": idx, "u": u})
    truncated = np.trunc(idx).astype(np.int64)
    np.testing.assert_allclose(got["out"], loop_scatter_elements(x, truncated, u, axis, reduction), rtol=1e-6)
    ax = axis % len(data)
    wrapped = np.where(truncated < 0, truncated + n, truncated)
    np.testing.assert_array_equal(got["gathered"], np.take_along_axis(x[tuple(slice(0, s) if i != ax else slice(None) for i, s in enumerate(shape))], wrapped, ax))


@settings(max_examples=40, deadline=None)
@given(data=hnp.array_shapes(min_dims=1, max_dims=4, max_side=3), seed=st.integers(0, 2**31))
def test_gather_nd_matches_the_loop(data: tuple[int, ...], seed: int) -> None:
    rng = np.random.default_rng(seed)
    b = int(rng.integers(0, len(data)))
    k = int(rng.integers(1, len(data) - b + 1))
    positions = tuple(int(s) for s in rng.integers(1, 3, size=int(rng.integers(0, 3))))
    idx = np.stack([rng.integers(-d, d, size=(*data[:b], *positions)) for d in data[b:b + k]], axis=-1)
    x = rng.normal(size=data).astype(np.float32)
    g = Graph()
    g.set_outputs([g.gather_nd(g.input("x", list(data)), g.input("i", list(idx.shape), "i32"), b, name="out")])
    np.testing.assert_array_equal(_run(g, {"x": x, "i": idx.astype(np.int32)}), loop_gather_nd(x, idx, b))


def test_scatter_nd_none_last_write_wins_and_add_accumulates_in_order() -> None:
    g = Graph()
    x = g.input("x", [3])
    i = g.input("i", [4, 1])
    u = g.input("u", [4])
    g.set_outputs([g.scatter_nd(x, i, u, "None", name="out"), g.scatter_nd(x, i, u, "Add", name="sum")])
    got = reference.evaluate(g, {"x": np.zeros(3, np.float32), "i": np.array([[1], [1], [-1], [1]], np.float32),
                                 "u": np.array([5, 6, 7, 8], np.float32)})
    np.testing.assert_array_equal(got["out"], [0, 8, 7])
    np.testing.assert_array_equal(got["sum"], [0, 19, 7])


def test_scatter_add_rejects_negative_and_out_of_range_indices() -> None:
    g = Graph()
    g.set_outputs([g.scatter_add(g.input("u", [2]), g.input("i", [2]), [3], name="out")])
    for bad in ([0, -1], [0, 3]):
        with pytest.raises(EvaluationError, match="ScatterAdd index out of range"):
            _run(g, {"u": np.ones(2, np.float32), "i": np.array(bad, np.float32)})
    with pytest.raises(EvaluationError, match="finite"):
        _run(g, {"u": np.ones(2, np.float32), "i": np.array([0, np.inf], np.float32)})
    np.testing.assert_array_equal(_run(g, {"u": np.ones(2, np.float32), "i": np.array([2.9, 2.2], np.float32)}), [0, 0, 2])


def test_onnx_ops_reject_indices_beyond_minus_dim() -> None:
    g = Graph()
    g.set_outputs([g.gather_nd(g.input("x", [3, 2]), g.input("i", [1, 2], "i32"), name="out")])
    with pytest.raises(EvaluationError, match="GatherNd index out of range"):
        _run(g, {"x": np.zeros((3, 2), np.float32), "i": np.array([[-4, 0]], np.int32)})


def test_empty_dims() -> None:
    """Zero updates leave data (or zeros) untouched; an empty gather is empty."""
    g = Graph()
    x = g.input("x", [3, 2])
    g.set_outputs([
        g.scatter_add(g.input("u", [0, 2]), g.input("i", [0]), [3, 2], name="sa"),
        g.scatter_nd(x, g.input("p", [0, 1]), g.input("v", [0, 2]), "Add", name="sn"),
        g.gather_nd(x, g.input("q", [0, 2]), name="gn"),
        g.gather_elements(x, g.input("e", [3, 0], "i32"), 1, name="ge"),
    ])
    xv = np.arange(6, dtype=np.float32).reshape(3, 2)
    got = reference.evaluate(g, {"x": xv, "u": np.zeros((0, 2), np.float32), "i": np.zeros(0, np.float32),
                                 "p": np.zeros((0, 1), np.float32), "v": np.zeros((0, 2), np.float32),
                                 "q": np.zeros((0, 2), np.float32), "e": np.zeros((3, 0), np.int32)})
    np.testing.assert_array_equal(got["sa"], np.zeros((3, 2)))
    np.testing.assert_array_equal(got["sn"], xv)
    assert got["gn"].shape == (0,) and got["ge"].shape == (3, 0)


def test_bool_and_f16_data() -> None:
    g = Graph()
    b = g.input("b", [3], "bool")
    h = g.input("h", [3], "f16")
    i = g.input("i", [2, 1], "i32")
    g.set_outputs([g.scatter_nd(b, i, g.input("bu", [2], "bool"), "Add", name="bo"),
                   g.scatter_nd(h, i, g.input("hu", [2], "f16"), "Add", name="ho")])
    got = reference.evaluate(g, {"b": np.array([False, True, False]), "bu": np.array([True, True]),
                                 "h": np.array([2048, 1, 0], np.float16), "hu": np.array([1, 0.5], np.float16),
                                 "i": np.array([[0], [0]], np.int32)})
    np.testing.assert_array_equal(got["bo"], [True, True, False])
    assert got["ho"].dtype == np.float16 and got["ho"][0] == np.float16(2050)  # 2049.5 rounds to even
