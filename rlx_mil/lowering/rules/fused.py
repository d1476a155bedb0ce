"""Fused blocks (spec 10), lowered as small IR graphs of simpler ops.

Each rule spells its op as the decomposition the spec gives, in IR (Narrow, MatMul, Add, Rope,
Attention, LayerNorm, Activation...), and hands that graph to `ctx.lower_subgraph`, so every
piece goes through its own registered rule: weights bound to Params stay visible to the MatMul
rule (`linear`), attention picks its per-target form, norms are fp16-safe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_mil.errors import ArityError, AttributeValueError, DTypeError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import ActivationKind, BinaryOp, MaskKind
from rlx_mil.ir.shape import Shape
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.rules.norm import input_sizes, require_float


class _Builder:
    """Builds the decomposition graph of one fused node: Inputs stand for the node's inputs."""

    def __init__(self, ctx: LowerContext, label: str) -> None:
        self.ctx = ctx
        self.graph = Graph(f"{ctx.base_name}_{label}")
        self.bindings: dict[int, int] = {}
        self.params: dict[str, np.ndarray] = {}

    def outer(self, index: int, role: str) -> int:
        """An Input node standing for the fused node's input `index`."""
        node_id = self.graph.add_node(ops.Input(role), [], self.ctx.input_shape(index), name=role)
        self.bindings[node_id] = index
        return node_id

    def param(self, role: str, value: np.ndarray, dtype: DType) -> int:
        self.params[role] = value
        return self.graph.add_node(ops.Param(role), [], Shape.of(value.shape, dtype), name=role)

    def add(self, op: ops.Op, inputs: list[int], sizes: tuple[int, ...] | list[int], dtype: DType, name: str) -> int:
        return self.graph.add_node(op, inputs, Shape.of(sizes, dtype), name=name)

    def sizes(self, node_id: int) -> tuple[int, ...]:
        return self.graph.node(node_id).shape.sizes()

    def as_vector(self, node_id: int, name: str) -> int:
        """A bias-like input reshaped to rank 1 when given as e.g. [1, N]."""
        sizes = self.sizes(node_id)
        if len(sizes) == 1:
            return node_id
        shape = self.graph.node(node_id).shape
        return self.add(ops.Reshape((math.prod(sizes),)), [node_id], (math.prod(sizes),), shape.dtype, name)

    def lower(self, output: int) -> Any:
        self.graph.set_outputs([output])
        return self.ctx.lower_subgraph(self.graph, self.bindings, self.params)[0]


# ---------------------------------------------------------------------------------- checks


def _require_sizes(ctx: LowerContext, index: int, want: tuple[int, ...], operand: str) -> None:
    got = input_sizes(ctx, index)
    if got != want:
        raise ctx.fail(ShapeError, f"{operand} must be {list(want)}, got {list(got)}", operand)


def _require_numel(ctx: LowerContext, index: int, want: int, operand: str, what: str) -> None:
    got = input_sizes(ctx, index)
    if math.prod(got) != want:
        raise ctx.fail(ShapeError, f"{operand} must hold {want} values ({what}), got {list(got)}", operand)


def _check_declared(ctx: LowerContext, want: tuple[int, ...], dtype: DType) -> None:
    declared = ctx.out_shape
    if declared.sizes() != want:
        raise ctx.fail(ShapeError, f"declared shape {list(declared.sizes())} differs from the computed {list(want)}")
    if declared.dtype is not dtype:
        raise ctx.fail(DTypeError, f"declared dtype {declared.dtype.value} differs from the computed {dtype.value}")


def _check_heads(ctx: LowerContext, num_heads: int, head_dim: int) -> int:
    if num_heads < 1 or head_dim < 1:
        raise ctx.fail(AttributeValueError, f"num_heads and head_dim must be >= 1, got {num_heads} and {head_dim}")
    return num_heads * head_dim


def _check_hidden(ctx: LowerContext) -> tuple[int, ...]:
    require_float(ctx, 0, "hidden")
    sizes = input_sizes(ctx, 0)
    if len(sizes) != 3:
        raise ctx.fail(ShapeError, f"hidden must be [B, S, E], got {list(sizes)}", "hidden")
    return sizes


