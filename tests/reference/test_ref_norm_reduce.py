"""Normalization, softmax, reductions, scans and TopK against loop oracles."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from oracles import group_norm_oracle, layer_norm_oracle, rms_norm_oracle
from refgraph import run_kernel, run_op

from rlx_mil.errors import AttributeValueError
from rlx_mil.ir import DType
from rlx_mil.ir.ops import (
    Cumsum,
    FusedResidualLN,
    FusedResidualRmsNorm,
    GroupNorm,
    LayerNorm,
    Reduce,
    ReduceOp,
    RmsNorm,
    Softmax,
    TopK,
)

values = st.floats(-10, 10, width=32)
shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5)


def _affine(data: st.DataObject, h: int) -> tuple[np.ndarray, np.ndarray]:
    gamma = data.draw(hnp.arrays(np.float32, (h,), elements=st.floats(-2, 2, width=32)))
    beta = data.draw(hnp.arrays(np.float32, (h,), elements=st.floats(-2, 2, width=32)))
    return gamma, beta


@given(data=st.data())
def test_layer_norm(data: st.DataObject) -> None:
    x = data.draw(hnp.arrays(np.float32, shapes, elements=values))
    gamma, beta = _affine(data, x.shape[-1])
    eps = data.draw(st.sampled_from([1e-5, 1e-12, 0.1]))
    axis = data.draw(st.sampled_from([-1, x.ndim - 1]))
    y = run_op(LayerNorm(axis, eps), [x, gamma, beta], x.shape)
    np.testing.assert_allclose(y, layer_norm_oracle(x, gamma, beta, float(np.float32(eps))), rtol=2e-4, atol=2e-4)


def test_layer_norm_is_two_pass() -> None:
    # One-pass E[x^2] - mean^2 loses every digit here in float32; two-pass keeps them.
    x = (np.float32(1e4) + np.array([[0.0, 1.0, 2.0, 3.0]], np.float32)).astype(np.float32)
    ones, zeros = np.ones(4, np.float32), np.zeros(4, np.float32)
    y = run_op(LayerNorm(-1, 1e-12), [x, ones, zeros], x.shape)
    np.testing.assert_allclose(y, layer_norm_oracle(x, ones, zeros, 1e-12), rtol=1e-5, atol=1e-5)


def test_norm_axis_must_be_last() -> None:
    x = np.ones((2, 3), np.float32)
    with pytest.raises(AttributeValueError):
        run_kernel(LayerNorm(0, 1e-5), [x, np.ones(3, np.float32), np.zeros(3, np.float32)], [2, 3])
    with pytest.raises(AttributeValueError):
        run_kernel(RmsNorm(0, 1e-5), [x, np.ones(3, np.float32), np.zeros(3, np.float32)], [2, 3])


@given(data=st.data())
def test_rms_norm_adds_beta(data: st.DataObject) -> None:
    x = data.draw(hnp.arrays(np.float32, shapes, elements=values))
    gamma, beta = _affine(data, x.shape[-1])
    y = run_op(RmsNorm(-1, 1e-5), [x, gamma, beta], x.shape)
    np.testing.assert_allclose(y, rms_norm_oracle(x, gamma, beta, float(np.float32(1e-5))), rtol=2e-4, atol=2e-4)


def test_rms_norm_fp16_input_computes_in_f32() -> None:
    x = np.array([[300.0, -200.0, 250.0, 100.0]], np.float16)  # x^2 overflows float16
    y = run_op(RmsNorm(-1, 1e-5), [x, np.ones(4, np.float16), np.zeros(4, np.float16)], x.shape, DType.F16)
    assert y.dtype == np.float16 and np.isfinite(y).all()
    want = rms_norm_oracle(x.astype(np.float64), np.ones(4), np.zeros(4), 1e-5)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=2e-3)


@given(data=st.data())
def test_group_norm(data: st.DataObject) -> None:
    groups = data.draw(st.integers(1, 3))
    c = groups * data.draw(st.integers(1, 3))
    spatial = data.draw(st.lists(st.integers(1, 3), min_size=0, max_size=2))
    x = data.draw(hnp.arrays(np.float32, (data.draw(st.integers(1, 3)), c, *spatial), elements=values))
    gamma, beta = _affine(data, c)
    y = run_kernel(GroupNorm(groups, 1e-5), [x, gamma, beta], x.shape)
    np.testing.assert_allclose(y, group_norm_oracle(x, gamma, beta, groups, float(np.float32(1e-5))), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("rms", [False, True])
def test_fused_residual_norms(has_bias: bool, rms: bool) -> None:
    rng = np.random.default_rng(7)
    x, res = rng.standard_normal((2, 3, 8)).astype(np.float32), rng.standard_normal((2, 3, 8)).astype(np.float32)
    bias = rng.standard_normal(8).astype(np.float32)
    gamma, beta = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    total = x.astype(np.float64) + res + (bias if has_bias else 0.0)
    op = FusedResidualRmsNorm(has_bias, 1e-6) if rms else FusedResidualLN(has_bias, 1e-6)
    args = [x, res, *([bias] if has_bias else []), gamma, beta]
    y = run_op(op, args, x.shape)
    oracle = rms_norm_oracle if rms else layer_norm_oracle
    np.testing.assert_allclose(y, oracle(total, gamma, beta, float(np.float32(1e-6))), rtol=2e-4, atol=2e-4)


# ------------------------------------------------------------------------------ softmax


@given(data=st.data())
def test_softmax_any_axis(data: st.DataObject) -> None:
    x = data.draw(hnp.arrays(np.float32, shapes, elements=st.floats(-80, 80, width=32)))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    y = run_op(Softmax(axis), [x], x.shape)
    ax = axis % x.ndim
    want = np.zeros(x.shape)
    for idx in itertools.product(*(range(n) if d != ax else [0] for d, n in enumerate(x.shape))):
        line = [float(x[(*idx[:ax], j, *idx[ax + 1:])]) for j in range(x.shape[ax])]
        top = max(line)
        total = math.fsum(math.exp(v - top) for v in line)
        for j, v in enumerate(line):
            want[(*idx[:ax], j, *idx[ax + 1:])] = math.exp(v - top) / total
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------ reduce


def _reduce_loop(kind: ReduceOp, x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    out_shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    out = np.zeros(out_shape)
    groups: dict[tuple[int, ...], list[float]] = {}
    for idx in itertools.product(*(range(n) for n in x.shape)):
        key = tuple(0 if d in axes else i for d, i in enumerate(idx))
        groups.setdefault(key, []).append(float(x[idx]))
    for key, vals in groups.items():
        finite = [v for v in vals if not math.isnan(v)]
        if kind is ReduceOp.SUM:
            out[key] = math.fsum(vals)
        elif kind is ReduceOp.MEAN:
            out[key] = math.fsum(vals) / len(vals)
        elif kind is ReduceOp.PROD:
            out[key] = math.prod(vals)
        elif kind is ReduceOp.MAX:
            out[key] = max(finite) if finite else math.nan
        else:
            out[key] = min(finite) if finite else math.nan
    if keep:
        return out
    return out.reshape(tuple(n for d, n in enumerate(x.shape) if d not in axes))


@pytest.mark.parametrize("kind", list(ReduceOp))
@given(data=st.data())
def test_reduce(kind: ReduceOp, data: st.DataObject) -> None:
    elems = st.floats(-3, 3, width=32) | st.just(np.nan) if kind in (ReduceOp.MAX, ReduceOp.MIN) else st.floats(-3, 3, width=32)
    x = data.draw(hnp.arrays(np.float32, shapes, elements=elems))
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, x.ndim - 1), min_size=1))))
    keep = data.draw(st.booleans())
    out_dims = [1 if d in axes else n for d, n in enumerate(x.shape)] if keep else [n for d, n in enumerate(x.shape) if d not in axes]
    y = run_op(Reduce(kind, axes, keep), [x], out_dims)
    want = _reduce_loop(kind, x, axes, keep)
    np.testing.assert_allclose(y, want.reshape(y.shape), rtol=1e-5, atol=1e-5, equal_nan=True)


def test_reduce_max_ignores_nan() -> None:
    x = np.array([[np.nan, 1.0, 3.0], [np.nan, np.nan, np.nan]], np.float32)
    y = run_op(Reduce(ReduceOp.MAX, (1,), False), [x], [2])
    assert y[0] == 3.0 and np.isnan(y[1])


def test_reduce_rejects_bad_axes() -> None:
    x = np.ones((2, 3), np.float32)
    for axes in [(), (0, 0), (2,)]:
        with pytest.raises(AttributeValueError):
            run_kernel(Reduce(ReduceOp.SUM, axes, False), [x], [2])


# ------------------------------------------------------------------------------ cumsum, topk


@given(data=st.data())
def test_cumsum(data: st.DataObject) -> None:
    x = data.draw(hnp.arrays(np.float32, shapes, elements=st.integers(-50, 50).map(float)))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    exclusive = data.draw(st.booleans())
    y = run_op(Cumsum(axis, exclusive), [x], x.shape)
    ax = axis % x.ndim
    want = np.zeros(x.shape)
    for idx in itertools.product(*(range(n) for n in x.shape)):
        stop = idx[ax] if exclusive else idx[ax] + 1
        want[idx] = sum(float(x[(*idx[:ax], j, *idx[ax + 1:])]) for j in range(stop))
    np.testing.assert_array_equal(y, want)


@given(data=st.data())
def test_topk_stable_descending(data: st.DataObject) -> None:
    x = data.draw(hnp.arrays(np.float32, shapes, elements=st.sampled_from([0.0, 1.0, -1.0, 2.5, 7.0])))
    k = data.draw(st.integers(1, x.shape[-1]))
    y = run_op(TopK(k), [x], (*x.shape[:-1], k))
    assert y.dtype == np.float32
    for idx in itertools.product(*(range(n) for n in x.shape[:-1])):
        row = [float(v) for v in x[idx]]
        order = sorted(range(len(row)), key=lambda j: (-row[j], j))
        assert y[idx].tolist() == [float(j) for j in order[:k]]


def test_topk_ties_pick_smaller_index_and_can_be_i64() -> None:
    x = np.array([[1.0, 3.0, 3.0, 2.0, 3.0]], np.float32)
    assert run_op(TopK(4), [x], [1, 4]).tolist() == [[1.0, 2.0, 4.0, 3.0]]
    y = run_kernel(TopK(2), [x], [1, 2], DType.I64)
    assert y.dtype == np.int64 and y.tolist() == [[1, 2]]
