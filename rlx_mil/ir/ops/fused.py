"""Fused blocks: SwiGLU, the encoder attention block and the BERT-style layer (spec section 10)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import (
    AttributeValueError,
    ShapeError,
)
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import (
    Op,
    UnaryOp,
    collect_ops,
    fix_f32,
)
from rlx_mil.ir.ops.elementwise import ACTIVATION, ActivationKind, activation_kind_arg
from rlx_mil.ir.serde.codecs import (
    BOOL,
    DTYPE,
    F32,
    USIZE,
    OptionCodec,
    struct_form,
)
from rlx_mil.ir.shape import Dim, Shape, Static
from rlx_mil.ir.shape_checks import (
    Dims,
    conflict,
    require_dims,
    require_int,
    require_numel,
    require_rank,
    size_of,
)

FTL_ROLES: dict[int, tuple[str, ...]] = {
    14: ("hidden", "qkv_w", "qkv_b", "out_w", "out_b", "ln1_gamma", "ln1_beta", "fc1_w", "fc1_b",
         "fc2_w", "fc2_b", "ln2_gamma", "ln2_beta", "mask"),
    10: ("hidden", "qkv_w", "out_w", "ln1_gamma", "ln1_beta", "fc1_w", "fc2_w", "ln2_gamma", "ln2_beta",
         "mask"),
    8: ("hidden", "qkv_w", "out_w", "ln1_gamma", "fc1_w", "fc2_w", "ln2_gamma", "mask"),
}


@dataclass(frozen=True)
class FusedSwiGLU(UnaryOp):
    type_name: ClassVar[str] = "FusedSwiGLU"
    cast_to: DType | None = None
    gate_first: bool = False


@dataclass(frozen=True)
class FusedAttentionBlock(Op):
    type_name: ClassVar[str] = "FusedAttentionBlock"
    num_heads: int
    head_dim: int
    has_bias: bool
    has_rope: bool

    def arity(self) -> int | None:
        return 4 + 2 * int(self.has_bias) + 2 * int(self.has_rope)

    def roles(self, count: int) -> tuple[str, ...] | None:
        roles: tuple[str, ...] = ("hidden", "qkv_w", "out_w", "mask")
        if self.has_bias:
            roles += ("qkv_b", "out_b")
        if self.has_rope:
            roles += ("cos", "sin")
        return roles


@dataclass(frozen=True)
class FusedTransformerLayer(Op):
    type_name: ClassVar[str] = "FusedTransformerLayer"
    num_heads: int
    head_dim: int
    intermediate_size: int
    eps1: float
    eps2: float
    activation: ActivationKind
    has_bias: bool

    def __post_init__(self) -> None:
        super().__post_init__()
        fix_f32(self, "eps1", "eps2")

    def arity(self) -> int | None:
        return 14 if self.has_bias else 10

    def accepted_arities(self) -> tuple[int, ...]:
        # Without bias, upstream's verifier wants 10 inputs (with LN betas) while its
        # decompositions read 8 (zero betas); both forms occur (spec section 13, Q29).
        return (14,) if self.has_bias else (10, 8)

    def roles(self, count: int) -> tuple[str, ...] | None:
        return FTL_ROLES.get(count)


# -------------------------------------------------------------------------------- shape rules


@shape_rule(FusedSwiGLU)
def _fused_swiglu(op: FusedSwiGLU, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    require_rank(x, "x", minimum=1)
    dtype = x.dtype if op.cast_to is None else op.cast_to
    width = size_of(x.dims[-1])
    half: Dim
    if width is None:
        if declared is None or declared.rank != x.rank:
            raise ShapeError(f"the last dim of x {x} is dynamic; pass the output shape explicitly", operand="x")
        half = declared.dims[-1]
    elif width % 2:
        raise ShapeError(f"last dim of x {x} must be even ([..., 2N] -> [..., N])", operand="x")
    else:
        half = Static(width // 2)
    return Shape((*x.dims[:-1], half), dtype)


def _check_block_weights(
    hidden: Shape, qkv_w: Shape, out_w: Shape, mask: Shape, num_heads: int, head_dim: int
) -> tuple[Dim, int]:
    require_int(num_heads, "num_heads", minimum=1)
    require_int(head_dim, "head_dim", minimum=1)
    require_rank(hidden, "hidden", exact=(3,))
    batch, seq, width = hidden.dims
    inner = num_heads * head_dim
    require_dims(qkv_w, (width, Static(3 * inner)), "qkv_w", "[E, 3*H*D] =")
    require_dims(out_w, (Static(inner), width), "out_w", "[H*D, E] =")
    b, s = size_of(batch), size_of(seq)
    require_numel(mask, None if b is None or s is None else b * s, "mask", f"B*S = {batch}*{seq}")
    return width, inner


@shape_rule(FusedAttentionBlock)
def _fused_attention_block(op: FusedAttentionBlock, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    hidden, qkv_w, out_w, mask = ins[:4]
    width, inner = _check_block_weights(hidden, qkv_w, out_w, mask, op.num_heads, op.head_dim)
    rest = list(ins[4:])
    if op.has_bias:
        qkv_b, out_b = rest[:2]
        rest = rest[2:]
        require_dims(qkv_b, (Static(3 * inner),), "qkv_b", "[3*H*D] =")
        require_dims(out_b, (width,), "out_b", "[E] =")
    if op.has_rope:
        if op.head_dim % 2:
            raise AttributeValueError(f"rope needs an even head_dim, got {op.head_dim}")
        seq = size_of(hidden.dims[1])
        for name, table in zip(("cos", "sin"), rest, strict=True):
            require_rank(table, name, exact=(2,))
            if conflict(table.dims[1], Static(op.head_dim // 2)):
                raise ShapeError(f"{name} must be [P, head_dim/2 = {op.head_dim // 2}], got {table}", operand=name)
            rows = size_of(table.dims[0])
            if rows is not None and seq is not None and rows < seq:
                raise ShapeError(f"{name} {table} has {rows} rows, fewer than S={seq}", operand=name)
    return hidden


@shape_rule(FusedTransformerLayer)
def _fused_transformer_layer(op: FusedTransformerLayer, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    roles = FTL_ROLES[len(ins)]
    named = dict(zip(roles, ins, strict=True))
    hidden = named["hidden"]
    width, inner = _check_block_weights(
        hidden, named["qkv_w"], named["out_w"], named["mask"], op.num_heads, op.head_dim
    )
    ffn = Static(require_int(op.intermediate_size, "intermediate_size", minimum=1))
    for eps_name in ("eps1", "eps2"):
        eps = getattr(op, eps_name)
        if not math.isfinite(eps) or eps < 0:
            raise AttributeValueError(f"{eps_name} must be finite and >= 0, got {eps}")
    expected: dict[str, tuple[Dims, str]] = {
        "qkv_b": ((Static(3 * inner),), "[3*H*D] ="),
        "out_b": ((width,), "[E] ="),
        "ln1_gamma": ((width,), "[E] ="),
        "ln1_beta": ((width,), "[E] ="),
        "fc1_w": ((width, ffn), "[E, intermediate_size] ="),
        "fc1_b": ((ffn,), "[intermediate_size] ="),
        "fc2_w": ((ffn, width), "[intermediate_size, E] ="),
        "fc2_b": ((width,), "[E] ="),
        "ln2_gamma": ((width,), "[E] ="),
        "ln2_beta": ((width,), "[E] ="),
    }
    for role, (dims, what) in expected.items():
        if role in named:
            require_dims(named[role], dims, role, what)
    return hidden


# -------------------------------------------------------------------------------- builder


class FusedBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def fused_swiglu(
        self,
        x: int,
        cast_to: DType | str | None = None,
        gate_first: bool = False,
        *,
        name: str | None = None,
    ) -> int:
        """`up * silu(gate)` from `x [..., 2N]` (up first unless `gate_first`) -> `[..., N]`."""
        dtype = None if cast_to is None else self._dtype_arg(cast_to, "FusedSwiGLU", name)
        return self.add_node(FusedSwiGLU(dtype, gate_first), [x], name=name)

    def fused_attention_block(
        self,
        hidden: int,
        qkv_w: int,
        out_w: int,
        mask: int,
        num_heads: int,
        head_dim: int,
        qkv_b: int | None = None,
        out_b: int | None = None,
        cos: int | None = None,
        sin: int | None = None,
        *,
        name: str | None = None,
    ) -> int:
        """Encoder self-attention block: QKV projection, optional rope, Custom-mask
        attention, output projection. Biases and rope tables come in pairs."""
        op_name = "FusedAttentionBlock"
        has_bias = self._pair(qkv_b, out_b, "qkv_b and out_b", op_name, name)
        has_rope = self._pair(cos, sin, "cos and sin", op_name, name)
        inputs = [hidden, qkv_w, out_w, mask]
        if has_bias:
            inputs += [qkv_b, out_b]  # type: ignore[list-item]
        if has_rope:
            inputs += [cos, sin]  # type: ignore[list-item]
        return self.add_node(FusedAttentionBlock(num_heads, head_dim, has_bias, has_rope), inputs, name=name)

    def _pair(self, a: int | None, b: int | None, what: str, op: str, name: str | None) -> bool:
        if (a is None) != (b is None):
            raise self._fail(AttributeValueError, f"{what} must be given together", op, name)
        return a is not None

    def fused_transformer_layer(
        self,
        hidden: int,
        mask: int,
        *,
        qkv_w: int,
        out_w: int,
        ln1_gamma: int,
        fc1_w: int,
        fc2_w: int,
        ln2_gamma: int,
        num_heads: int,
        head_dim: int,
        intermediate_size: int | None = None,
        ln1_beta: int | None = None,
        ln2_beta: int | None = None,
        qkv_b: int | None = None,
        out_b: int | None = None,
        fc1_b: int | None = None,
        fc2_b: int | None = None,
        eps1: float = 1e-12,
        eps2: float = 1e-12,
        activation: ActivationKind | str = "gelu",
        name: str | None = None,
    ) -> int:
        """BERT-style post-norm encoder layer.

        Input forms (spec 10.3): all four biases and both LN betas (14 inputs); betas without
        biases (10); neither (8, zero betas). `intermediate_size` defaults to fc1_w's width.
        """
        op_name = "FusedTransformerLayer"
        biases = (qkv_b, out_b, fc1_b, fc2_b)
        has_bias = all(b is not None for b in biases)
        if not has_bias and any(b is not None for b in biases):
            raise self._fail(AttributeValueError, "qkv_b, out_b, fc1_b and fc2_b must be given together", op_name, name)
        has_betas = self._pair(ln1_beta, ln2_beta, "ln1_beta and ln2_beta", op_name, name)
        if has_bias and not has_betas:
            raise self._fail(AttributeValueError, "the biased form also needs ln1_beta and ln2_beta", op_name, name)
        kind = activation_kind_arg(self, activation, op_name, name)
        if intermediate_size is None:
            fc1 = self._dims(fc1_w)
            width = fc1[-1] if fc1 else None
            if not isinstance(width, Static):
                raise self._fail(
                    AttributeValueError, "pass intermediate_size (fc1_w has no static width)", op_name, name
                )
            intermediate_size = width.size
        if has_bias:
            inputs = [hidden, qkv_w, qkv_b, out_w, out_b, ln1_gamma, ln1_beta, fc1_w, fc1_b,
                      fc2_w, fc2_b, ln2_gamma, ln2_beta, mask]
        elif has_betas:
            inputs = [hidden, qkv_w, out_w, ln1_gamma, ln1_beta, fc1_w, fc2_w, ln2_gamma, ln2_beta, mask]
        else:
            inputs = [hidden, qkv_w, out_w, ln1_gamma, fc1_w, fc2_w, ln2_gamma, mask]
        op = FusedTransformerLayer(num_heads, head_dim, intermediate_size, eps1, eps2, kind, has_bias)
        return self.add_node(op, inputs, name=name)  # type: ignore[arg-type]


#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    struct_form(FusedSwiGLU, ("cast_to", OptionCodec(DTYPE)), ("gate_first", BOOL)),
    struct_form(FusedAttentionBlock, ("num_heads", USIZE), ("head_dim", USIZE), ("has_bias", BOOL), ("has_rope", BOOL)),
    struct_form(
        FusedTransformerLayer,
        ("num_heads", USIZE),
        ("head_dim", USIZE),
        ("intermediate_size", USIZE),
        ("eps1", F32),
        ("eps2", F32),
        ("activation", ACTIVATION),
        ("has_bias", BOOL),
    ),
)
