"""Reference Attention and AttentionBackward (spec sections 9.1-9.6).

Layouts and GQA geometry come from `rlx_mil.ir.attention_layout`, the same helper shape
inference and the lowering use. Scores are computed in float32 (float64 when an operand is
float64), soft-capped, then masked: Causal/SlidingWindow/Custom *replace* masked scores with
FILL = -1e9, so a fully masked row averages every key uniformly; Bias is added.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import EvaluationError, ShapeError
from rlx_mil.ir.attention_layout import (
    AttentionGeometry,
    AttentionLayout,
    attention_geometry,
    attention_output_dims,
)
from rlx_mil.ir.ops import Attention, AttentionBackward, AttentionBwdWrt, MaskKind, MaskType, f32
from rlx_mil.ir.shape import MAX_TENSOR_ELEMENTS, Shape
from rlx_mil.reference.registry import as_float, compute_dtype, finish, reference_kernel

FILL = -1e9


def geometry(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, num_heads: int, head_dim: int, v_head_dim: int | None = None
) -> AttentionGeometry:
    """Validated layout and head counts of concrete q/k/v arrays."""
    return attention_geometry(Shape.of(q.shape), Shape.of(k.shape), Shape.of(v.shape), num_heads, head_dim, v_head_dim)


def split_heads(t: np.ndarray, layout: AttentionLayout, head_dim: int) -> np.ndarray:
    """`t` in `layout` as `[B, heads, S, D]`."""
    if layout is AttentionLayout.BHSD:
        return t
    if layout is AttentionLayout.BSHD:
        return t.transpose(0, 2, 1, 3)
    if layout is AttentionLayout.BSX:
        return t.reshape(t.shape[0], t.shape[1], -1, head_dim).transpose(0, 2, 1, 3)
    return t.reshape(1, t.shape[0], -1, head_dim).transpose(0, 2, 1, 3)


def merge_heads(t: np.ndarray, layout: AttentionLayout, shape: tuple[int, ...]) -> np.ndarray:
    """Inverse of `split_heads`: `[B, heads, S, D]` back to `layout` with sizes `shape`."""
    if layout is AttentionLayout.BHSD:
        return t
    if layout is AttentionLayout.BSHD:
        return t.transpose(0, 2, 1, 3)
    return t.transpose(0, 2, 1, 3).reshape(shape)


def allowed_keys(kind: MaskKind, q_len: int, kv_len: int) -> np.ndarray | None:
    """`[Sq, Sk]` bool of the keys Causal/SlidingWindow let each query row see (bottom-right
    aligned: row i sits at absolute position max(Sk - Sq, 0) + i); None for other kinds."""
    if kind.type not in (MaskType.CAUSAL, MaskType.SLIDING_WINDOW):
        return None
    position = np.arange(q_len)[:, None] + max(kv_len - q_len, 0)
    key = np.arange(kv_len)[None, :]
    allow = key <= position
    if kind.type is MaskType.SLIDING_WINDOW:
        assert kind.window is not None
        allow &= key >= position - kind.window
    return allow


def _custom_keep(mask: np.ndarray, batch: int, kv_len: int) -> np.ndarray:
    if mask.size != batch * kv_len:
        raise ShapeError(
            f"Custom mask must hold B*Sk = {batch}*{kv_len} values, got shape {list(mask.shape)}",
            operand="mask",
        )
    return as_float(mask).reshape(batch, 1, 1, kv_len) >= 0.5


def _bias(mask: np.ndarray, full: tuple[int, int, int, int], dtype: np.dtype) -> np.ndarray:
    values = as_float(mask, dtype)
    try:
        if np.broadcast_shapes(values.shape, full) == full:
            return values
    except ValueError:
        pass
    if values.size == int(np.prod(full)):
        return values.reshape(full)
    raise ShapeError(f"Bias mask {list(mask.shape)} does not broadcast to [B, H, Sq, Sk] = {list(full)}", operand="mask")


def _masked_scores(
    qh: np.ndarray,
    kh: np.ndarray,
    mask: np.ndarray | None,
    kind: MaskKind,
    scale: float,
    softcap: float | None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Scores `[B, H, Sq, Sk]` after scale, soft-cap and mask, plus the bool array of the
    entries the mask replaced (None when nothing is replaced)."""
    dt = qh.dtype.type
    batch, heads, q_len, _ = qh.shape
    kv_len = kh.shape[2]
    if batch * heads * q_len * kv_len > MAX_TENSOR_ELEMENTS:
        raise EvaluationError(
            f"attention scores [B, H, Sq, Sk] = {[batch, heads, q_len, kv_len]} would hold"
            f" {batch * heads * q_len * kv_len} elements, more than the limit of {MAX_TENSOR_ELEMENTS}"
        )
    scores = np.matmul(qh, kh.swapaxes(-1, -2)) * dt(scale)
    if softcap is not None:
        scores = dt(softcap) * np.tanh(scores / dt(softcap))
    if kind.type in (MaskType.CUSTOM, MaskType.BIAS) and mask is None:
        raise ShapeError(f"{kind} attention needs a mask input", operand="mask")
    replaced: np.ndarray | None = None
    if kind.type is MaskType.CUSTOM:
        assert mask is not None
        replaced = ~_custom_keep(mask, batch, kv_len)
    elif kind.type is MaskType.BIAS:
        assert mask is not None
        scores = scores + _bias(mask, (batch, heads, q_len, kv_len), qh.dtype)
    else:
        allow = allowed_keys(kind, q_len, kv_len)
        if allow is not None:
            replaced = ~allow[None, None]
    if replaced is not None:
        scores = np.where(replaced, dt(FILL), scores)
    return scores, replaced


