"""Reference fused blocks (spec section 10), written as their decompositions."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import ArityError, ShapeError
from rlx_mil.ir.ops import ActivationKind, FusedAttentionBlock, FusedSwiGLU, FusedTransformerLayer, MaskKind
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.attention import attention
from rlx_mil.reference.elementwise import activation
from rlx_mil.reference.linalg import matmul
from rlx_mil.reference.norm import layer_norm
from rlx_mil.reference.registry import as_float, compute_dtype, finish, reference_kernel, sizes_of
from rlx_mil.reference.rope import rope


def swiglu(x: np.ndarray, gate_first: bool) -> np.ndarray:
    """`up * silu(gate)` over the two halves of the last axis."""
    width = x.shape[-1] if x.ndim else 0
    if width % 2 != 0 or width == 0:
        raise ShapeError(f"the last dim of x must be even (2N), got {list(x.shape)}", operand="x")
    half = width // 2
    low, high = x[..., :half], x[..., half:]
    gate, up = (low, high) if gate_first else (high, low)
    return as_float(up, compute_dtype(x)) * activation(ActivationKind.SILU, gate)


@reference_kernel(FusedSwiGLU)
def _fused_swiglu(op: FusedSwiGLU, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    y = swiglu(inputs[0], op.gate_first)
    declared_last = sizes_of(out)[-1] if out.rank else None
    if declared_last is not None and declared_last != y.shape[-1]:
        raise ShapeError(f"declared last dim {declared_last} is not half of x's {inputs[0].shape[-1]}", operand="x")
    return finish(y, out)


def _add_vector(y: np.ndarray, bias: np.ndarray | None, operand: str) -> np.ndarray:
    if bias is None:
        return y
    if bias.size != y.shape[-1]:
        raise ShapeError(f"{operand} must hold {y.shape[-1]} values, got shape {list(bias.shape)}", operand=operand)
    return y + as_float(bias, y.dtype).reshape(-1)


def attention_block(
    hidden: np.ndarray,
    qkv_w: np.ndarray,
    out_w: np.ndarray,
    mask: np.ndarray,
    *,
    num_heads: int,
    head_dim: int,
    qkv_b: np.ndarray | None = None,
    out_b: np.ndarray | None = None,
    cos: np.ndarray | None = None,
    sin: np.ndarray | None = None,
) -> np.ndarray:
    """Spec 10.2: fused QKV projection (Q first), optional Rope on q and k, key-padding
    (Custom) attention at the default scale, output projection."""
    if hidden.ndim != 3:
        raise ShapeError(f"hidden must be [B, S, E], got {list(hidden.shape)}", operand="hidden")
    width = num_heads * head_dim
    qkv = _add_vector(matmul(hidden, qkv_w, ("hidden", "qkv_w")), qkv_b, "qkv_b")
    if qkv.shape[-1] != 3 * width:
        raise ShapeError(f"qkv_w must produce 3*H*D = {3 * width} columns, got {qkv.shape[-1]}", operand="qkv_w")
    q, k, v = qkv[..., :width], qkv[..., width : 2 * width], qkv[..., 2 * width :]
    if cos is not None and sin is not None:
        q = rope(q, cos, sin, head_dim, head_dim)
        k = rope(k, cos, sin, head_dim, head_dim)
    a = attention(q, k, v, mask, num_heads=num_heads, head_dim=head_dim, mask_kind=MaskKind.CUSTOM)
    return _add_vector(matmul(a, out_w, ("attention", "out_w")), out_b, "out_b")


@reference_kernel(FusedAttentionBlock)
def _fused_attention_block(op: FusedAttentionBlock, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    hidden, qkv_w, out_w, mask = inputs[:4]
    rest = list(inputs[4:])
    qkv_b = out_b = cos = sin = None
    if op.has_bias:
        qkv_b, out_b = rest[0], rest[1]
        rest = rest[2:]
    if op.has_rope:
        cos, sin = rest[0], rest[1]
    y = attention_block(
        hidden, qkv_w, out_w, mask, num_heads=op.num_heads, head_dim=op.head_dim,
        qkv_b=qkv_b, out_b=out_b, cos=cos, sin=sin,
    )
    return finish(y, out)


def transformer_layer(
    op: FusedTransformerLayer, inputs: Sequence[np.ndarray]
) -> np.ndarray:
    """Spec 10.3: post-norm encoder layer. Input forms: 14 (with biases), 10 (no biases, LN
    betas given) and 8 (no biases, zero LN betas)."""
    count = len(inputs)
    qkv_b: np.ndarray | None
    out_b: np.ndarray | None
    fc1_b: np.ndarray | None
    fc2_b: np.ndarray | None
    if op.has_bias:
        if count != 14:
            raise ArityError(f"FusedTransformerLayer with bias takes 14 inputs, got {count}")
        (hidden, qkv_w, qkv_b, out_w, out_b, ln1_g, ln1_b, fc1_w, fc1_b, fc2_w, fc2_b,
         ln2_g, ln2_b, mask) = inputs
    elif count == 10:
        hidden, qkv_w, out_w, ln1_g, ln1_b, fc1_w, fc2_w, ln2_g, ln2_b, mask = inputs
        qkv_b = out_b = fc1_b = fc2_b = None
    elif count == 8:
        hidden, qkv_w, out_w, ln1_g, fc1_w, fc2_w, ln2_g, mask = inputs
        qkv_b = out_b = fc1_b = fc2_b = None
        ln1_b = np.zeros(np.shape(ln1_g), np.float32)
        ln2_b = np.zeros(np.shape(ln2_g), np.float32)
    else:
        raise ArityError(f"FusedTransformerLayer without bias takes 10 or 8 inputs, got {count}")
    attn = attention_block(
        hidden, qkv_w, out_w, mask, num_heads=op.num_heads, head_dim=op.head_dim,
        qkv_b=qkv_b, out_b=out_b,
    )
    h1 = layer_norm(as_float(hidden, attn.dtype) + attn, ln1_g, ln1_b, op.eps1)
    inner = _add_vector(matmul(h1, fc1_w, ("h1", "fc1_w")), fc1_b, "fc1_b")
    if inner.shape[-1] != op.intermediate_size:
        raise ShapeError(
            f"fc1_w gives {inner.shape[-1]} columns but intermediate_size={op.intermediate_size}", operand="fc1_w"
        )
    f = _add_vector(matmul(activation(op.activation, inner), fc2_w, ("fc1", "fc2_w")), fc2_b, "fc2_b")
    return layer_norm(h1 + f, ln2_g, ln2_b, op.eps2)


@reference_kernel(FusedTransformerLayer)
def _fused_transformer_layer(op: FusedTransformerLayer, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(transformer_layer(op, inputs), out)
