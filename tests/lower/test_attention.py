"""Attention lowering (spec section 9): every layout, GQA/MQA, every mask kind, score scale,
softcap, fp32/fp16, iOS15..iOS18, fused/decomposed. Converted models run through the MIL
executor and are compared with the loop oracle in tests/oracles.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import oracles
import pytest
import strategies
from coremltools.converters.mil.mil import types
from hypothesis import given
from hypothesis import strategies as st

from rlx_mil import milexec
from rlx_mil.errors import AttributeValueError, DTypeError, GraphError, ShapeError, UnsupportedOpError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import MaskKind, MaskType
from rlx_mil.ir.shape import Shape

from .conftest import convert_and_cleanup, emitted_ops

TARGETS = ("iOS15", "iOS16", "iOS17", "iOS18")
PRECISIONS = ("fp32", "fp16")
LAYOUTS = ("bhsd", "bshd", "bsx", "sx")
#: (atol, rtol) against the float64 oracle.
TOLERANCE = {"fp32": (2e-5, 2e-4), "fp16": (2e-2, 2e-2)}


# ------------------------------------------------------------------------------ cases
@dataclass(frozen=True)
class Case:
    """One attention node: geometry, mask kind and the mask tensor's shape/dtype."""

    geo: strategies.AttentionCase
    kind: MaskKind
    mask_shape: tuple[int, ...] | None = None
    mask_dtype: DType = DType.F32
    score_scale: float | None = None
    softcap: float | None = None
    #: Custom: batches whose every key is masked (fully masked query rows).
    dead_batches: tuple[int, ...] = ()
    mask_as_param: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def oracle_kind(self) -> str:
        return {
            MaskType.NONE: "none", MaskType.CAUSAL: "causal", MaskType.SLIDING_WINDOW: "sliding",
            MaskType.CUSTOM: "custom", MaskType.BIAS: "bias",
        }[self.kind.type]


def geometry(layout: str, batch: int, heads: int, kv_heads: int, q_len: int, kv_len: int, head_dim: int) -> strategies.AttentionCase:
    return strategies.AttentionCase(layout, batch, heads, kv_heads, q_len, kv_len, head_dim)


def default_mask_shape(case_geo: strategies.AttentionCase, kind: MaskKind) -> tuple[int, ...] | None:
    g = case_geo
    if kind.type is MaskType.CUSTOM:
        return (g.batch, g.kv_len)
    if kind.type is MaskType.BIAS:
        return (g.batch, g.num_heads, g.q_len, g.kv_len)
    return None


def build_graph(case: Case) -> Graph:
    g = Graph("attention")
    geo = case.geo
    q = g.input("q", geo.q)
    k = g.input("k", geo.k)
    v = g.input("v", geo.v)
    inputs = [q, k, v]
    if case.kind.has_mask_input:
        assert case.mask_shape is not None
        make = g.param if case.mask_as_param else g.input
        inputs.append(make("mask", case.mask_shape, case.mask_dtype))
    op = ops.Attention(geo.num_heads, geo.head_dim, case.kind, case.score_scale, case.softcap)
    out = g.add_node(op, inputs, Shape.of(geo.q), name="attn")
    g.set_outputs([out])
    return g


def make_values(case: Case, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    geo = case.geo
    values = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in (("q", geo.q), ("k", geo.k), ("v", geo.v))}
    if case.kind.type is MaskType.CUSTOM:
        assert case.mask_shape is not None
        # Values exact in fp16, on both sides of the 0.5 threshold.
        keep = rng.choice(np.array([0.0, 0.25, 0.5, 0.75, 1.0], np.float32), size=(geo.batch, geo.kv_len))
        keep[:, rng.integers(geo.kv_len)] = 1.0  # one kept key per batch unless made dead below
        for b in case.dead_batches:
            keep[b] = rng.choice(np.array([0.0, 0.25], np.float32), size=geo.kv_len)
        mask = keep.reshape(case.mask_shape)
        values["mask"] = mask >= 0.5 if case.mask_dtype is DType.BOOL else mask
    elif case.kind.type is MaskType.BIAS:
        assert case.mask_shape is not None
        values["mask"] = rng.standard_normal(case.mask_shape).astype(np.float32)
    return values


