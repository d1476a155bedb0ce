"""Lowering of Conv and Pool (spec section 11).

coremltools has no value_inference for conv / max_pool / avg_pool, so the converted programs
are evaluated with the NumPy kernels below, written from the MIL op definitions (custom
before/after pads, dilations, groups; max_pool never picks a padded cell; avg_pool with
exclude_padding_from_average=False divides by the kernel area). Results are compared with
`rlx_mil.reference.evaluate`.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import product
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import Pool, ReduceOp
from rlx_mil.reference.interpreter import evaluate

from .conftest import (
    PRECISIONS,
    TARGETS,
    TOLERANCES,
    convert_and_cleanup,
    emitted_ops,
    ops_outside_opset,
    run_model,
)

# -------------------------------------------------------------------------- MIL kernels


def _windows(xp: np.ndarray, kernel: list[int], stride: list[int], dilation: list[int]) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
    """(kernel offset, strided slice of the padded input at that offset) over the window."""
    spatial = len(kernel)
    out = [(xp.shape[2 + i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(spatial)]
    for offset in product(*(range(k) for k in kernel)):
        window = [
            slice(offset[i] * dilation[i], offset[i] * dilation[i] + (out[i] - 1) * stride[i] + 1, stride[i])
            for i in range(spatial)
        ]
        index = (slice(None), slice(None), *window)
        yield offset, xp[index]


def _pad(x: np.ndarray, pads: list[int], value: float) -> np.ndarray:
    widths = [(0, 0), (0, 0)] + [(pads[2 * i], pads[2 * i + 1]) for i in range(x.ndim - 2)]
    return np.pad(x, widths, mode="constant", constant_values=value)


def _ints(op: Any, name: str, default: list[int]) -> list[int]:
    var = getattr(op, name, None)
    return default if var is None else [int(v) for v in np.asarray(var.val).reshape(-1)]


def _conv_kernel(op: Any) -> np.ndarray:
    x = op.x.val.astype(np.float32)
    w = op.weight.val.astype(np.float32)
    spatial = x.ndim - 2
    pads = _ints(op, "pad", [0] * 2 * spatial) if op.pad_type.val == "custom" else [0] * 2 * spatial
    strides, dilations = _ints(op, "strides", [1] * spatial), _ints(op, "dilations", [1] * spatial)
    groups = int(op.groups.val) if op.groups is not None else 1
    xp = _pad(x, pads, 0.0)
    c_out, c_in_g = w.shape[0], w.shape[1]
    c_out_g = c_out // groups
    y: np.ndarray | None = None
    for offset, piece in _windows(xp, list(w.shape[2:]), strides, dilations):
        tap_index = (slice(None), slice(None), *offset)
        taps = w[tap_index]  # [C_out, C_in/g]
        parts = [
            np.einsum("nc...,oc->no...", piece[:, g * c_in_g:(g + 1) * c_in_g],
                      taps[g * c_out_g:(g + 1) * c_out_g])
            for g in range(groups)
        ]
        term = np.concatenate(parts, axis=1)
        y = term if y is None else y + term
    assert y is not None
    return y.astype(op.x.val.dtype)


def _pool_kernel(op: Any, reduce: str) -> np.ndarray:
    x = op.x.val.astype(np.float32)
    spatial = x.ndim - 2
    kernel = _ints(op, "kernel_sizes", [])
    pads = _ints(op, "pad", [0] * 2 * spatial) if op.pad_type.val == "custom" else [0] * 2 * spatial
    strides = _ints(op, "strides", [1] * spatial)
    xp = _pad(x, pads, -np.inf if reduce == "max" else 0.0)
    pieces = [piece for _, piece in _windows(xp, kernel, strides, [1] * spatial)]
    if reduce == "max":
        return np.max(np.stack(pieces), axis=0).astype(op.x.val.dtype)
    assert not bool(op.exclude_padding_from_average.val)
    return (np.sum(np.stack(pieces), axis=0) / np.prod(kernel)).astype(op.x.val.dtype)


MIL_KERNELS = {
    "conv": _conv_kernel,
    "max_pool": lambda op: _pool_kernel(op, "max"),
    "avg_pool": lambda op: _pool_kernel(op, "avg"),
}


def non_const_ops(model: Any) -> list[str]:
    return [t for t in emitted_ops(model) if t != "const"]


def run(model: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    out = run_model(model, feeds, kernels=MIL_KERNELS)
    assert len(out) == 1
    return next(iter(out.values()))


def assert_matches(out: np.ndarray, ref: np.ndarray, precision: str) -> None:
    tol = TOLERANCES[precision]
    scale = max(float(np.max(np.abs(ref))), 1.0)
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=tol["rtol"], atol=tol["atol"] * scale)


def test_kernels_agree_with_the_reference_conv() -> None:
    """The MIL kernels above are themselves checked against the reference on a direct case."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 4, 6, 5)).astype(np.float32)
    w = rng.normal(size=(6, 2, 3, 2)).astype(np.float32)
    g = Graph("conv")
    g.set_outputs([g.conv(g.input("x", list(x.shape)), g.param("w", list(w.shape)), stride=[2, 1],
                          padding=[1, 2], dilation=[1, 2], groups=2, name="y")])
    ref = next(iter(evaluate(g, {"x": x}, {"w": w}).values()))

    def held(val: Any) -> SimpleNamespace:
        return SimpleNamespace(val=val)

    fake_conv = SimpleNamespace(
        x=held(x), weight=held(w), pad_type=held("custom"), pad=held(np.array([1, 1, 2, 2])),
        strides=held(np.array([2, 1])), dilations=held(np.array([1, 2])), groups=held(np.int32(2)),
    )
    np.testing.assert_allclose(_conv_kernel(fake_conv), ref, rtol=1e-5, atol=1e-5)


