"""Rope, Conv and Pool against the loop oracles."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from oracles import conv_oracle, pool_oracle, rope_oracle
from refgraph import run_kernel, run_op

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir import DType
from rlx_mil.ir.ops import Conv, Pool, ReduceOp, Rope


def _tables(rows: int, half: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    pos = np.arange(rows)[:, None]
    freq = base ** (-2 * np.arange(half) / (2 * half))
    angle = pos * freq[None, :]
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


@given(data=st.data())
def test_rope_all_ranks_partial_and_single_row(data: st.DataObject) -> None:
    rank = data.draw(st.sampled_from([2, 3, 4]))
    head_dim = 2 * data.draw(st.integers(1, 4))
    n_rot = 2 * data.draw(st.integers(0, head_dim // 2))
    heads = data.draw(st.integers(1, 3))
    seq = data.draw(st.integers(1, 5))
    batch = data.draw(st.integers(1, 2))
    rows = data.draw(st.sampled_from([1, seq, seq + 2]))
    shape = {2: (seq, heads * head_dim), 3: (batch, seq, heads * head_dim), 4: (batch, heads, seq, head_dim)}[rank]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.standard_normal(shape).astype(np.float32)
    cos, sin = _tables(rows, head_dim // 2)
    y = run_op(Rope(head_dim, n_rot), [x, cos, sin], shape)
    np.testing.assert_allclose(y, rope_oracle(x, cos, sin, head_dim, n_rot), rtol=1e-6, atol=1e-6)


def test_rope_rotates_pairs_half_apart() -> None:
    # One head of 4, position 1 with angle 90 degrees on pair 0 and 0 degrees on pair 1.
    x = np.array([[[0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]]], np.float32)  # [B=1, S=2, 4]
    cos = np.array([[1.0, 1.0], [0.0, 1.0]], np.float32)
    sin = np.array([[0.0, 0.0], [1.0, 0.0]], np.float32)
    y = run_op(Rope(4, 4), [x, cos, sin], x.shape)
    # out[:2] = x[:2]*c - x[2:]*s ; out[2:] = x[2:]*c + x[:2]*s  -> [1*0-3*1, 2*1-4*0, 3*0+1*1, 4*1+2*0]
    assert y[0, 1].tolist() == [-3.0, 2.0, 1.0, 4.0]
    partial = run_op(Rope(4, 2), [x, cos, sin], x.shape)
    assert partial[0, 1].tolist() == [-2.0, 1.0, 3.0, 4.0]  # pair (0, 1) rotated, dims 2-3 copied


def test_rope_fp16_and_short_tables() -> None:
    x = np.ones((1, 3, 4), np.float16)
    cos, sin = _tables(3, 2)
    y = run_op(Rope(4, 4), [x, cos.astype(np.float16), sin.astype(np.float16)], x.shape, DType.F16)
    assert y.dtype == np.float16
    with pytest.raises(ShapeError):
        run_kernel(Rope(4, 4), [np.ones((1, 3, 4), np.float32), cos[:2], sin[:2]], [1, 3, 4])
    with pytest.raises(AttributeValueError):
        run_kernel(Rope(4, 3), [np.ones((1, 3, 4), np.float32), cos, sin], [1, 3, 4])


# ------------------------------------------------------------------------------ conv


@given(data=st.data())
def test_conv_matches_loops(data: st.DataObject) -> None:
    spatial = data.draw(st.sampled_from([1, 2, 2, 3]))
    groups = data.draw(st.integers(1, 2))
    c_in = groups * data.draw(st.integers(1, 2))
    c_out = groups * data.draw(st.integers(1, 2))
    kernel = [data.draw(st.integers(1, 3)) for _ in range(spatial)]
    stride = [data.draw(st.integers(1, 2)) for _ in range(spatial)]
    padding = [data.draw(st.integers(0, 2)) for _ in range(spatial)]
    dilation = [data.draw(st.integers(1, 2)) for _ in range(spatial)]
    smallest = [max(1, d * (k - 1) + 1 - 2 * p) for k, p, d in zip(kernel, padding, dilation, strict=True)]
    sizes = [data.draw(st.integers(lo, max(lo, 5 if spatial < 3 else 4))) for lo in smallest]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.standard_normal((data.draw(st.integers(1, 2)), c_in, *sizes)).astype(np.float32)
    w = rng.standard_normal((c_out, c_in // groups, *kernel)).astype(np.float32)
    want = conv_oracle(x, w, stride, padding, dilation, groups)
    op = Conv(tuple(kernel), tuple(stride), tuple(padding), tuple(dilation), groups)
    y = run_kernel(op, [x, w], want.shape)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_conv_through_graph_and_defaults() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    y = run_op(Conv((3, 3), (), (), (), 1), [x, w], [1, 4, 3, 3])
    np.testing.assert_allclose(y, conv_oracle(x, w, (1, 1), (0, 0), (1, 1), 1), rtol=1e-5, atol=1e-5)
    depthwise = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    y = run_op(Conv((3, 3), (2, 2), (1, 1), (1, 1), 2), [x, depthwise], [1, 2, 3, 3])
    np.testing.assert_allclose(y, conv_oracle(x, depthwise, (2, 2), (1, 1), (1, 1), 2), rtol=1e-5, atol=1e-5)


def test_conv_rejects_inconsistent_operands() -> None:
    x = np.zeros((1, 3, 4, 4), np.float32)
    with pytest.raises(AttributeValueError):
        run_kernel(Conv((1, 1), (), (), (), 2), [x, np.zeros((2, 1, 1, 1), np.float32)], [1, 2, 4, 4])
    with pytest.raises(ShapeError):
        run_kernel(Conv((1, 1), (), (), (), 1), [x, np.zeros((2, 2, 1, 1), np.float32)], [1, 2, 4, 4])
    with pytest.raises(ShapeError):
        run_kernel(Conv((5, 5), (), (), (), 1), [x, np.zeros((2, 3, 5, 5), np.float32)], [1, 2, 1, 1])


# ------------------------------------------------------------------------------ pool

KINDS = {ReduceOp.MAX: "max", ReduceOp.MIN: "min", ReduceOp.SUM: "sum", ReduceOp.MEAN: "mean", ReduceOp.PROD: "prod"}


@pytest.mark.parametrize("kind", list(ReduceOp))
@given(data=st.data())
def test_pool_matches_loops(kind: ReduceOp, data: st.DataObject) -> None:
    spatial = data.draw(st.sampled_from([1, 2, 3]))
    kernel = [data.draw(st.integers(1, 3)) for _ in range(spatial)]
    stride = [data.draw(st.integers(1, 3)) for _ in range(spatial)]
    padding = [data.draw(st.integers(0, k // 2)) for k in kernel]
    sizes = [data.draw(st.integers(max(1, k - 2 * p), 5)) for k, p in zip(kernel, padding, strict=True)]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.uniform(-2, 2, (data.draw(st.integers(1, 2)), 2, *sizes)).astype(np.float32)
    want = pool_oracle(x, KINDS[kind], kernel, stride, padding)
    y = run_kernel(Pool(kind, tuple(kernel), tuple(stride), tuple(padding)), [x], want.shape)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_pool_padding_conventions() -> None:
    x = np.array([[[[-1.0, -2.0], [-3.0, -4.0]]]], np.float32)
    # 2x2 windows with padding 1, stride 2: each window sees one real cell and three pads.
    mx = run_op(Pool(ReduceOp.MAX, (2, 2), (2, 2), (1, 1)), [x], [1, 1, 2, 2])
    assert mx.tolist() == [[[[-1.0, -2.0], [-3.0, -4.0]]]]  # -inf padding never wins
    mean = run_op(Pool(ReduceOp.MEAN, (2, 2), (2, 2), (1, 1)), [x], [1, 1, 2, 2])
    assert mean.tolist() == [[[[-0.25, -0.5], [-0.75, -1.0]]]]  # divides by the full 4 cells
    prod = run_op(Pool(ReduceOp.PROD, (2, 2), (1, 1), (0, 0)), [x], [1, 1, 1, 1])
    assert prod.tolist() == [[[[24.0]]]]
    assert math.isclose(
        float(run_op(Pool(ReduceOp.SUM, (2, 2), (1, 1), (1, 1)), [x], [1, 1, 3, 3])[0, 0, 1, 1]), -10.0
    )
