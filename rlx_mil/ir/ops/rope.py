"""Rotary position embedding (spec section 8.7)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import Op
from rlx_mil.ir.serde.codecs import (
    USIZE,
    struct_form,
)
from rlx_mil.ir.shape import Shape, Static
from rlx_mil.ir.shape_checks import (
    conflict,
    require_int,
    require_rank,
    size_of,
)


@dataclass(frozen=True)
class Rope(Op):
    type_name: ClassVar[str] = "Rope"
    head_dim: int
    n_rot: int

    def arity(self) -> int | None:
        return 3

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "cos", "sin")


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


# -------------------------------------------------------------------------------- builder


class RopeBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def rope(
        self, x: int, cos: int, sin: int, head_dim: int, n_rot: int | None = None, *, name: str | None = None
    ) -> int:
        """Rotary embedding (NeoX rotate-half); `n_rot` defaults to `head_dim`."""
        return self.add_node(Rope(head_dim, head_dim if n_rot is None else n_rot), [x, cos, sin], name=name)


#: The ops of this family.
OPS: tuple[type[Op], ...] = (Rope,)

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    struct_form(Rope, ("head_dim", USIZE), ("n_rot", USIZE)),
)
