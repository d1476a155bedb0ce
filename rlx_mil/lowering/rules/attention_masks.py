"""Building blocks of the attention lowering (spec section 9): head layouts, query-group
folding for GQA, and masks that Core ML cannot fold into constants.

Every attention variant is computed on rank-4 tensors in one canonical form:

* queries `[B, H_kv, G*Sq, D]`: the `G = H / H_kv` query heads that share a kv head are folded
  into the row axis (row `g*Sq + i` is query row `i` of head `h = kv*G + g`), so K and V are used
  as they are (`[B, H_kv, Sk, D]`) and are never copied per query head;
* masks broadcastable to the scores `[B, H_kv, G*Sq, Sk]`.

Causal and sliding-window masks are computed at run time from tensors whose *values* Core ML
cannot know while converting (a ones tensor shaped after a slice of q and k), so the
const-elimination pass cannot turn them into `Sq x Sk` constants, whatever the pass pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_mil.errors import DTypeError, GraphError, ShapeError
from rlx_mil.ir.attention_layout import AttentionGeometry, AttentionLayout, attention_geometry
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.ops import MaskKind, MaskType
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.target import Precision, Target

#: Replacement for masked scores (spec 9.4). fp32 uses the spec's value; fp16 a finite value
#: well inside fp16 range, so neither the fill nor `fill - max` overflows to -inf.
FILL_FP32 = -1e9
FILL_FP16 = -3.0e4


def mask_fill(precision: Precision, neural_engine: bool = False) -> float:
    """The score of a masked key: one that survives fp16 (the Neural Engine computes in fp16
    whatever the program's precision), else a lower one under fp32."""
    return FILL_FP16 if precision is Precision.FP16 or neural_engine else FILL_FP32


def attention_dims(ctx: LowerContext, num_heads: int, head_dim: int, v_head_dim: int | None = None) -> AttentionGeometry:
    """The geometry of q (input 0), k (1) and v (2), whose sizes are static at conversion; typed
    errors name the operand."""
    shapes = [ctx.input_shape(i) for i in range(3)]
    for name, shape in zip(("q", "k", "v"), shapes, strict=True):
        if not shape.dtype.is_float:
            raise DTypeError(
                f"{name} must be a float tensor, got {shape.dtype.value}",
                node=ctx.node.id, op=ctx.op.type_name, name=ctx.node.name, operand=name,
            )
    try:
        geo: AttentionGeometry = attention_geometry(shapes[0], shapes[1], shapes[2], num_heads, head_dim, v_head_dim)
    except GraphError as err:
        raise ctx.fail(type(err), err.detail, err.operand) from None
    return geo


# ------------------------------------------------------------------------------ layouts
def split_heads(
    x: Any, dims: AttentionGeometry, heads: int, seq: int, ctx: LowerContext, what: str, width: int | None = None
) -> Any:
    """`x` in the node's layout as `[B, heads, seq, D]` (D = `width`, default head_dim)."""
    from coremltools.converters.mil import Builder as mb

    layout, b, d = dims.layout, dims.batch_size, dims.head_dim if width is None else width
    if layout is AttentionLayout.BHSD:
        return x
    if layout is AttentionLayout.BSHD:
        return mb.transpose(x=x, perm=[0, 2, 1, 3], name=ctx.name(f"{what}_heads"))
    if heads == 1:  # moving a size-1 head axis is a pure reshape
        return mb.reshape(x=x, shape=[b, 1, seq, d], name=ctx.name(f"{what}_heads"))
    split = mb.reshape(x=x, shape=[b, seq, heads, d], name=ctx.name(f"{what}_split"))
    return mb.transpose(x=split, perm=[0, 2, 1, 3], name=ctx.name(f"{what}_heads"))


def merge_heads(x: Any, dims: AttentionGeometry, heads: int, seq: int, out_sizes: tuple[int, ...], ctx: LowerContext, what: str) -> Any:
    """Inverse of `split_heads`: `[B, heads, seq, D]` back to the layout, shaped `out_sizes`."""
    from coremltools.converters.mil import Builder as mb

    layout = dims.layout
    if layout is AttentionLayout.BHSD:
        return x
    if layout is AttentionLayout.BSHD:
        return mb.transpose(x=x, perm=[0, 2, 1, 3], name=ctx.name(f"{what}_layout"))
    if heads == 1:
        return mb.reshape(x=x, shape=list(out_sizes), name=ctx.name(f"{what}_layout"))
    swapped = mb.transpose(x=x, perm=[0, 2, 1, 3], name=ctx.name(f"{what}_merge"))
    return mb.reshape(x=swapped, shape=list(out_sizes), name=ctx.name(f"{what}_layout"))


def fold_groups(x: Any, dims: AttentionGeometry, ctx: LowerContext, what: str) -> Any:
    """`[B, H, Sq, D]` -> `[B, H_kv, G*Sq, D]` (a reshape: head h = kv*G + g)."""
    from coremltools.converters.mil import Builder as mb

    if dims.group_size == 1:
        return x
    return mb.reshape(x=x, shape=[dims.batch_size, dims.num_kv_heads, dims.rows, dims.head_dim], name=ctx.name(f"{what}_grouped"))


def unfold_groups(x: Any, dims: AttentionGeometry, ctx: LowerContext, what: str, width: int | None = None) -> Any:
    """`[B, H_kv, G*Sq, D]` -> `[B, H, Sq, D]` (D = `width`, default head_dim)."""
    from coremltools.converters.mil import Builder as mb

    if dims.group_size == 1:
        return x
    d = dims.head_dim if width is None else width
    return mb.reshape(x=x, shape=[dims.batch_size, dims.num_heads, dims.q_size, d], name=ctx.name(f"{what}_ungrouped"))


# ------------------------------------------------------------------------------ masks
@dataclass
class Masking:
    """How the scores `[B, H_kv, G*Sq, Sk]` of one node are masked.

    keep: bool, True = attend; masked scores are *replaced* (Causal, SlidingWindow, Custom).
    bias: float, added to the scores (Bias).
    live_rows: bool broadcastable to `[B, H_kv, G*Sq, 1]`, False for query rows whose every key
        is masked (they average all keys uniformly); None when no such row can occur.
    """

    keep: Any = None
    bias: Any = None
    live_rows: Any = None

    @property
    def replaces(self) -> bool:
        return self.keep is not None


def window_rows(kind: MaskKind, dims: AttentionGeometry) -> tuple[bool, np.ndarray | None]:
    """For Causal/SlidingWindow: (every key visible to every row, bool `[Sq]` of rows that
    see no key at all or None). Rows see `off+i-w <= j <= off+i` (spec 9.4); only a sliding
    window with more queries than keys can leave a row empty."""
    sq, sk, off = dims.q_size, dims.kv_size, dims.offset
    all_visible = off >= sk - 1
    if kind.type is MaskType.SLIDING_WINDOW:
        assert kind.window is not None
        all_visible = all_visible and off + sq - 1 - kind.window <= 0
        positions = off + np.arange(sq)
        empty = positions - kind.window > sk - 1
        return all_visible, (empty if empty.any() else None)
    return all_visible, None


def runtime_ones(ref: Any, ctx: LowerContext, what: str) -> Any:
    """Ones shaped like `ref`, computed from `ref` at run time, so they never fold to a const."""
    from coremltools.converters.mil import Builder as mb

    if ctx.target >= Target.IOS16:
        return mb.fill_like(ref_tensor=ref, value=ctx.scalar(1.0), name=ctx.name(f"{what}_ones"))
    # No fill_like before iOS16: not(x < x) is True for every x, NaN included.
    never = mb.less(x=ref, y=ref, name=ctx.name(f"{what}_never"))
    always = mb.logical_not(x=never, name=ctx.name(f"{what}_always"))
    return mb.cast(x=always, dtype=ctx.mil_float, name=ctx.name(f"{what}_ones"))


def window_keep(kind: MaskKind, dims: AttentionGeometry, q_folded: Any, k_heads: Any, ctx: LowerContext) -> Any:
    """Bool `[G*Sq, Sk]` of the keys each folded query row may see (Causal/SlidingWindow),
    built with `band_part` on a run-time ones tensor `[G, Sq, Sk]`: no constant of that size."""
    from coremltools.converters.mil import Builder as mb

    g, sq, sk, off = dims.group_size, dims.q_size, dims.kv_size, dims.offset
    col = mb.slice_by_size(x=q_folded, begin=[0, 0, 0, 0], size=[1, 1, dims.rows, 1], name=ctx.name("mask_rows_ref"))
    col = mb.reshape(x=col, shape=[g, sq, 1], name=ctx.name("mask_rows_shape"))
    row = mb.slice_by_size(x=k_heads, begin=[0, 0, 0, 0], size=[1, 1, sk, 1], name=ctx.name("mask_keys_ref"))
    row = mb.reshape(x=row, shape=[1, 1, sk], name=ctx.name("mask_keys_shape"))
    ones = mb.mul(
        x=runtime_ones(col, ctx, "mask_rows"), y=runtime_ones(row, ctx, "mask_keys"), name=ctx.name("mask_ones")
    )
    # band_part keeps (lower < 0 or i - j <= lower) and (upper < 0 or j - i <= upper).
    # Upper edge j <= off + i: upper = off. Lower edge j >= off + i - w: i - j <= w - off.
    lower = -1
    minus: Any = None
    if kind.type is MaskType.SLIDING_WINDOW:
        assert kind.window is not None
        reach = kind.window - off
        if reach >= 0:
            lower = reach
        else:
            # The lower edge lies above the diagonal: remove the band j - i <= off - w - 1.
            minus = mb.band_part(x=ones, lower=-1, upper=off - kind.window - 1, name=ctx.name("mask_too_old"))
    allowed = mb.band_part(x=ones, lower=lower, upper=off, name=ctx.name("mask_band"))
    if minus is not None:
        allowed = mb.sub(x=allowed, y=minus, name=ctx.name("mask_window"))
    if g > 1:
        allowed = mb.reshape(x=allowed, shape=[dims.rows, sk], name=ctx.name("mask_rows_folded"))
    return mb.cast(x=allowed, dtype="bool", name=ctx.name("mask_keep"))


def folded_row_flags(flags: np.ndarray, dims: AttentionGeometry) -> np.ndarray:
    """Per-query-row flags `[Sq]` as `[G*Sq, 1]` for the folded rows."""
    return np.tile(flags, dims.group_size).reshape(dims.rows, 1)


def custom_keep(ctx: LowerContext, index: int, dims: AttentionGeometry) -> tuple[Any, Any]:
    """Key-padding mask (input `index`, B*Sk values, >= 0.5 or True = attend) as bool
    `[B, 1, 1, Sk]`, and the live-rows flag `[B, 1, 1, 1]` (None when the mask is known at
    conversion time and every batch keeps a key)."""
    from coremltools.converters.mil import Builder as mb

    shape = ctx.input_shape(index)
    b, sk = dims.batch_size, dims.kv_size
    if shape.numel() != b * sk:
        raise ShapeError(
            f"Custom mask must hold B*Sk = {b}*{sk} values (e.g. [B, Sk]), got {shape}",
            node=ctx.node.id, op=ctx.op.type_name, name=ctx.node.name, operand="mask",
        )
    dtype = shape.dtype
    if dtype.is_complex:
        raise DTypeError(
            "Custom mask must be float, int or bool", node=ctx.node.id, op=ctx.op.type_name,
            name=ctx.node.name, operand="mask",
        )
    value = ctx.value(index)
    if value is not None:
        raw = np.asarray(value).reshape(b, 1, 1, sk)
        keep_np = raw.astype(bool) if dtype is DType.BOOL else raw.astype(np.float32) >= 0.5
        keep = mb.const(val=keep_np, name=ctx.name("mask_keep"))
        if keep_np.any(axis=-1).all():
            return keep, None
        return keep, mb.const(val=keep_np.any(axis=-1, keepdims=True), name=ctx.name("mask_live_rows"))
    mask = mb.reshape(x=ctx.var(index), shape=[b, 1, 1, sk], name=ctx.name("mask_keys"))
    if dtype is DType.BOOL:
        keep = mask
    elif dtype.is_int:
        keep = mb.greater_equal(x=mask, y=np.int32(1), name=ctx.name("mask_keep"))
    else:
        keep = mb.greater_equal(x=mask, y=ctx.scalar(0.5), name=ctx.name("mask_keep"))
    kept = mb.cast(x=keep, dtype=ctx.mil_float, name=ctx.name("mask_kept"))
    any_kept = mb.reduce_max(x=kept, axes=[-1], keep_dims=True, name=ctx.name("mask_any_kept"))
    live = mb.greater(x=any_kept, y=ctx.scalar(0.5), name=ctx.name("mask_live_rows"))
    return keep, live


def bias_scores(ctx: LowerContext, index: int, dims: AttentionGeometry, full_keys: bool) -> Any:
    """Additive bias (input `index`) broadcastable to `[B, H, Sq, Sk]` (NumPy rules) or holding
    exactly B*H*Sq*Sk values, as a float tensor broadcastable to the folded scores
    `[B, H_kv, G*Sq, Sk]`. `full_keys`: the key axis must be Sk wide (fused attention needs it).
    Under fp16 the bias is clamped at the mask fill so that no score becomes -inf."""
    from coremltools.converters.mil import Builder as mb

    shape = ctx.input_shape(index)
    b, h, sq, sk, g, hkv = dims.batch_size, dims.num_heads, dims.q_size, dims.kv_size, dims.group_size, dims.num_kv_heads
    full = (b, h, sq, sk)
    sizes = shape.sizes()
    if shape.dtype is DType.BOOL or shape.dtype.is_complex:
        raise DTypeError(
            f"Bias mask must be a float tensor (added to the scores), got {shape.dtype.value}; "
            "a bool keep-mask over keys is the Custom mask kind",
            node=ctx.node.id, op=ctx.op.type_name, name=ctx.node.name, operand="mask",
        )
    bias = ctx.var(index)
    if shape.dtype.is_int:
        bias = mb.cast(x=bias, dtype=ctx.mil_float, name=ctx.name("bias_float"))
    broadcastable = len(sizes) <= 4 and all(
        s in (1, f) for s, f in zip(sizes, full[4 - len(sizes):], strict=True)
    )
    if broadcastable:
        b1, h1, q1, k1 = (1,) * (4 - len(sizes)) + tuple(sizes)
    elif shape.numel() == b * h * sq * sk:
        b1, h1, q1, k1 = full
    else:
        raise ShapeError(
            f"Bias mask {shape} neither broadcasts to [B, H, Sq, Sk] = {list(full)} nor holds that many values",
            node=ctx.node.id, op=ctx.op.type_name, name=ctx.node.name, operand="mask",
        )
    if tuple(sizes) != (b1, h1, q1, k1):
        bias = mb.reshape(x=bias, shape=[b1, h1, q1, k1], name=ctx.name("bias_4d"))
    if g > 1:
        if h1 == h and q1 == 1:
            # Every folded row g*Sq + i of kv head j takes head j*G + g's single row.
            if sq > 1:
                bias = mb.reshape(x=bias, shape=[b1, hkv, g, 1, k1], name=ctx.name("bias_groups"))
                bias = mb.tile(x=bias, reps=[1, 1, 1, sq, 1], name=ctx.name("bias_rows"))
            bias = mb.reshape(x=bias, shape=[b1, hkv, g * sq, k1], name=ctx.name("bias_folded"))
        elif h1 == h:
            bias = mb.reshape(x=bias, shape=[b1, hkv, g * sq, k1], name=ctx.name("bias_folded"))
        elif q1 == sq and sq > 1:
            # Same rows for every query head: repeat the [Sq] row block once per group member.
            bias = mb.tile(x=bias, reps=[1, 1, g, 1], name=ctx.name("bias_folded"))
    if full_keys and k1 == 1 and sk > 1:
        bias = mb.tile(x=bias, reps=[1, 1, 1, sk], name=ctx.name("bias_keys"))
    if ctx.precision is Precision.FP16 or ctx.options.neural_engine:
        bias = mb.maximum(x=bias, y=ctx.scalar(FILL_FP16), name=ctx.name("bias_floor"))
    return bias


def build_masking(
    kind: MaskKind, dims: AttentionGeometry, ctx: LowerContext, mask_index: int, q_folded: Any, k_heads: Any, full_keys: bool
) -> Masking:
    """The masking of one node; `mask_index` is the input holding a Custom/Bias mask."""
    from coremltools.converters.mil import Builder as mb

    if kind.type is MaskType.NONE:
        return Masking()
    if kind.type in (MaskType.CUSTOM, MaskType.BIAS):
        # A mask input shared by several attention nodes (one padding mask for every layer)
        # is turned into the form the scores need once.
        known = ctx.value_key(mask_index)
        mask_id = known if known is not None else id(ctx.var(mask_index))
        source = (mask_id, dims.batch_size, dims.num_heads, dims.num_kv_heads, dims.q_size, dims.kv_size)
    if kind.type is MaskType.CUSTOM:
        keep, live = ctx.shared_var(("custom_keep", *source), lambda: custom_keep(ctx, mask_index, dims))
        return Masking(keep=keep, live_rows=live)
    if kind.type is MaskType.BIAS:
        bias = ctx.shared_var(("bias_scores", *source, full_keys), lambda: bias_scores(ctx, mask_index, dims, full_keys))
        return Masking(bias=bias)
    all_visible, empty_rows = window_rows(kind, dims)
    if all_visible:
        return Masking()
    # The mask depends only on the mask kind and the geometry: built once per conversion and
    # shared by every attention node with the same one (every layer of a decoder).
    geometry = (kind.type, kind.window, dims.group_size, dims.q_size, dims.kv_size)
    keep = ctx.shared_var(("window_keep", *geometry), lambda: window_keep(kind, dims, q_folded, k_heads, ctx))
    live = None
    if empty_rows is not None:
        flags = ~folded_row_flags(empty_rows, dims)
        live = ctx.shared_var(("window_live_rows", *geometry), lambda: mb.const(val=flags, name=ctx.name("mask_live_rows")))
    return Masking(keep=keep, live_rows=live)