# -------------------------------------------------------------------------- Conv


@st.composite
def conv_cases(draw: st.DrawFn) -> dict[str, Any]:
    spatial = draw(st.integers(1, 3)) if draw(st.booleans()) else 2
    groups = draw(st.sampled_from([1, 2]))
    c_in = groups * draw(st.integers(1, 2))
    c_out = groups * draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(spatial)]
    stride = [draw(st.integers(1, 2)) for _ in range(spatial)]
    padding = [draw(st.integers(0, 1)) for _ in range(spatial)]
    dilation = [draw(st.integers(1, 2)) for _ in range(spatial)]
    size = [draw(st.integers(dilation[i] * (kernel[i] - 1) + 1, 6)) for i in range(spatial)]
    return {"x": [draw(st.integers(1, 2)), c_in, *size], "w": [c_out, c_in // groups, *kernel],
            "stride": stride, "padding": padding, "dilation": dilation, "groups": groups}


@given(case=conv_cases(), runtime_w=st.booleans(), target=st.sampled_from(TARGETS),
       precision=st.sampled_from(PRECISIONS), seed=st.integers(0, 2**16))
def test_conv_matches_reference(case: dict[str, Any], runtime_w: bool, target: str, precision: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    g = Graph("conv")
    x = g.input("x", case["x"])
    w = g.input("w", case["w"]) if runtime_w else g.param("w", case["w"])
    g.set_outputs([g.conv(x, w, stride=case["stride"], padding=case["padding"], dilation=case["dilation"],
                          groups=case["groups"], name="y")])
    xv = rng.normal(size=case["x"]).astype(np.float32)
    wv = rng.normal(size=case["w"]).astype(np.float32)
    params = {} if runtime_w else {"w": wv}
    feeds = {"x": xv, "w": wv} if runtime_w else {"x": xv}
    model = convert_and_cleanup(g, params, target=target, precision=precision)
    assert non_const_ops(model).count("conv") == 1
    assert ops_outside_opset(model, target) == []
    ref = next(iter(evaluate(g, feeds, params).values()))
    assert_matches(run(model, feeds), ref, precision)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_conv_attributes_reach_the_mil_op(target: str, precision: str) -> None:
    g = Graph("conv")
    g.set_outputs([g.conv(g.input("x", [1, 4, 9, 8]), g.param("w", [6, 2, 3, 3]), stride=[2, 1], padding=[1, 2],
                          dilation=[2, 1], groups=2, name="y")])
    rng = np.random.default_rng(1)
    w = rng.normal(size=(6, 2, 3, 3)).astype(np.float32)
    model = convert_and_cleanup(g, {"w": w}, target=target, precision=precision)
    conv = next(op for op in model._mil_program.functions["main"].operations if op.op_type == "conv")
    assert list(conv.strides.val) == [2, 1]
    assert list(conv.dilations.val) == [2, 1]
    assert list(conv.pad.val) == [1, 1, 2, 2]
    assert conv.pad_type.val == "custom" and int(conv.groups.val) == 2
    x = rng.normal(size=(1, 4, 9, 8)).astype(np.float32)
    ref = next(iter(evaluate(g, {"x": x}, {"w": w}).values()))
    assert ref.shape == (1, 6, 4, 10)
    assert_matches(run(model, {"x": x}), ref, precision)


@pytest.mark.parametrize("spatial", [1, 2, 3])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_runtime_weight_dilation_is_spelled_with_zero_taps(spatial: int, precision: str) -> None:
    """Core ML's conv rejects dilations with a non-const weight: the rule dilates the weight."""
    dilation = [2, 1, 3][:spatial]
    x_shape, w_shape = [1, 2, *([7] * spatial)], [4, 1, *([3, 2, 2][:spatial])]
    g = Graph("conv")
    g.set_outputs([g.conv(g.input("x", x_shape), g.input("w", w_shape), padding=[1] * spatial,
                          dilation=dilation, groups=2, name="y")])
    model = convert_and_cleanup(g, {}, target="iOS18", precision=precision)
    conv = next(op for op in model._mil_program.functions["main"].operations if op.op_type == "conv")
    assert list(conv.dilations.val) == [1] * spatial
    rng = np.random.default_rng(spatial)
    feeds = {"x": rng.normal(size=x_shape).astype(np.float32), "w": rng.normal(size=w_shape).astype(np.float32)}
    assert_matches(run(model, feeds), next(iter(evaluate(g, feeds).values())), precision)


# -------------------------------------------------------------------------- Pool

POOL_OPS = {
    ReduceOp.MAX: ["max_pool"],
    ReduceOp.MEAN: ["avg_pool"],
    ReduceOp.SUM: ["avg_pool", "mul"],
    ReduceOp.MIN: ["mul", "max_pool", "mul"],
}


def pool_graph(kind: ReduceOp, shape: list[int], kernel: list[int], stride: list[int], padding: list[int]) -> Graph:
    g = Graph("pool")
    g.set_outputs([g.pool(g.input("x", shape), kind, kernel, stride, padding, name="y")])
    return g


@pytest.mark.parametrize("kind", list(ReduceOp), ids=lambda k: k.value)
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_pool_kinds_on_every_target(kind: ReduceOp, target: str, precision: str) -> None:
    shape, kernel, stride, padding = [2, 3, 7, 6], [3, 2], [2, 2], [1, 1]
    g = pool_graph(kind, shape, kernel, stride, padding)
    model = convert_and_cleanup(g, {}, target=target, precision=precision)
    ops = non_const_ops(model)
    assert ops_outside_opset(model, target) == []
    if kind is ReduceOp.PROD:
        assert ops.count("slice_by_index") == 6 and "pad" in ops and "max_pool" not in ops
    else:
        assert [t for t in ops if t in ("max_pool", "avg_pool", "mul")] == POOL_OPS[kind]
    rng = np.random.default_rng(3)
    # Negative values everywhere: a padded 0 would win a max, and a padded 0 would zero a product.
    x = -rng.uniform(0.5, 1.5, shape).astype(np.float32)
    ref = next(iter(evaluate(g, {"x": x}).values()))
    assert_matches(run(model, {"x": x}), ref, precision)


def test_mean_pool_counts_padding_in_the_divisor() -> None:
    g = pool_graph(ReduceOp.MEAN, [1, 1, 2, 2], [2, 2], [1, 1], [1, 1])
    model = convert_and_cleanup(g, {}, target="iOS17", precision="fp32")
    avg = next(op for op in model._mil_program.functions["main"].operations if op.op_type == "avg_pool")
    assert bool(avg.exclude_padding_from_average.val) is False
    out = run(model, {"x": np.ones((1, 1, 2, 2), np.float32)})
    np.testing.assert_allclose(out[0, 0], [[0.25, 0.5, 0.25], [0.5, 1.0, 0.5], [0.25, 0.5, 0.25]])


@given(
    kind=st.sampled_from(list(ReduceOp)),
    spatial=st.integers(1, 3),
    data=st.data(),
    target=st.sampled_from(TARGETS),
    precision=st.sampled_from(PRECISIONS),
    seed=st.integers(0, 2**16),
)
def test_pool_matches_reference(kind: ReduceOp, spatial: int, data: st.DataObject, target: str, precision: str,
                                seed: int) -> None:
    kernel = [data.draw(st.integers(1, 3)) for _ in range(spatial)]
    stride = [data.draw(st.integers(1, 3)) for _ in range(spatial)]
    padding = [data.draw(st.integers(0, (k - 1) // 2 + 1)) for k in kernel]
    padding = [min(p, k // 2) for p, k in zip(padding, kernel, strict=True)]  # Core ML: pad <= kernel/2
    size = [data.draw(st.integers(k, 6)) for k in kernel]
    shape = [data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3)), *size]
    g = pool_graph(kind, shape, kernel, stride, padding)
    model = convert_and_cleanup(g, {}, target=target, precision=precision)
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.5, 1.5, shape).astype(np.float32)
    ref = next(iter(evaluate(g, {"x": x}).values()))
    assert_matches(run(model, {"x": x}), ref, precision)


def test_pool_rule_is_registered_for_every_kind() -> None:
    from rlx_mil.lowering.registry import registered_rules

    info = registered_rules()[Pool]
    assert info.family == "conv"
    for word in ("max_pool", "avg_pool", "exclude_padding_from_average=False", "Prod"):
        assert word in info.notes