def oracle(case: Case, values: Mapping[str, np.ndarray]) -> np.ndarray:
    geo = case.geo
    return oracles.attention_oracle(
        values["q"], values["k"], values["v"], values.get("mask"), num_heads=geo.num_heads,
        head_dim=geo.head_dim, kind=case.oracle_kind, window=case.kind.window,
        score_scale=case.score_scale, softcap=case.softcap,
    )


def split_feeds(case: Case, values: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(run-time inputs as the model takes them, params)."""
    feeds = {n: np.asarray(a, np.float32) for n, a in values.items() if n != "mask" or not case.mask_as_param}
    params = {"mask": values["mask"]} if case.mask_as_param and "mask" in values else {}
    return feeds, params


def convert_graph(graph: Graph, params: Mapping[str, np.ndarray] | None = None, **kwargs: Any) -> Any:
    return convert_and_cleanup(graph, params, **kwargs)


def convert_case(case: Case, params: Mapping[str, np.ndarray], *, target: str, precision: str, attention: str) -> Any:
    return convert_graph(build_graph(case), params, target=target, precision=precision, attention=attention)


def run_case(
    case: Case, *, target: str, precision: str, attention: str = "auto", seed: int = 0, cross_check: bool = False
) -> tuple[np.ndarray, np.ndarray, Any]:
    """(executor output, oracle output, converted model). `cross_check` also compares every op
    the executor runs with coremltools' own value_inference."""
    values = make_values(case, seed)
    feeds, params = split_feeds(case, values)
    model = convert_case(case, params, target=target, precision=precision, attention=attention)
    got = milexec.run(model, feeds, cross_check=cross_check)["attn"]
    return got, oracle(case, values), model


def assert_matches(got: np.ndarray, want: np.ndarray, precision: str) -> None:
    assert got.shape == want.shape
    assert np.isfinite(got).all(), "attention produced NaN/Inf"
    atol, rtol = TOLERANCE[precision]
    np.testing.assert_allclose(got, want, atol=atol, rtol=rtol)


def sdpa_expected(case: Case, target: str, attention: str) -> bool:
    capped = case.softcap is not None and case.softcap > 0
    return attention != "decomposed" and target == "iOS18" and not capped


# ------------------------------------------------------------------------------ strategies
KINDS = st.sampled_from(
    [MaskKind.NONE, MaskKind.CAUSAL, MaskKind.sliding_window(0), MaskKind.sliding_window(1),
     MaskKind.sliding_window(3), MaskKind.CUSTOM, MaskKind.BIAS]
)


def bias_shapes(geo: strategies.AttentionCase) -> list[tuple[int, ...]]:
    b, h, sq, sk = geo.batch, geo.num_heads, geo.q_len, geo.kv_len
    shapes = [(b, h, sq, sk), (1, h, sq, sk), (b, 1, sq, sk), (sq, sk), (b, 1, 1, sk), (h, 1, sk),
              (b, h, 1, sk), (sk,), (b, h, sq, 1), (1, 1, 1, 1)]
    return list(dict.fromkeys(shapes))


@st.composite
def cases(draw: st.DrawFn, kinds: st.SearchStrategy[MaskKind] = KINDS) -> Case:
    geo = draw(strategies.attention_cases())
    kind = draw(kinds)
    mask_shape = default_mask_shape(geo, kind)
    mask_dtype = DType.F32
    dead: tuple[int, ...] = ()
    if kind.type is MaskType.CUSTOM:
        mask_shape = draw(st.sampled_from([(geo.batch, geo.kv_len), (geo.batch, 1, 1, geo.kv_len), (geo.batch * geo.kv_len,)]))
        mask_dtype = draw(st.sampled_from([DType.F32, DType.BOOL]))
        dead = tuple(b for b in range(geo.batch) if draw(st.booleans()))
    elif kind.type is MaskType.BIAS:
        mask_shape = draw(st.sampled_from(bias_shapes(geo)))
    scale = draw(st.sampled_from([None, 0.3, 1.0, 0.0625]))
    softcap = draw(st.sampled_from([None, None, 2.0, 0.0]))
    return Case(geo, kind, mask_shape, mask_dtype, scale, softcap, dead)


# ------------------------------------------------------------------------------ property tests
@given(
    case=cases(),
    target=st.sampled_from(TARGETS),
    precision=st.sampled_from(PRECISIONS),
    attention=st.sampled_from(["auto", "decomposed"]),
    seed=st.integers(0, 2**16),
)
def test_forward_matches_oracle(case: Case, target: str, precision: str, attention: str, seed: int) -> None:
    got, want, model = run_case(case, target=target, precision=precision, attention=attention, seed=seed)
    assert_matches(got, want, precision)
    assert ("scaled_dot_product_attention" in emitted_ops(model)) == sdpa_expected(case, target, attention)


@given(case=cases(kinds=st.sampled_from([MaskKind.CAUSAL, MaskKind.sliding_window(1), MaskKind.CUSTOM, MaskKind.BIAS])),
       precision=st.sampled_from(PRECISIONS), seed=st.integers(0, 2**16))
def test_fused_matches_oracle(case: Case, precision: str, seed: int) -> None:
    case = Case(case.geo, case.kind, case.mask_shape, case.mask_dtype, case.score_scale, None, case.dead_batches)
    got, want, model = run_case(case, target="iOS18", precision=precision, attention="fused", seed=seed)
    assert_matches(got, want, precision)
    assert emitted_ops(model).count("scaled_dot_product_attention") == 1


@given(case=cases(), precision=st.sampled_from(PRECISIONS), seed=st.integers(0, 2**16))
def test_fused_and_decomposed_agree(case: Case, precision: str, seed: int) -> None:
    """Both iOS18 forms of one node give the same numbers (up to rounding)."""
    case = Case(case.geo, case.kind, case.mask_shape, case.mask_dtype, case.score_scale, None, case.dead_batches)
    fused, _, _ = run_case(case, target="iOS18", precision=precision, attention="fused", seed=seed)
    plain, _, _ = run_case(case, target="iOS18", precision=precision, attention="decomposed", seed=seed)
    atol, rtol = TOLERANCE[precision]
    np.testing.assert_allclose(fused, plain, atol=atol, rtol=rtol)


# ------------------------------------------------------------------------------ the full grid
def grid_case(layout: str, kind: MaskKind, q_len: int, kv_len: int, heads: int = 4, kv_heads: int = 2) -> Case:
    geo = geometry(layout, 1 if layout == "sx" else 2, heads, kv_heads, q_len, kv_len, 4)
    return Case(geo, kind, default_mask_shape(geo, kind), dead_batches=(1,) if kind.type is MaskType.CUSTOM and layout != "sx" else ())


GRID_KINDS = [MaskKind.NONE, MaskKind.CAUSAL, MaskKind.sliding_window(1), MaskKind.CUSTOM, MaskKind.BIAS]
SEQ = {"prefill": (5, 5), "decode": (1, 6), "chunked": (3, 7)}


@pytest.mark.parametrize("seq", list(SEQ))
@pytest.mark.parametrize("kind", GRID_KINDS, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_grid_fused_fp16(layout: str, kind: MaskKind, seq: str) -> None:
    """Every layout x mask kind x (prefill, decode, chunked prefill) through the fused op in
    fp16, with GQA (H=4, H_kv=2) and, for Custom, a fully masked batch."""
    case = grid_case(layout, kind, *SEQ[seq])
    got, want, model = run_case(case, target="iOS18", precision="fp16", attention="fused", cross_check=True)
    assert_matches(got, want, "fp16")
    ops_ = emitted_ops(model)
    assert ops_.count("scaled_dot_product_attention") == 1
    assert "tile" not in ops_ or kind.type is MaskType.BIAS


@pytest.mark.parametrize("kind", GRID_KINDS, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_grid_decomposed_ios15(layout: str, kind: MaskKind) -> None:
    case = grid_case(layout, kind, 2, 5, heads=3, kv_heads=1)
    got, want, model = run_case(case, target="iOS15", precision="fp32", cross_check=True)
    assert_matches(got, want, "fp32")
    ops_ = emitted_ops(model)
    assert "scaled_dot_product_attention" not in ops_ and "fill_like" not in ops_
    assert "tile" not in ops_


# ------------------------------------------------------------------------------ structure
def llama_layer(layout: str, seq: int = 6, heads: int = 8, kv_heads: int = 2, head_dim: int = 16) -> Case:
    return Case(geometry(layout, 1, heads, kv_heads, seq, seq, head_dim), MaskKind.CAUSAL)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ios18_causal_gqa_is_one_sdpa_without_kv_copies(layout: str) -> None:
    model = convert_case(llama_layer(layout), {}, target="iOS18", precision="fp16", attention="auto")
    ops_ = emitted_ops(model)
    assert ops_.count("scaled_dot_product_attention") == 1
    for copying in ("tile", "concat", "gather", "matmul", "softmax", "expand_dims"):
        assert copying not in ops_, f"{copying} in {ops_}"
    sdpa = next(op for op in model._mil_program.functions["main"].operations if op.op_type == "scaled_dot_product_attention")
    assert sdpa.key.shape == (1, 2, 6, 16) and sdpa.value.shape == (1, 2, 6, 16)
    assert sdpa.query.shape == (1, 2, 4 * 6, 16)
    assert sdpa.attn_mask is not None and types.is_bool(sdpa.attn_mask.dtype)


def test_mqa_fused_keeps_single_kv_head() -> None:
    case = Case(geometry("bhsd", 2, 4, 1, 3, 5, 4), MaskKind.CAUSAL)
    got, want, model = run_case(case, target="iOS18", precision="fp32")
    assert_matches(got, want, "fp32")
    sdpa = next(op for op in model._mil_program.functions["main"].operations if op.op_type == "scaled_dot_product_attention")
    assert sdpa.key.shape == (2, 1, 5, 4)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", [MaskKind.CAUSAL, MaskKind.sliding_window(4)], ids=str)
def test_window_masks_are_not_constants(kind: MaskKind, target: str) -> None:
    """No const holding Sq*Sk (or more) values survives Core ML's passes."""
    seq = 40
    case = Case(geometry("bsx", 1, 2, 2, seq, seq, 4), kind)
    model = convert_case(case, {}, target=target, precision="fp16", attention="auto")
    for op in model._mil_program.functions["main"].operations:
        if op.op_type == "const":
            val = op.outputs[0].val
            assert np.size(val) < seq * seq, f"{op.name} holds {np.size(val)} values"


def test_decode_causal_needs_no_mask() -> None:
    """Sq = 1, causal: the single query sees every key, so no mask is built."""
    case = Case(geometry("bshd", 1, 4, 2, 1, 9, 4), MaskKind.CAUSAL)
    got, want, model = run_case(case, target="iOS18", precision="fp16")
    assert_matches(got, want, "fp16")
    sdpa = next(op for op in model._mil_program.functions["main"].operations if op.op_type == "scaled_dot_product_attention")
    assert sdpa.attn_mask is None
    assert "band_part" not in emitted_ops(model)


def test_custom_scale_is_folded_into_q() -> None:
    case = Case(geometry("bhsd", 1, 2, 2, 4, 4, 8), MaskKind.NONE, score_scale=0.3)
    for precision in PRECISIONS:
        got, want, model = run_case(case, target="iOS18", precision=precision, attention="fused")
        assert_matches(got, want, precision)
        ops_ = emitted_ops(model)
        assert ops_.count("scaled_dot_product_attention") == 1 and ops_.count("mul") == 1


def test_default_scale_adds_no_op() -> None:
    case = Case(geometry("bhsd", 1, 2, 2, 4, 4, 8), MaskKind.NONE, score_scale=float(np.float32(8**-0.5)))
    model = convert_case(case, {}, target="iOS18", precision="fp32", attention="fused")
    assert "mul" not in emitted_ops(model)


@pytest.mark.parametrize("target", TARGETS)
def test_softcap_is_decomposed_on_every_target(target: str) -> None:
    case = Case(geometry("bsx", 1, 2, 1, 4, 4, 4), MaskKind.CAUSAL, softcap=1.5)
    got, want, model = run_case(case, target=target, precision="fp32")
    assert_matches(got, want, "fp32")
    ops_ = emitted_ops(model)
    assert "scaled_dot_product_attention" not in ops_ and "tanh" in ops_
    # Cap before mask: the masked scores are the fill, not -cap.
    assert ops_.index("tanh") < ops_.index("select")


def test_decomposed_option_on_ios18() -> None:
    case = Case(geometry("bhsd", 1, 2, 2, 4, 4, 4), MaskKind.CAUSAL)
    got, want, model = run_case(case, target="iOS18", precision="fp16", attention="decomposed")
    assert_matches(got, want, "fp16")
    assert "scaled_dot_product_attention" not in emitted_ops(model)


# ------------------------------------------------------------------------------ fp16 safety
@pytest.mark.parametrize("attention", ["fused", "decomposed"])
@pytest.mark.parametrize("dtype", [DType.F32, DType.BOOL])
def test_fully_masked_custom_rows_average_uniformly_in_fp16(attention: str, dtype: DType) -> None:
    geo = geometry("bshd", 3, 4, 2, 3, 5, 4)
    case = Case(geo, MaskKind.CUSTOM, (3, 5), dtype, dead_batches=(0, 2))
    got, want, _ = run_case(case, target="iOS18", precision="fp16", attention=attention)
    assert_matches(got, want, "fp16")
    values = make_values(case, 0)
    uniform = values["v"].mean(axis=1)  # [B, H_kv, D]: mean over keys
    for b in (0, 2):
        for h in range(4):
            np.testing.assert_allclose(got[b, :, h, :], np.broadcast_to(uniform[b, h // 2], (3, 4)), atol=2e-2)


@pytest.mark.parametrize("mask_as_param", [False, True])
def test_custom_mask_param(mask_as_param: bool) -> None:
    """A mask known while converting is a small const; a fully masked batch still averages."""
    geo = geometry("bhsd", 2, 2, 2, 3, 4, 4)
    case = Case(geo, MaskKind.CUSTOM, (2, 4), dead_batches=(1,), mask_as_param=mask_as_param)
    got, want, _ = run_case(case, target="iOS18", precision="fp16", attention="fused")
    assert_matches(got, want, "fp16")


@pytest.mark.parametrize("target", ["iOS17", "iOS18"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_sliding_window_rows_with_no_key(target: str, precision: str) -> None:
    """Sq > Sk + w: the last rows see no key at all and must average every key."""
    case = Case(geometry("bhsd", 1, 2, 1, 6, 2, 4), MaskKind.sliding_window(1))
    got, want, _ = run_case(case, target=target, precision=precision)
    assert_matches(got, want, precision)
    values = make_values(case, 0)
    np.testing.assert_allclose(got[0, :, 3:, :], np.broadcast_to(values["v"][0, 0].mean(axis=0), (2, 3, 4)), atol=2e-2)


@pytest.mark.parametrize("attention", ["fused", "decomposed"])
def test_huge_negative_bias_stays_finite_in_fp16(attention: str) -> None:
    """-1e9 in a bias is -inf in fp16; it is floored at the fill so rows stay finite."""
    geo = geometry("bhsd", 1, 2, 2, 3, 4, 4)
    case = Case(geo, MaskKind.BIAS, (1, 2, 3, 4))
    values = make_values(case, 3)
    bias = np.zeros((1, 2, 3, 4), np.float32)
    bias[0, 0, 0, :] = -1e9  # a whole row
    bias[0, 1, :, 2] = -1e9  # one key for every row of head 1
    values["mask"] = bias
    model = convert_case(case, {}, target="iOS18", precision="fp16", attention=attention)
    got = milexec.run(model, values)["attn"]
    assert np.isfinite(got).all()
    # The fully biased row is ill-conditioned (s - 1e9 keeps s in float64, not in fp32 or
    # fp16); every other row must match.
    want = oracle(case, values)
    np.testing.assert_allclose(got[0, 0, 1:], want[0, 0, 1:], atol=2e-2, rtol=2e-2)
    np.testing.assert_allclose(got[0, 1], want[0, 1], atol=2e-2, rtol=2e-2)
    assert np.all(np.abs(got[0, 0, 0]) <= np.abs(values["v"][0, 0]).max(axis=0) + 1e-3)


@pytest.mark.parametrize("attention", ["auto", "decomposed"])
def test_fp16_large_scores_stay_finite(attention: str) -> None:
    case = Case(geometry("bsx", 1, 2, 2, 6, 6, 16), MaskKind.CAUSAL)
    values = {n: a * np.float32(12.0) for n, a in make_values(case, 5).items()}
    model = convert_case(case, {}, target="iOS18", precision="fp16", attention=attention)
    got = milexec.run(model, values)["attn"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, oracle(case, values), atol=0.25)


# ------------------------------------------------------------------------------ errors
def test_fused_rejects_softcap() -> None:
    case = Case(geometry("bhsd", 1, 2, 2, 3, 3, 4), MaskKind.CAUSAL, softcap=30.0)
    with pytest.raises(UnsupportedOpError, match=r"softcap.*'auto' or 'decomposed'"):
        convert_case(case, {}, target="iOS18", precision="fp16", attention="fused")


@pytest.mark.parametrize("target", ["iOS15", "iOS16", "iOS17"])
def test_fused_rejects_old_targets(target: str) -> None:
    case = Case(geometry("bhsd", 1, 2, 2, 3, 3, 4), MaskKind.NONE)
    with pytest.raises(UnsupportedOpError, match=r"iOS18") as err:
        convert_case(case, {}, target=target, precision="fp16", attention="fused")
    assert "attn" in str(err.value)


def test_custom_mask_of_wrong_size() -> None:
    case = Case(geometry("bhsd", 2, 2, 2, 3, 4, 4), MaskKind.CUSTOM, (2, 5))
    with pytest.raises(ShapeError, match="B\\*Sk") as err:
        convert_case(case, {}, target="iOS18", precision="fp32", attention="auto")
    assert err.value.operand == "mask"


def test_bias_that_does_not_broadcast() -> None:
    case = Case(geometry("bhsd", 2, 2, 2, 3, 4, 4), MaskKind.BIAS, (3, 3))
    with pytest.raises(ShapeError, match="Bias") as err:
        convert_case(case, {}, target="iOS17", precision="fp32", attention="auto")
    assert err.value.operand == "mask"


def test_bool_bias_is_rejected() -> None:
    case = Case(geometry("bhsd", 1, 2, 2, 3, 4, 4), MaskKind.BIAS, (1, 2, 3, 4), DType.BOOL)
    with pytest.raises(DTypeError, match="Custom"):
        convert_case(case, {}, target="iOS18", precision="fp32", attention="auto")


def test_integer_query_is_rejected() -> None:
    g = Graph("attention")
    q = g.input("q", (1, 2, 3, 4), "i32")
    k = g.input("k", (1, 2, 3, 4))
    try:
        out = g.add_node(ops.Attention(2, 4, MaskKind.NONE), [q, k, k], Shape.of((1, 2, 3, 4), DType.I32), name="attn")
    except DTypeError:
        return  # rejected by the IR already
    g.set_outputs([out])
    with pytest.raises(DTypeError, match="float") as err:
        convert_graph(g, target="iOS18")
    assert err.value.operand == "q"


def test_kv_heads_must_divide_heads() -> None:
    g = Graph("attention")
    q = g.input("q", (1, 4, 3, 4))
    k = g.input("k", (1, 3, 3, 4))
    with pytest.raises(AttributeValueError, match="multiple"):
        out = g.add_node(ops.Attention(4, 4, MaskKind.NONE), [q, k, k], Shape.of((1, 4, 3, 4)), name="attn")
        g.set_outputs([out])
        convert_graph(g, target="iOS18")


def test_errors_are_graph_errors_naming_the_node() -> None:
    case = Case(geometry("bsx", 1, 2, 2, 3, 4, 4), MaskKind.CUSTOM, (1, 3))
    with pytest.raises(GraphError) as err:
        convert_case(case, {}, target="iOS18", precision="fp32", attention="auto")
    assert err.value.name == "attn" and err.value.op == "Attention"