def _probabilities(scores: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


def _prepare(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, num_heads: int, head_dim: int, *extra: np.ndarray,
    v_head_dim: int | None = None,
) -> tuple[AttentionGeometry, np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
    geo = geometry(q, k, v, num_heads, head_dim, v_head_dim)
    dt = compute_dtype(q, k, v, *extra)
    # Contiguous heads: NumPy's batched matmul takes BLAS only on contiguous operands (a
    # transposed view runs its own loop, ~30x slower on a 256-token check).
    qh, kh = (np.ascontiguousarray(split_heads(as_float(t, dt), geo.layout, head_dim)) for t in (q, k))
    vh = np.ascontiguousarray(split_heads(as_float(v, dt), geo.layout, geo.v_head_dim))
    rest = [as_float(t, dt) for t in extra]
    return geo, qh, kh, vh, rest


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    num_heads: int,
    head_dim: int,
    mask_kind: MaskKind,
    score_scale: float | None = None,
    softcap: float | None = None,
    v_head_dim: int | None = None,
) -> np.ndarray:
    """Attention output in q's layout (heads `v_head_dim` wide when given), float32 (float64 if
    an operand is float64)."""
    geo, qh, kh, vh, _ = _prepare(q, k, v, num_heads, head_dim, v_head_dim=v_head_dim)
    group = geo.group_size
    if group > 1:
        kh, vh = np.repeat(kh, group, axis=1), np.repeat(vh, group, axis=1)
    scale = f32(head_dim**-0.5) if score_scale is None else score_scale
    cap = softcap if softcap is not None and softcap > 0 else None
    scores, _ = _masked_scores(qh, kh, mask, mask_kind, scale, cap)
    out = np.matmul(_probabilities(scores), vh)
    out_shape = tuple(d.size for d in attention_output_dims(Shape.of(q.shape), geo))  # type: ignore[union-attr]
    return merge_heads(out, geo.layout, out_shape)


def attention_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    dy: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    num_heads: int,
    head_dim: int,
    mask_kind: MaskKind,
    wrt: AttentionBwdWrt,
) -> np.ndarray:
    """Gradient of `sum(attention(q, k, v) * dy)` w.r.t. q, k or v, in that input's layout.

    Scale is `head_dim ** -0.5`, no soft-cap (the op has no such fields). With GQA the kv-head
    gradients sum over the query heads sharing each kv head. Scores the mask replaced are
    constants, so no gradient flows through them (this matters only for fully masked rows,
    whose probabilities are uniform rather than zero).
    """
    if dy.shape != q.shape:
        raise ShapeError(f"dy must have q's shape {list(q.shape)}, got {list(dy.shape)}", operand="dy")
    geo, qh, kh, vh, (dy_flat,) = _prepare(q, k, v, num_heads, head_dim, dy)
    dyh = split_heads(dy_flat, geo.layout, head_dim)
    group = geo.group_size
    k_rep = np.repeat(kh, group, axis=1) if group > 1 else kh
    v_rep = np.repeat(vh, group, axis=1) if group > 1 else vh
    scale = f32(head_dim**-0.5)
    scores, replaced = _masked_scores(qh, k_rep, mask, mask_kind, scale, None)
    probs = _probabilities(scores)
    dt = qh.dtype.type

    def fold_groups(g: np.ndarray) -> np.ndarray:
        if group == 1:
            return g
        b, _, s, d = g.shape
        return g.reshape(b, geo.num_kv_heads, group, s, d).sum(axis=2)

    if wrt is AttentionBwdWrt.VALUE:
        grad = fold_groups(np.matmul(probs.swapaxes(-1, -2), dyh))
        return merge_heads(grad, geo.layout, v.shape)
    d_probs = np.matmul(dyh, v_rep.swapaxes(-1, -2))
    d_scores = probs * (d_probs - (probs * d_probs).sum(axis=-1, keepdims=True)) * dt(scale)
    if replaced is not None:
        d_scores = np.where(replaced, dt(0), d_scores)
    if wrt is AttentionBwdWrt.QUERY:
        return merge_heads(np.matmul(d_scores, k_rep), geo.layout, q.shape)
    grad = fold_groups(np.matmul(d_scores.swapaxes(-1, -2), qh))
    return merge_heads(grad, geo.layout, k.shape)


@reference_kernel(Attention)
def _attention(op: Attention, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    mask = inputs[3] if len(inputs) > 3 else None
    result = attention(
        inputs[0], inputs[1], inputs[2], mask,
        num_heads=op.num_heads, head_dim=op.head_dim, mask_kind=op.mask_kind,
        score_scale=op.score_scale, softcap=op.softcap, v_head_dim=op.v_head_dim,
    )
    return finish(result, out)


@reference_kernel(AttentionBackward)
def _attention_backward(op: AttentionBackward, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    mask = inputs[4] if len(inputs) > 4 else None
    result = attention_backward(
        inputs[0], inputs[1], inputs[2], inputs[3], mask,
        num_heads=op.num_heads, head_dim=op.head_dim, mask_kind=op.mask_kind, wrt=op.wrt,
    )
    return finish(result, out)