def _check_mask(ctx: LowerContext, index: int, hidden: tuple[int, ...]) -> None:
    batch, seq = hidden[0], hidden[1]
    _require_numel(ctx, index, batch * seq, "mask", f"a [B, S] = [{batch}, {seq}] key mask")


# ---------------------------------------------------------------------------------- SwiGLU


@lowering(
    notes=(
        "decomposed in IR: 2x Narrow (gate_first picks the halves) -> Activation(Silu) -> Mul"
        " (-> Cast when cast_to is set), each through its own rule"
    ),
)
def lower_fused_swiglu(op: ops.FusedSwiGLU, ctx: LowerContext) -> Any:
    require_float(ctx, 0, "x")
    sizes = input_sizes(ctx, 0)
    if not sizes:
        raise ctx.fail(ShapeError, "x must have rank >= 1", "x")
    width = ctx.out_shape.sizes()[-1] if ctx.out_shape.rank else 0
    want = (*sizes[:-1], width)
    if sizes[-1] != 2 * width:
        raise ctx.fail(ShapeError, f"x's last dim {sizes[-1]} is not twice the output width {width}", "x")
    x_dtype = ctx.input_shape(0).dtype
    out_dtype = op.cast_to if op.cast_to is not None else x_dtype
    _check_declared(ctx, want, out_dtype)

    b = _Builder(ctx, "swiglu")
    x = b.outer(0, "x")
    axis = len(sizes) - 1
    low = b.add(ops.Narrow(axis, 0, width), [x], want, x_dtype, "low")
    high = b.add(ops.Narrow(axis, width, width), [x], want, x_dtype, "high")
    gate, up = (low, high) if op.gate_first else (high, low)
    gate_act = b.add(ops.Activation(ActivationKind.SILU), [gate], want, x_dtype, "gate_silu")
    y = b.add(ops.Binary(BinaryOp.MUL), [up, gate_act], want, x_dtype, "gated")
    if op.cast_to is not None:
        y = b.add(ops.Cast(op.cast_to), [y], want, op.cast_to, "cast")
    return b.lower(y)


# ---------------------------------------------------------------------------------- attention


@dataclass(frozen=True)
class _AttentionInputs:
    """Subgraph node ids of the attention part of a fused block."""

    hidden: int
    qkv_w: int
    out_w: int
    mask: int
    qkv_b: int | None = None
    out_b: int | None = None
    cos: int | None = None
    sin: int | None = None


def _attention_block(b: _Builder, a: _AttentionInputs, num_heads: int, head_dim: int) -> int:
    """qkv = hidden @ qkv_w (+ b); q, k, v = thirds (Q first); optional Rope on q and k;
    Attention with the Custom key mask; out = a @ out_w (+ b). Returns the output node id."""
    hidden = b.sizes(a.hidden)
    dtype = b.graph.node(a.hidden).shape.dtype
    width = num_heads * head_dim
    lead = hidden[:-1]
    axis = len(hidden) - 1
    out_width = b.sizes(a.out_w)[-1]

    qkv = b.add(ops.MatMul(), [a.hidden, a.qkv_w], (*lead, 3 * width), dtype, "qkv")
    if a.qkv_b is not None:
        qkv = b.add(ops.Binary(BinaryOp.ADD), [qkv, b.as_vector(a.qkv_b, "qkv_b_vec")], (*lead, 3 * width), dtype, "qkv_biased")
    q, k, v = (
        b.add(ops.Narrow(axis, i * width, width), [qkv], (*lead, width), dtype, name)
        for i, name in enumerate(("q", "k", "v"))
    )
    if a.cos is not None and a.sin is not None:
        rope = ops.Rope(head_dim, head_dim)
        q = b.add(rope, [q, a.cos, a.sin], (*lead, width), dtype, "q_rope")
        k = b.add(rope, [k, a.cos, a.sin], (*lead, width), dtype, "k_rope")
    attended = b.add(ops.Attention(num_heads, head_dim, MaskKind.CUSTOM), [q, k, v, a.mask], (*lead, width), dtype, "attn")
    out = b.add(ops.MatMul(), [attended, a.out_w], (*lead, out_width), dtype, "attn_out")
    if a.out_b is not None:
        out = b.add(ops.Binary(BinaryOp.ADD), [out, b.as_vector(a.out_b, "out_b_vec")], (*lead, out_width), dtype, "attn_out_biased")
    return out


