"""Rotary position embedding (spec section 8.7) and the 2-D axial RoPE of vision transformers
(part-2 spec section 5.9)."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from rlx_mil.errors import (
    AttributeValueError,
    ShapeError,
)
from rlx_mil.ir.builder import BuilderBase, lookup
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import (
    NEWEST_FIELD,
    Op,
    UnaryOp,
    collect_ops,
    fix_f32,
)
from rlx_mil.ir.serde.codecs import (
    F32,
    USIZE,
    EnumCodec,
    struct_form,
)
from rlx_mil.ir.serde.versions import newest_only
from rlx_mil.ir.shape import Shape, Static
from rlx_mil.ir.shape_checks import (
    conflict,
    require_float,
    require_int,
    require_rank,
    size_of,
)


class RopeStyle(enum.Enum):
    """Which dims rotate together: NeoX pairs dim i with i + n_rot/2 (rotate-half, the 0.2.2
    behaviour); GptJ pairs the adjacent dims (2i, 2i+1) (GGUF/llama.cpp NORM)."""

    NEOX = "NeoX"
    GPTJ = "GptJ"


newest_only(RopeStyle.GPTJ)


@dataclass(frozen=True)
class Rope(Op):
    type_name: ClassVar[str] = "Rope"
    head_dim: int
    n_rot: int
    #: Newest upstream JSON requires it; a 0.2.2 document (without it) means NeoX.
    style: RopeStyle = field(default=RopeStyle.NEOX, metadata=NEWEST_FIELD)

    def arity(self) -> int | None:
        return 3

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "cos", "sin")


@dataclass(frozen=True)
class AxialRope2d(UnaryOp):
    """2-D axial RoPE with its own tables: token t sits at position `t // repeat_factor` of an
    `end_x x end_y` grid (x fastest); within each head, pair (2c, 2c+1) of the first half rotates
    by `x * theta^(-4c/head_dim)`, the same pair of the second half by `y * ...`."""

    type_name: ClassVar[str] = "AxialRope2d"
    end_x: int
    end_y: int
    head_dim: int
    num_heads: int
    theta: float
    repeat_factor: int

    def __post_init__(self) -> None:
        super().__post_init__()
        fix_f32(self, "theta")


# -------------------------------------------------------------------------------- shape rules


@shape_rule(Rope)
def _rope(op: Rope, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, cos, sin = ins
    head_dim = require_int(op.head_dim, "head_dim", minimum=2)
    n_rot = require_int(op.n_rot, "n_rot", minimum=0)
    if head_dim % 2:
        raise AttributeValueError(f"head_dim must be even, got {head_dim}")
    if n_rot % 2 or n_rot > head_dim:
        raise AttributeValueError(f"n_rot must be even and <= head_dim={head_dim}, got {n_rot}")
    require_rank(x, "x", exact=(2, 3, 4))
    width = size_of(x.dims[-1])
    if x.rank == 4:
        if width is not None and width != head_dim:
            raise ShapeError(f"rank-4 x is [B, H, S, head_dim]; last dim must be {head_dim}, got {x}", operand="x")
    elif width is not None and width % head_dim:
        raise ShapeError(f"last dim of x {x} is not a multiple of head_dim={head_dim}", operand="x")
    seq = size_of(x.dims[-2])
    for name, table in (("cos", cos), ("sin", sin)):
        require_rank(table, name, exact=(2,))
        if conflict(table.dims[1], Static(head_dim // 2)):
            raise ShapeError(f"{name} must be [P, head_dim/2 = {head_dim // 2}], got {table}", operand=name)
        rows = size_of(table.dims[0])
        if rows is not None and seq is not None and rows != 1 and rows < seq:
            raise ShapeError(
                f"{name} {table} has {rows} rows but x {x} has {seq} positions (need P >= S or P == 1)",
                operand=name,
            )
    if conflict(cos.dims[0], sin.dims[0]):
        raise ShapeError(f"cos {cos} and sin {sin} must have the same rows", operand="sin")
    return x


@shape_rule(AxialRope2d)
def _axial_rope2d(op: AxialRope2d, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    end_x = require_int(op.end_x, "end_x", minimum=1)
    end_y = require_int(op.end_y, "end_y", minimum=1)
    head_dim = require_int(op.head_dim, "head_dim", minimum=4)
    num_heads = require_int(op.num_heads, "num_heads", minimum=1)
    repeat = max(require_int(op.repeat_factor, "repeat_factor", minimum=0), 1)
    if head_dim % 4:
        raise AttributeValueError(f"head_dim must be a multiple of 4 (two axes of rotated pairs), got {head_dim}")
    if not math.isfinite(op.theta) or op.theta <= 0:
        raise AttributeValueError(f"theta must be finite and > 0, got {op.theta}")
    require_rank(x, "x", exact=(3,))
    require_float(x, "x", "AxialRope2d")
    tokens = end_x * end_y * repeat
    if conflict(x.dims[1], Static(tokens)):
        raise ShapeError(
            f"x {x} must have S = end_x * end_y * max(repeat_factor, 1) = {tokens} tokens", operand="x"
        )
    if conflict(x.dims[2], Static(num_heads * head_dim)):
        raise ShapeError(f"x {x} must have num_heads * head_dim = {num_heads * head_dim} channels", operand="x")
    return x


# -------------------------------------------------------------------------------- builder


class RopeBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def rope(
        self,
        x: int,
        cos: int,
        sin: int,
        head_dim: int,
        n_rot: int | None = None,
        *,
        style: RopeStyle | str = RopeStyle.NEOX,
        name: str | None = None,
    ) -> int:
        """Rotary embedding; `n_rot` defaults to `head_dim`; `style` "neox" (rotate-half) or
        "gptj" (adjacent pairs)."""
        the_style = lookup(style, RopeStyle, {})
        if the_style is None:
            raise self._fail(AttributeValueError, f"unknown rope style {style!r} (NeoX or GptJ)", "Rope", name)
        op = Rope(head_dim, head_dim if n_rot is None else n_rot, the_style)
        return self.add_node(op, [x, cos, sin], name=name)

    def axial_rope2d(
        self,
        x: int,
        end_x: int,
        end_y: int,
        head_dim: int,
        num_heads: int = 1,
        theta: float = 10000.0,
        repeat_factor: int = 1,
        *,
        name: str | None = None,
    ) -> int:
        """2-D axial RoPE of `x [B, end_x * end_y * repeat_factor, num_heads * head_dim]`."""
        op = AxialRope2d(end_x, end_y, head_dim, num_heads, theta, repeat_factor)
        return self.add_node(op, [x], name=name)


#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    struct_form(
        Rope,
        ("head_dim", USIZE),
        ("n_rot", USIZE),
        ("style", EnumCodec(RopeStyle, "RopeStyle")),
        newest_fields=(("style", RopeStyle.NEOX),),
    ),
    # In 0.2.2 and newest with the same fields.
    struct_form(
        AxialRope2d,
        ("end_x", USIZE),
        ("end_y", USIZE),
        ("head_dim", USIZE),
        ("num_heads", USIZE),
        ("theta", F32),
        ("repeat_factor", USIZE),
    ),
)
