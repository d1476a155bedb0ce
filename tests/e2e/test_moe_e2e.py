"""End-to-end: GroupedMatMul, DequantMoEWeights, DequantGroupedMatMul (spec part 2, 2.4-2.6) and
DotGeneral (2.7), each against an independent NumPy formulation written here and through the
converted program (fp32 and fp16)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from e2e.factory import Feeds, e2e_settings, integers, normal, rng_for, seeds, weight_kinds
from e2e.test_quant_e2e import gguf_weight
from rlx_mil import convert
from rlx_mil.errors import AttributeValueError, EvaluationError, UnsupportedOpError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import QuantKind, QuantScheme
from rlx_mil.reference import evaluate
from rlx_mil.reference.quant import GGUF_FORMATS, gguf_dequantize

MOE_KINDS = (QuantKind.GGUF_Q8_0, QuantKind.GGUF_Q4_0, QuantKind.GGUF_Q4K)


def _row_loop(x: np.ndarray, w: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """One row at a time: row i times its expert's matrix."""
    return np.stack([x[i].astype(np.float64) @ w[int(ids[i])].astype(np.float64) for i in range(x.shape[0])])


@e2e_settings(4)
@given(m=st.integers(1, 6), experts=st.integers(1, 4), k=st.integers(1, 6), n=st.integers(1, 5),
       w_kind=weight_kinds, seed=seeds)
def test_grouped_matmul(m: int, experts: int, k: int, n: int, w_kind: str, seed: int) -> None:
    """Both formulations: M <= E gathers each row's expert, M > E multiplies by every expert."""
    rng = rng_for(seed)
    f = Feeds("grouped_matmul")
    xv, wv = normal(rng, (m, k)), normal(rng, (experts, k, n), 0.5)
    idv = integers(rng, (m,), 0, experts - 1)
    x, w, ids = f.input("x", xv), f.leaf(w_kind, "w", wv), f.input("ids", idv)
    y = f.graph.grouped_matmul(x, w, ids, name="y")
    f.graph.set_outputs([y])
    want = evaluate(f.graph, f.inputs, f.params)["y"]
    np.testing.assert_allclose(want, _row_loop(xv, wv, idv), rtol=1e-5, atol=1e-5)
    f.verify([y])


def _experts_bytes(rng: np.random.Generator, kind: QuantKind, experts: int, k: int, n: int) -> np.ndarray:
    return np.concatenate([gguf_weight(rng, kind, n, k) for _ in range(experts)])


@e2e_settings(2)
@given(kind=st.sampled_from(MOE_KINDS), experts=st.integers(1, 3), m=st.integers(1, 5), n=st.integers(1, 3),
       seed=seeds)
def test_dequant_moe_weights_and_grouped_matmul(kind: QuantKind, experts: int, m: int, n: int, seed: int) -> None:
    """Decoded experts are each slab's `[N, K]` matrix transposed (the CPU's layout)."""
    rng = rng_for(seed)
    k = GGUF_FORMATS[kind][0]
    f = Feeds("moe_weights")
    packed_v = _experts_bytes(rng, kind, experts, k, n)
    xv, idv = normal(rng, (m, k)), integers(rng, (m,), 0, experts - 1)
    x, ids = f.input("x", xv), f.input("ids", idv)
    packed = f.param("packed", packed_v, DType.U8)
    weights = f.graph.dequant_moe_weights(packed, QuantScheme(kind), experts, k, n, name="weights")
    fused = f.graph.dequant_grouped_matmul(x, f.param("packed2", packed_v, DType.U8), ids, QuantScheme(kind), n,
                                           name="fused")
    y = f.graph.grouped_matmul(x, weights, ids, name="y")
    f.graph.set_outputs([weights, y, fused])
    got = evaluate(f.graph, f.inputs, f.params)
    slab = len(packed_v) // experts
    slabs = np.stack([gguf_dequantize(kind, packed_v[e * slab:(e + 1) * slab], k).T for e in range(experts)])
    np.testing.assert_array_equal(got["weights"], slabs)
    np.testing.assert_allclose(got["y"], _row_loop(xv, slabs, idv), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got["fused"], got["y"])
    f.verify([weights, y, fused])


@st.composite
def dot_general_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], list[list[int]]]:
    """Shapes and axis lists: batch, contracting and free axes at random positions."""
    roles = {"batch": draw(st.integers(0, 2)), "contracting": draw(st.integers(0, 2)),
             "lhs": draw(st.integers(0, 2)), "rhs": draw(st.integers(0, 2))}
    sizes = {role: [draw(st.integers(1, 3)) for _ in range(count)] for role, count in roles.items()}
    lhs_axes = [("batch", i) for i in range(roles["batch"])] + [("contracting", i) for i in range(roles["contracting"])] \
        + [("lhs", i) for i in range(roles["lhs"])]
    rhs_axes = [("batch", i) for i in range(roles["batch"])] + [("contracting", i) for i in range(roles["contracting"])] \
        + [("rhs", i) for i in range(roles["rhs"])]
    if not lhs_axes or not rhs_axes:
        lhs_axes.append(("lhs", len(sizes["lhs"])))
        sizes["lhs"].append(2)
        rhs_axes.append(("rhs", len(sizes["rhs"])))
        sizes["rhs"].append(2)
    lhs_axes, rhs_axes = draw(st.permutations(lhs_axes)), draw(st.permutations(rhs_axes))

    def axes(side: list[tuple[str, int]], role: str) -> list[int]:
        return [side.index((role, i)) for i in range(roles[role])]

    lists = [axes(lhs_axes, "contracting"), axes(rhs_axes, "contracting"), axes(lhs_axes, "batch"), axes(rhs_axes, "batch")]
    return (tuple(sizes[r][i] for r, i in lhs_axes), tuple(sizes[r][i] for r, i in rhs_axes), lists)


