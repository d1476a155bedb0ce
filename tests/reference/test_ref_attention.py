"""Attention and AttentionBackward against the loop oracle and finite differences."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from oracles import attention_grad_oracle, attention_oracle
from refgraph import run_kernel, shape

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir import DType, Graph, MaskKind
from rlx_mil.ir.ops import Attention, AttentionBackward, AttentionBwdWrt, Input
from rlx_mil.reference import evaluate
from rlx_mil.reference.attention import attention

LAYOUTS = ("bhsd", "bshd", "bsx", "sx")


@dataclass
class Case:
    layout: str
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    q_len: int
    kv_len: int
    kind: str
    window: int | None
    mask: np.ndarray | None

    @property
    def mask_kind(self) -> MaskKind:
        if self.kind == "sliding":
            assert self.window is not None
            return MaskKind.sliding_window(self.window)
        return MaskKind.parse(self.kind)

    def dims(self, heads: int, seq: int) -> tuple[int, ...]:
        b, d = self.batch, self.head_dim
        return {
            "bhsd": (b, heads, seq, d), "bshd": (b, seq, heads, d),
            "bsx": (b, seq, heads * d), "sx": (seq, heads * d),
        }[self.layout]


def _draw_case(data: st.DataObject, kinds: tuple[str, ...] = ("none", "causal", "sliding", "custom", "bias")) -> Case:
    layout = data.draw(st.sampled_from(LAYOUTS), label="layout")
    heads = data.draw(st.sampled_from([1, 2, 4]), label="heads")
    kv_heads = data.draw(st.sampled_from([h for h in (1, 2, 4) if heads % h == 0]), label="kv_heads")
    head_dim = data.draw(st.integers(1, 4), label="head_dim")
    batch = 1 if layout == "sx" else data.draw(st.integers(1, 2), label="batch")
    relation = data.draw(st.sampled_from(["equal", "decode", "chunk", "longer_q"]), label="relation")
    kv_len = data.draw(st.integers(1 if relation in ("equal", "longer_q") else 2, 5), label="kv_len")
    if relation == "equal":
        q_len = kv_len
    elif relation == "decode":
        q_len = 1
    elif relation == "chunk":
        q_len = data.draw(st.integers(1, kv_len - 1), label="q_len")
    else:
        q_len = kv_len + data.draw(st.integers(1, 2), label="q_extra")
    if layout == "bshd" and q_len == heads:
        q_len += 1  # a [B,S,H,D] tensor with S == H reads as [B,H,S,D]
    kind = data.draw(st.sampled_from(kinds), label="kind")
    window = data.draw(st.integers(0, 3), label="window") if kind == "sliding" else None
    style = data.draw(st.sampled_from(["float", "bool", "soft", "4d", "full", "broadcast"]), label="mask_style")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    fully = data.draw(st.booleans(), label="fully_masked_batch")
    return make_case(layout, batch, heads, kv_heads, head_dim, q_len, kv_len, kind, window, rng, style, fully)


def make_case(
    layout: str, batch: int, heads: int, kv_heads: int, head_dim: int, q_len: int, kv_len: int,
    kind: str, window: int | None, rng: np.random.Generator, style: str = "float", fully_masked: bool = False,
) -> Case:
    """A case with its mask. Custom styles: float, bool, soft (thresholded at 0.5), 4d
    ([B,1,1,Sk]); Bias styles: full ([B,H,Sq,Sk]) or anything else ([1,1,Sq,Sk])."""
    mask: np.ndarray | None = None
    if kind == "custom":
        keep = rng.random((batch, kv_len)) < 0.7
        if fully_masked:
            keep[0] = False
        if style == "bool":
            mask = keep
        elif style == "soft":
            mask = np.where(keep, rng.uniform(0.5, 1.0, keep.shape), rng.uniform(0.0, 0.49, keep.shape)).astype(np.float32)
        else:
            mask = keep.astype(np.float32)
        if style == "4d":
            mask = mask.reshape(batch, 1, 1, kv_len)
    elif kind == "bias":
        bias_shape = (batch, heads, q_len, kv_len) if style == "full" else (1, 1, q_len, kv_len)
        mask = rng.standard_normal(bias_shape).astype(np.float32)
    return Case(layout, batch, heads, kv_heads, head_dim, q_len, kv_len, kind, window, mask)


GRID_KINDS = ("none", "causal", "sliding", "custom", "bias")
GRID_HEADS = ((4, 4), (4, 2), (4, 1))
GRID_LENGTHS = ((3, 3), (1, 4), (2, 5), (5, 3))  # Sq == Sk, decode, chunked prefill, Sq > Sk


def grid_case(layout: str, kind: str, heads: tuple[int, int], lengths: tuple[int, int], seed: int) -> Case:
    rng = np.random.default_rng(seed)
    q_len, kv_len = lengths
    batch = 1 if layout == "sx" else 2
    if layout == "bshd" and q_len == heads[0]:
        q_len += 1
    style = ["float", "bool", "soft", "4d"][seed % 4] if kind == "custom" else ("full" if seed % 2 else "broadcast")
    return make_case(layout, batch, heads[0], heads[1], 2, q_len, kv_len, kind, 1 if kind == "sliding" else None,
                     rng, style, fully_masked=seed % 3 == 0)


def _tensors(case: Case, rng: np.random.Generator, dtype: type = np.float32) -> tuple[np.ndarray, ...]:
    q = rng.standard_normal(case.dims(case.heads, case.q_len)).astype(dtype)
    k = rng.standard_normal(case.dims(case.kv_heads, case.kv_len)).astype(dtype)
    v = rng.standard_normal(case.dims(case.kv_heads, case.kv_len)).astype(dtype)
    return q, k, v


def _graph_attention(op: Attention | AttentionBackward, arrays: list[np.ndarray], out_dims: tuple[int, ...]) -> np.ndarray:
    g = Graph("attention")
    names = ["q", "k", "v", "dy", "mask"] if isinstance(op, AttentionBackward) else ["q", "k", "v", "mask"]
    ids, feeds = [], {}
    for name, a in zip(names, arrays, strict=False):
        dt = DType.BOOL if a.dtype == np.bool_ else DType.parse(a.dtype)
        ids.append(g.add_node(Input(name), [], shape(a.shape, dt), name=name))
        feeds[name] = a
    out_dtype = DType.parse(arrays[0].dtype)
    y = g.add_node(op, ids, shape(out_dims, out_dtype), name="y")
    g.set_outputs([y])
    return evaluate(g, feeds)["y"]


@given(data=st.data())
def test_attention_matches_loop_oracle(data: st.DataObject) -> None:
    case = _draw_case(data)
    score_scale = data.draw(st.sampled_from([None, 0.3, 1.7]), label="score_scale")
    softcap = data.draw(st.sampled_from([None, 0.0, 1.5, 20.0]), label="softcap")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="data_seed"))
    q, k, v = _tensors(case, rng)
    op = Attention(case.heads, case.head_dim, case.mask_kind, score_scale, softcap)
    arrays = [q, k, v] + ([case.mask] if case.mask is not None else [])
    y = _graph_attention(op, arrays, q.shape)
    assert y.dtype == np.float32 and y.shape == q.shape
    want = attention_oracle(
        q, k, v, case.mask, num_heads=case.heads, head_dim=case.head_dim, kind=case.kind, window=case.window,
        score_scale=None if score_scale is None else float(np.float32(score_scale)),
        softcap=None if softcap is None else float(np.float32(softcap)),
    )
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", GRID_KINDS)
def test_attention_grid_matches_loop_oracle(layout: str, kind: str) -> None:
    """Every layout x mask kind x GQA grouping x length relation, with scale and cap."""
    seed = 0
    for heads in GRID_HEADS:
        for lengths in GRID_LENGTHS:
            seed += 1
            case = grid_case(layout, kind, heads, lengths, seed)
            rng = np.random.default_rng(seed)
            q, k, v = _tensors(case, rng)
            score_scale, softcap = (0.8, 2.5) if seed % 2 else (None, None)
            op = Attention(case.heads, case.head_dim, case.mask_kind, score_scale, softcap)
            arrays = [q, k, v] + ([case.mask] if case.mask is not None else [])
            y = run_kernel(op, arrays, q.shape)
            want = attention_oracle(
                q, k, v, case.mask, num_heads=case.heads, head_dim=case.head_dim, kind=case.kind,
                window=case.window, score_scale=op.score_scale, softcap=op.attn_logit_softcap,
            )
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5, err_msg=f"{case}")


@given(data=st.data())
def test_attention_fp16_inputs(data: st.DataObject) -> None:
    case = _draw_case(data)
    rng = np.random.default_rng(1)
    q, k, v = _tensors(case, rng, np.float16)
    arrays = [q, k, v] + ([case.mask] if case.mask is not None else [])
    y = _graph_attention(Attention(case.heads, case.head_dim, case.mask_kind), arrays, q.shape)
    assert y.dtype == np.float16 and np.isfinite(y).all()
    want = attention_oracle(q, k, v, case.mask, num_heads=case.heads, head_dim=case.head_dim, kind=case.kind, window=case.window)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=2e-3, atol=2e-3)


def test_fully_masked_rows_average_every_key() -> None:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(3))
    mask = np.array([[0, 0, 0], [1, 0, 1]], np.float32)
    y = attention(q, k, v, mask, num_heads=2, head_dim=2, mask_kind=MaskKind.CUSTOM)
    np.testing.assert_allclose(y[0], np.broadcast_to(v[0].mean(axis=0), (3, 4)), rtol=1e-6)
    f16 = attention(*(t.astype(np.float16) for t in (q, k, v)), mask, num_heads=2, head_dim=2, mask_kind=MaskKind.CUSTOM)
    assert np.isfinite(f16).all()


def test_causal_alignment_decode_chunk_and_long_query() -> None:
    # With V = identity rows, the output row of query i is its probability vector.
    sk = 4
    v = np.eye(sk, dtype=np.float32).reshape(1, sk, sk)
    for sq, visible in [(1, [4]), (2, [3, 4]), (4, [1, 2, 3, 4]), (6, [1, 2, 3, 4, 4, 4])]:
        q = np.zeros((1, sq, sk), np.float32)
        k = np.zeros((1, sk, sk), np.float32)
        y = attention(q, k, v, num_heads=1, head_dim=sk, mask_kind=MaskKind.CAUSAL)
        assert [(row > 0).sum() for row in y[0]] == visible
    q = np.zeros((1, 2, sk), np.float32)
    y = attention(q, np.zeros((1, sk, sk), np.float32), v, num_heads=1, head_dim=sk, mask_kind=MaskKind.sliding_window(1))
    assert (y[0] > 0).tolist() == [[False, True, True, False], [False, False, True, True]]


def test_softcap_comes_before_the_mask() -> None:
    # If the cap were applied after masking, FILL would become -cap and leak weight onto masked keys.
    q = np.ones((1, 2, 1), np.float32)
    k = np.ones((1, 2, 1), np.float32)
    v = np.array([[[1.0], [100.0]]], np.float32)
    y = attention(q, k, v, num_heads=1, head_dim=1, mask_kind=MaskKind.CAUSAL, softcap=1.0)
    assert y[0, 0, 0] == 1.0


def test_attention_rejects_bad_masks() -> None:
    q = np.zeros((1, 2, 4), np.float32)
    with pytest.raises(ShapeError):
        run_kernel(Attention(1, 4, MaskKind.CUSTOM), [q, q, q, np.ones(3, np.float32)], [1, 2, 4])
    with pytest.raises(ShapeError):
        run_kernel(Attention(1, 4, MaskKind.BIAS), [q, q, q, np.ones((1, 1, 3, 2), np.float32)], [1, 2, 4])
    with pytest.raises(AttributeValueError):
        run_kernel(Attention(3, 4, MaskKind.NONE), [np.zeros((1, 2, 8), np.float32)] * 3, [1, 2, 8])


# ------------------------------------------------------------------------------ backward


@pytest.mark.parametrize("wrt", list(AttentionBwdWrt))
@given(data=st.data())
def test_attention_backward_matches_finite_differences(wrt: AttentionBwdWrt, data: st.DataObject) -> None:
    case = _draw_case(data)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="data_seed"))
    q, k, v = _tensors(case, rng, np.float64)
    dy = rng.standard_normal(q.shape)
    mask = case.mask
    op = AttentionBackward(case.heads, case.head_dim, case.mask_kind, wrt)
    arrays = [q, k, v, dy] + ([mask.astype(np.float64) if mask.dtype != np.bool_ else mask] if mask is not None else [])
    target = {AttentionBwdWrt.QUERY: q, AttentionBwdWrt.KEY: k, AttentionBwdWrt.VALUE: v}[wrt]
    grad = _graph_attention(op, arrays, target.shape)
    assert grad.dtype == np.float64 and grad.shape == target.shape

    def forward(qq: np.ndarray, kk: np.ndarray, vv: np.ndarray) -> np.ndarray:
        return attention(qq, kk, vv, mask, num_heads=case.heads, head_dim=case.head_dim, mask_kind=case.mask_kind)

    name = {AttentionBwdWrt.QUERY: "q", AttentionBwdWrt.KEY: "k", AttentionBwdWrt.VALUE: "v"}[wrt]
    want = attention_grad_oracle(forward, q, k, v, dy, name)
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", GRID_KINDS)
def test_attention_backward_grid(layout: str, kind: str) -> None:
    seed = 100
    for heads in ((2, 2), (4, 2), (2, 1)):
        for lengths in ((3, 3), (1, 3), (4, 2)):
            seed += 1
            case = grid_case(layout, kind, heads, lengths, seed)
            rng = np.random.default_rng(seed)
            q, k, v = _tensors(case, rng, np.float64)
            dy = rng.standard_normal(q.shape)
            extra = [case.mask] if case.mask is not None else []

            def forward(qq: np.ndarray, kk: np.ndarray, vv: np.ndarray, c: Case = case) -> np.ndarray:
                return attention(qq, kk, vv, c.mask, num_heads=c.heads, head_dim=c.head_dim, mask_kind=c.mask_kind)

            for wrt, name, target in ((AttentionBwdWrt.QUERY, "q", q), (AttentionBwdWrt.KEY, "k", k), (AttentionBwdWrt.VALUE, "v", v)):
                op = AttentionBackward(case.heads, case.head_dim, case.mask_kind, wrt)
                grad = run_kernel(op, [q, k, v, dy, *extra], target.shape, DType.F64)
                want = attention_grad_oracle(forward, q, k, v, dy, name)
                np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-6, err_msg=f"{wrt} {case}")


def test_float64_forward_agrees_with_loop_oracle() -> None:
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 4, 3, 2))
    k, v = rng.standard_normal((2, 2, 5, 2)), rng.standard_normal((2, 2, 5, 2))
    y = attention(q, k, v, num_heads=4, head_dim=2, mask_kind=MaskKind.sliding_window(2))
    assert y.dtype == np.float64
    # The default scale is the f32 value of head_dim ** -0.5, as the op attribute would hold it.
    scale = float(np.float32(2**-0.5))
    want = attention_oracle(q, k, v, num_heads=4, head_dim=2, kind="sliding", window=2, score_scale=scale)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


def test_backward_fp32_and_fully_masked_rows() -> None:
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 3, 4)).astype(np.float32) for _ in range(3))
    dy = rng.standard_normal((1, 3, 4)).astype(np.float32)
    mask = np.zeros((1, 3), np.float32)
    op = AttentionBackward(2, 2, MaskKind.CUSTOM, AttentionBwdWrt.QUERY)
    dq = run_kernel(op, [q, k, v, dy, mask], q.shape)
    assert dq.dtype == np.float32 and np.all(dq == 0)  # the output no longer depends on q
    dv = run_kernel(AttentionBackward(2, 2, MaskKind.CUSTOM, AttentionBwdWrt.VALUE), [q, k, v, dy, mask], v.shape)
    np.testing.assert_allclose(dv[0], np.broadcast_to(dy[0].sum(axis=0) / 3, (3, 4)), rtol=1e-6)