def _check_attention_weights(
    ctx: LowerContext, hidden: tuple[int, ...], width: int, qkv_w: int, out_w: int, qkv_b: int | None, out_b: int | None
) -> None:
    """Checks qkv_w [E, 3HD], out_w [HD, E] and the biases [3HD], [E]."""
    embed = hidden[-1]
    for index, operand in ((qkv_w, "qkv_w"), (out_w, "out_w")):
        require_float(ctx, index, operand)
    _require_sizes(ctx, qkv_w, (embed, 3 * width), "qkv_w")
    _require_sizes(ctx, out_w, (width, embed), "out_w")
    if qkv_b is not None:
        require_float(ctx, qkv_b, "qkv_b")
        _require_numel(ctx, qkv_b, 3 * width, "qkv_b", "one per qkv column")
    if out_b is not None:
        require_float(ctx, out_b, "out_b")
        _require_numel(ctx, out_b, embed, "out_b", "one per output column")


def _check_rope_tables(ctx: LowerContext, hidden: tuple[int, ...], head_dim: int, cos: int, sin: int) -> None:
    seq = hidden[-2]
    for index, operand in ((cos, "cos"), (sin, "sin")):
        require_float(ctx, index, operand)
        sizes = input_sizes(ctx, index)
        if len(sizes) != 2 or sizes[1] < head_dim // 2 or sizes[0] < seq:
            raise ctx.fail(ShapeError, f"{operand} must be a [P >= {seq}, {head_dim // 2}] table, got {list(sizes)}", operand
            )


@lowering(
    notes=(
        "decomposed in IR: MatMul (+Add) -> 3x Narrow (Q, K, V) -> Rope on Q and K if has_rope"
        " -> Attention(Custom key mask) -> MatMul (+Add), each through its own rule"
    ),
)
def lower_fused_attention_block(op: ops.FusedAttentionBlock, ctx: LowerContext) -> Any:
    if ctx.num_inputs != op.arity():
        raise ctx.fail(ArityError, f"expects {op.arity()} inputs, got {ctx.num_inputs}")
    width = _check_heads(ctx, op.num_heads, op.head_dim)
    hidden = _check_hidden(ctx)
    index = 4
    qkv_b = out_b = cos = sin = None
    if op.has_bias:
        qkv_b, out_b, index = 4, 5, 6
    if op.has_rope:
        cos, sin = index, index + 1
    _check_attention_weights(ctx, hidden, width, 1, 2, qkv_b, out_b)
    _check_mask(ctx, 3, hidden)
    if cos is not None and sin is not None:
        if op.head_dim % 2:
            raise ctx.fail(AttributeValueError, f"rope needs an even head_dim, got {op.head_dim}")
        _check_rope_tables(ctx, hidden, op.head_dim, cos, sin)
    dtype = ctx.input_shape(0).dtype
    _check_declared(ctx, hidden, dtype)

    b = _Builder(ctx, "attention_block")
    a = _AttentionInputs(
        hidden=b.outer(0, "hidden"), qkv_w=b.outer(1, "qkv_w"), out_w=b.outer(2, "out_w"), mask=b.outer(3, "mask"),
        qkv_b=None if qkv_b is None else b.outer(qkv_b, "qkv_b"),
        out_b=None if out_b is None else b.outer(out_b, "out_b"),
        cos=None if cos is None else b.outer(cos, "cos"),
        sin=None if sin is None else b.outer(sin, "sin"),
    )
    return b.lower(_attention_block(b, a, op.num_heads, op.head_dim))


# ---------------------------------------------------------------------------------- transformer layer

#: Input roles of FusedTransformerLayer by input count (spec 10.3 and section 13, Q29).
_LAYER_ROLES: dict[int, tuple[str, ...]] = {
    14: ("hidden", "qkv_w", "qkv_b", "out_w", "out_b", "ln1_g", "ln1_b", "fc1_w", "fc1_b",
         "fc2_w", "fc2_b", "ln2_g", "ln2_b", "mask"),
    10: ("hidden", "qkv_w", "out_w", "ln1_g", "ln1_b", "fc1_w", "fc2_w", "ln2_g", "ln2_b", "mask"),
    8: ("hidden", "qkv_w", "out_w", "ln1_g", "fc1_w", "fc2_w", "ln2_g", "mask"),
}