def _dot_general_by_tensordot(a: np.ndarray, b: np.ndarray, lc: list[int], rc: list[int], lb: list[int],
                              rb: list[int]) -> np.ndarray:
    """Per batch index, `tensordot` over the contracting axes."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    a_t = np.moveaxis(a64, lb, list(range(len(lb))))
    b_t = np.moveaxis(b64, rb, list(range(len(rb))))
    shift = len(lb)
    lc_t = [sorted(set(range(a.ndim)) - set(lb)).index(i) + shift for i in lc]
    rc_t = [sorted(set(range(b.ndim)) - set(rb)).index(j) + shift for j in rc]
    batch = a_t.shape[:shift]
    out = [np.tensordot(a_t[idx], b_t[idx], axes=([i - shift for i in lc_t], [j - shift for j in rc_t]))
           for idx in np.ndindex(*batch)]
    return np.stack(out).reshape(*batch, *out[0].shape) if batch else out[0]


@e2e_settings(5)
@given(case=dot_general_cases(), rhs_kind=weight_kinds, seed=seeds)
def test_dot_general(case: tuple[tuple[int, ...], tuple[int, ...], list[list[int]]], rhs_kind: str, seed: int) -> None:
    a_dims, b_dims, (lc, rc, lb, rb) = case
    rng = rng_for(seed)
    f = Feeds("dot_general")
    av, bv = normal(rng, a_dims), normal(rng, b_dims)
    a, b = f.input("a", av), f.leaf(rhs_kind, "b", bv)
    y = f.graph.dot_general(a, b, lc, rc, lb, rb, name="y")
    f.graph.set_outputs([y])
    want = evaluate(f.graph, f.inputs, f.params)["y"]
    np.testing.assert_allclose(want, _dot_general_by_tensordot(av, bv, lc, rc, lb, rb), rtol=1e-5, atol=1e-5)
    f.verify([y])


def test_dot_general_integer_and_weight_forms() -> None:
    """I32 operands stay integer; a [N, K] weight contracted on its axis 1 becomes `linear`."""
    rng = rng_for(3)
    f = Feeds("dot_general_int")
    a = f.input("a", integers(rng, (2, 3, 4), -3, 3), DType.I32)
    b = f.input("b", integers(rng, (2, 4, 5), -3, 3), DType.I32)
    x = f.input("x", normal(rng, (3, 4)))
    w = f.param("w", normal(rng, (6, 4)))
    f.verify([f.graph.dot_general(a, b, [2], [1], [0], [0], name="ints"),
              f.graph.dot_general(x, w, [1], [1], name="weight")])
    model_ops = str(convert(f.graph, f.params, target="iOS18")._mil_program.functions["main"])
    assert "linear(" in model_ops


def test_expert_ids_out_of_range_are_refused() -> None:
    g = Graph("bad_ids")
    x, w, ids = g.input("x", [2, 3]), g.param("w", [2, 3, 4]), g.input("ids", [2])
    g.set_outputs([g.grouped_matmul(x, w, ids, name="y")])
    params = {"w": np.ones((2, 3, 4), np.float32)}
    with pytest.raises(EvaluationError, match="out of range"):
        evaluate(g, {"x": np.ones((2, 3), np.float32), "ids": np.array([0, 2], np.float32)}, params)
    g2 = Graph("bad_const_ids")
    x2, w2 = g2.input("x", [2, 3]), g2.param("w", [2, 3, 4])
    ids2 = g2.constant(np.array([1, 5], np.float32), "f32")
    g2.set_outputs([g2.grouped_matmul(x2, w2, ids2, name="y")])
    with pytest.raises(AttributeValueError, match=r"expert_idx must lie in \[0, 2\)"):
        convert(g2, params, target="iOS18")


def test_run_time_expert_bytes_are_refused() -> None:
    g = Graph("runtime_bytes")
    packed = g.input("packed", [2 * 34], "u8")
    g.set_outputs([g.dequant_moe_weights(packed, QuantScheme(QuantKind.GGUF_Q8_0), 2, 32, 1, name="w")])
    with pytest.raises(UnsupportedOpError, match=r"DequantMoEWeights.*Param or Constant"):
        convert(g, {}, target="iOS18")


@pytest.mark.parametrize("kind", [QuantKind.GGUF_Q8_0, QuantKind.GGUF_Q4_0])
def test_q8_0_and_q4_0_experts_stay_compressed_on_ios18(kind: QuantKind) -> None:
    """Codes and block scales in one constexpr (no float copy of the experts in the program)."""
    rng = rng_for(9)
    experts, k, n, m = 3, 64, 4, 5
    f = Feeds("compressed_experts")
    x, ids = f.input("x", normal(rng, (m, k))), f.input("ids", integers(rng, (m,), 0, experts - 1))
    packed = f.param("packed", _experts_bytes(rng, kind, experts, k, n), DType.U8)
    y = f.graph.dequant_grouped_matmul(x, packed, ids, QuantScheme(kind), n, name="y")
    f.verify([y])
    program = str(convert(f.graph, f.params, target="iOS18")._mil_program.functions["main"])
    assert "constexpr_blockwise_shift_scale" in program
    ios17 = str(convert(f.graph, f.params, target="iOS17")._mil_program.functions["main"])
    assert "constexpr_blockwise_shift_scale" not in ios17
