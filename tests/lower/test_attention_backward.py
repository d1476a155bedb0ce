"""AttentionBackward lowering (spec 9.6): dQ, dK and dV for every layout, mask kind and GQA,
through the converted model and the MIL executor, against central finite differences of the
loop oracle's forward (float64) and against the NumPy reference."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import oracles
import pytest
import strategies
from hypothesis import given
from hypothesis import strategies as st

from rlx_mil import milexec
from rlx_mil.errors import ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import AttentionBwdWrt, MaskKind, MaskType
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.attention import attention_backward

from .conftest import emitted_ops
from .test_attention import (
    LAYOUTS,
    Case,
    bias_shapes,
    convert_graph,
    default_mask_shape,
    geometry,
    make_values,
)

WRT = {"dq": AttentionBwdWrt.QUERY, "dk": AttentionBwdWrt.KEY, "dv": AttentionBwdWrt.VALUE}
TOLERANCE = {"fp32": (1e-4, 1e-3), "fp16": (3e-2, 3e-2)}


def build_backward(case: Case) -> Graph:
    """One graph computing dq, dk and dv (three nodes sharing their inputs)."""
    g = Graph("attention_backward")
    geo = case.geo
    q, k, v = g.input("q", geo.q), g.input("k", geo.k), g.input("v", geo.v)
    dy = g.input("dy", geo.q)
    inputs = [q, k, v, dy]
    if case.kind.has_mask_input:
        assert case.mask_shape is not None
        inputs.append(g.input("mask", case.mask_shape, case.mask_dtype))
    outs = []
    for name, wrt in WRT.items():
        shape = {"dq": geo.q, "dk": geo.k, "dv": geo.v}[name]
        op = ops.AttentionBackward(geo.num_heads, geo.head_dim, case.kind, wrt)
        outs.append(g.add_node(op, inputs, Shape.of(shape), name=name))
    g.set_outputs(outs)
    return g


def backward_values(case: Case, seed: int) -> dict[str, np.ndarray]:
    values = make_values(case, seed)
    values["dy"] = np.random.default_rng(seed + 1).standard_normal(case.geo.q).astype(np.float32)
    return values


def finite_difference_grads(case: Case, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    geo = case.geo
    kind = {MaskType.NONE: "none", MaskType.CAUSAL: "causal", MaskType.SLIDING_WINDOW: "sliding",
            MaskType.CUSTOM: "custom", MaskType.BIAS: "bias"}[case.kind.type]

    def forward(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        return oracles.attention_oracle(
            q, k, v, values.get("mask"), num_heads=geo.num_heads, head_dim=geo.head_dim, kind=kind,
            window=case.kind.window,
        )

    return {
        name: oracles.attention_grad_oracle(forward, values["q"], values["k"], values["v"], values["dy"], name[1])
        for name in WRT
    }


def reference_grads(case: Case, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    geo = case.geo
    return {
        name: attention_backward(
            values["q"], values["k"], values["v"], values["dy"], values.get("mask"),
            num_heads=geo.num_heads, head_dim=geo.head_dim, mask_kind=case.kind, wrt=wrt,
        )
        for name, wrt in WRT.items()
    }


def run_backward(case: Case, *, target: str, precision: str, seed: int = 0, attention: str = "auto") -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], Any]:
    values = backward_values(case, seed)
    model = convert_graph(build_backward(case), target=target, precision=precision, attention=attention)
    feeds = {n: np.asarray(a, np.float32) for n, a in values.items()}
    return milexec.run(model, feeds), values, model


def assert_grads(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], precision: str) -> None:
    atol, rtol = TOLERANCE[precision]
    for name in WRT:
        assert got[name].shape == want[name].shape, name
        assert np.isfinite(got[name]).all(), f"{name} has NaN/Inf"
        # fp16 gradients are compared relative to their overall size.
        scale = 1.0 if precision == "fp32" else max(1.0, float(np.abs(want[name]).max()))
        np.testing.assert_allclose(got[name], want[name], atol=atol * scale, rtol=rtol, err_msg=name)


KINDS = [MaskKind.NONE, MaskKind.CAUSAL, MaskKind.sliding_window(0), MaskKind.sliding_window(2),
         MaskKind.CUSTOM, MaskKind.BIAS]


@st.composite
def backward_cases(draw: st.DrawFn) -> Case:
    geo = draw(strategies.attention_cases())
    kind = draw(st.sampled_from(KINDS))
    mask_shape = default_mask_shape(geo, kind)
    mask_dtype = DType.F32
    dead: tuple[int, ...] = ()
    if kind.type is MaskType.CUSTOM:
        mask_dtype = draw(st.sampled_from([DType.F32, DType.BOOL]))
        dead = tuple(b for b in range(geo.batch) if draw(st.booleans()))
    elif kind.type is MaskType.BIAS:
        mask_shape = draw(st.sampled_from(bias_shapes(geo)))
    return Case(geo, kind, mask_shape, mask_dtype, dead_batches=dead)


@given(case=backward_cases(), target=st.sampled_from(["iOS15", "iOS16", "iOS17", "iOS18"]),
       seed=st.integers(0, 2**16))
def test_backward_matches_finite_differences(case: Case, target: str, seed: int) -> None:
    got, values, model = run_backward(case, target=target, precision="fp32", seed=seed)
    assert_grads(got, finite_difference_grads(case, values), "fp32")
    assert "scaled_dot_product_attention" not in emitted_ops(model)


@given(case=backward_cases(), seed=st.integers(0, 2**16))
def test_backward_fp16_matches_reference(case: Case, seed: int) -> None:
    got, values, _ = run_backward(case, target="iOS18", precision="fp16", seed=seed)
    assert_grads(got, reference_grads(case, values), "fp16")


@pytest.mark.parametrize("kind", KINDS, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_grid_gqa(layout: str, kind: MaskKind) -> None:
    """Every layout x mask kind with GQA (H=4, H_kv=2), chunked prefill (Sq=2 < Sk=5)."""
    geo = geometry(layout, 1 if layout == "sx" else 2, 4, 2, 2, 5, 4)
    case = Case(geo, kind, default_mask_shape(geo, kind))
    got, values, model = run_backward(case, target="iOS17", precision="fp32")
    want = reference_grads(case, values)
    assert_grads(got, want, "fp32")
    assert_grads(got, finite_difference_grads(case, values), "fp32")
    assert "tile" not in emitted_ops(model)


def test_mqa_gradients_sum_over_all_query_heads() -> None:
    geo = geometry("bsx", 1, 3, 1, 3, 3, 2)
    case = Case(geo, MaskKind.CAUSAL)
    got, values, _ = run_backward(case, target="iOS18", precision="fp32")
    assert_grads(got, finite_difference_grads(case, values), "fp32")


def test_fully_masked_rows_give_no_query_gradient() -> None:
    """A fully masked row is constant in q and k (uniform weights); only dV sees it."""
    geo = geometry("bhsd", 2, 2, 2, 3, 4, 2)
    case = Case(geo, MaskKind.CUSTOM, (2, 4), dead_batches=(1,))
    got, values, _ = run_backward(case, target="iOS18", precision="fp16")
    assert np.abs(got["dq"][1]).max() == 0.0 and np.abs(got["dk"][1]).max() == 0.0
    assert_grads(got, reference_grads(case, values), "fp16")


def test_backward_ignores_the_fused_option() -> None:
    """Core ML has no fused attention gradient: attention='fused' concerns the forward op."""
    case = Case(geometry("bhsd", 1, 2, 2, 3, 3, 2), MaskKind.CAUSAL)
    got, values, model = run_backward(case, target="iOS18", precision="fp32", attention="fused")
    assert_grads(got, reference_grads(case, values), "fp32")
    assert "scaled_dot_product_attention" not in emitted_ops(model)


def test_dy_must_have_q_shape() -> None:
    g = Graph("attention_backward")
    q, k = g.input("q", (1, 2, 3, 2)), g.input("k", (1, 2, 3, 2))
    dy = g.input("dy", (1, 2, 4, 2))
    with pytest.raises(ShapeError) as err:
        node = g.add_node(
            ops.AttentionBackward(2, 2, MaskKind.NONE, AttentionBwdWrt.QUERY), [q, k, k, dy],
            Shape.of((1, 2, 3, 2)), name="dq",
        )
        g.set_outputs([node])
        convert_graph(g, target="iOS18")
    assert err.value.operand == "dy"