@lowering(
    notes=(
        "post-norm encoder layer decomposed in IR: the FusedAttentionBlock pieces (no rope) ->"
        " Add + LayerNorm -> MatMul (+Add) -> Activation -> MatMul (+Add) -> Add + LayerNorm;"
        " 14 inputs with bias, 10 (with LN betas) or 8 (zero betas) without"
    ),
)
def lower_fused_transformer_layer(op: ops.FusedTransformerLayer, ctx: LowerContext) -> Any:
    roles = _LAYER_ROLES.get(ctx.num_inputs)
    if roles is None or (op.has_bias != (ctx.num_inputs == 14)):
        counts = "14" if op.has_bias else "10 or 8"
        raise ctx.fail(ArityError, f"expects {counts} inputs, got {ctx.num_inputs}")
    at = {role: i for i, role in enumerate(roles)}
    width = _check_heads(ctx, op.num_heads, op.head_dim)
    hidden = _check_hidden(ctx)
    embed = hidden[-1]
    inter = op.intermediate_size
    if inter < 1:
        raise ctx.fail(AttributeValueError, f"intermediate_size must be >= 1, got {inter}")
    for attr in ("eps1", "eps2"):
        eps = getattr(op, attr)
        if not math.isfinite(eps) or eps < 0:
            raise ctx.fail(AttributeValueError, f"{attr} must be a finite value >= 0, got {eps}")
    _check_attention_weights(ctx, hidden, width, at["qkv_w"], at["out_w"], at.get("qkv_b"), at.get("out_b"))
    _check_mask(ctx, at["mask"], hidden)
    for role in ("ln1_g", "ln1_b", "ln2_g", "ln2_b", "fc1_b", "fc2_b"):
        if role in at:
            require_float(ctx, at[role], role)
            _require_numel(ctx, at[role], inter if role == "fc1_b" else embed, role, "one per feature")
    for role, expected in (("fc1_w", (embed, inter)), ("fc2_w", (inter, embed))):
        require_float(ctx, at[role], role)
        _require_sizes(ctx, at[role], expected, role)
    dtype = ctx.input_shape(0).dtype
    _check_declared(ctx, hidden, dtype)

    b = _Builder(ctx, "transformer_layer")
    node = {role: b.outer(i, role) for role, i in at.items()}
    for role in ("ln1_b", "ln2_b"):
        if role not in node:
            node[role] = b.param(f"{role}_zero", np.zeros(embed, dtype=np.float32), dtype)
    for role in ("ln1_g", "ln1_b", "ln2_g", "ln2_b"):
        node[role] = b.as_vector(node[role], f"{role}_vec")

    attn = _attention_block(
        b,
        _AttentionInputs(
            hidden=node["hidden"], qkv_w=node["qkv_w"], out_w=node["out_w"], mask=node["mask"],
            qkv_b=node.get("qkv_b"), out_b=node.get("out_b"),
        ),
        op.num_heads, op.head_dim,
    )
    lead = hidden[:-1]
    add = ops.Binary(BinaryOp.ADD)
    res1 = b.add(add, [node["hidden"], attn], hidden, dtype, "attn_residual")
    h1 = b.add(ops.LayerNorm(-1, op.eps1), [res1, node["ln1_g"], node["ln1_b"]], hidden, dtype, "ln1")
    f = b.add(ops.MatMul(), [h1, node["fc1_w"]], (*lead, inter), dtype, "fc1")
    if "fc1_b" in node:
        f = b.add(add, [f, b.as_vector(node["fc1_b"], "fc1_b_vec")], (*lead, inter), dtype, "fc1_biased")
    f = b.add(ops.Activation(op.activation), [f], (*lead, inter), dtype, "fc1_act")
    f = b.add(ops.MatMul(), [f, node["fc2_w"]], hidden, dtype, "fc2")
    if "fc2_b" in node:
        f = b.add(add, [f, b.as_vector(node["fc2_b"], "fc2_b_vec")], hidden, dtype, "fc2_biased")
    res2 = b.add(add, [h1, f], hidden, dtype, "ffn_residual")
    out = b.add(ops.LayerNorm(-1, op.eps2), [res2, node["ln2_g"], node["ln2_b"]], hidden, dtype, "ln2")
    return b.lower(out)
