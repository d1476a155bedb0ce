"""Normalisation: LayerNorm, RmsNorm, GroupNorm and the fused residual norms (spec section 6)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import Op, fix_f32
from rlx_mil.ir.serde.codecs import (
    BOOL,
    F32,
    I32,
    USIZE,
    struct_form,
)
from rlx_mil.ir.shape import Dim, Shape
from rlx_mil.ir.shape_checks import (
    declared_or,
    fits_into,
    leading_flattened,
    require_dims,
    require_int,
    require_rank,
    size_of,
)


@dataclass(frozen=True)
class LastAxisNormOp(Op):
    """Inputs x, gamma [H], beta [H]; normalises over the last axis (`axis` must name it)."""

    axis: int
    eps: float

    def __post_init__(self) -> None:
        super().__post_init__()
        fix_f32(self, "eps")

    def arity(self) -> int | None:
        return 3

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "gamma", "beta")


@dataclass(frozen=True)
class LayerNorm(LastAxisNormOp):
    type_name: ClassVar[str] = "LayerNorm"


@dataclass(frozen=True)
class RmsNorm(LastAxisNormOp):
    """`x / sqrt(mean(x^2) + eps) * gamma + beta` (beta is added, as upstream)."""

    type_name: ClassVar[str] = "RmsNorm"


@dataclass(frozen=True)
class GroupNorm(Op):
    type_name: ClassVar[str] = "GroupNorm"
    num_groups: int
    eps: float

    def __post_init__(self) -> None:
        super().__post_init__()
        fix_f32(self, "eps")

    def arity(self) -> int | None:
        return 3

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "gamma", "beta")


@dataclass(frozen=True)
class FusedResidualNormOp(Op):
    """Norm(x + residual (+ bias)); inputs x, residual, [bias], gamma, beta."""

    has_bias: bool
    eps: float

    def __post_init__(self) -> None:
        super().__post_init__()
        fix_f32(self, "eps")

    def arity(self) -> int | None:
        return 5 if self.has_bias else 4

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "residual", "bias", "gamma", "beta") if self.has_bias else ("x", "residual", "gamma", "beta")


@dataclass(frozen=True)
class FusedResidualLN(FusedResidualNormOp):
    type_name: ClassVar[str] = "FusedResidualLN"


@dataclass(frozen=True)
class FusedResidualRmsNorm(FusedResidualNormOp):
    type_name: ClassVar[str] = "FusedResidualRmsNorm"


# -------------------------------------------------------------------------------- shape rules


def _check_affine(param: Shape, width: Dim, operand: str) -> None:
    require_dims(param, (width,), operand, "[H] =")


def _last_axis_norm(op: LayerNorm | RmsNorm, ins: Sequence[Shape]) -> Shape:
    x, gamma, beta = ins
    require_rank(x, "x", minimum=1)
    require_int(op.axis, "axis")
    if op.axis not in (-1, x.rank - 1):
        raise AttributeValueError(
            f"normalizes the last axis only: axis must be -1 or {x.rank - 1} for x {x}, got {op.axis}", operand="x"
        )
    if not math.isfinite(op.eps) or op.eps < 0:
        raise AttributeValueError(f"eps must be finite and >= 0, got {op.eps}")
    _check_affine(gamma, x.dims[-1], "gamma")
    _check_affine(beta, x.dims[-1], "beta")
    return x


@shape_rule(LayerNorm)
def _layer_norm(op: LayerNorm, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return _last_axis_norm(op, ins)


@shape_rule(RmsNorm)
def _rms_norm(op: RmsNorm, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = _last_axis_norm(op, ins)
    # A fusion pass may fold a following Reshape into the declared shape (spec 6.2).
    return declared_or(x, declared, leading_flattened(x.dims, x.dims[-1]))


@shape_rule(GroupNorm)
def _group_norm(op: GroupNorm, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, gamma, beta = ins
    require_rank(x, "x", minimum=2)
    groups = require_int(op.num_groups, "num_groups", minimum=1)
    if not math.isfinite(op.eps) or op.eps < 0:
        raise AttributeValueError(f"eps must be finite and >= 0, got {op.eps}")
    channels = x.dims[1]
    c = size_of(channels)
    if c is not None and c % groups != 0:
        raise AttributeValueError(f"channels C={c} of x {x} are not divisible by num_groups={groups}", operand="x")
    require_dims(gamma, (channels,), "gamma", "[C] =")
    require_dims(beta, (channels,), "beta", "[C] =")
    return x


def _fused_residual_norm(op: FusedResidualLN | FusedResidualRmsNorm, ins: Sequence[Shape]) -> Shape:
    x, residual = ins[0], ins[1]
    require_rank(x, "x", minimum=1)
    if not math.isfinite(op.eps) or op.eps < 0:
        raise AttributeValueError(f"eps must be finite and >= 0, got {op.eps}")
    if not fits_into(residual.dims, x.dims):
        raise ShapeError(f"residual {residual} does not match x {x}", operand="residual")
    width = x.dims[-1]
    if op.has_bias:
        _check_affine(ins[2], width, "bias")
    _check_affine(ins[-2], width, "gamma")
    _check_affine(ins[-1], width, "beta")
    return x


@shape_rule(FusedResidualLN)
def _fused_residual_ln(op: FusedResidualLN, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return _fused_residual_norm(op, ins)


@shape_rule(FusedResidualRmsNorm)
def _fused_residual_rms(op: FusedResidualRmsNorm, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return _fused_residual_norm(op, ins)


# -------------------------------------------------------------------------------- builder


class NormBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def layer_norm(
        self, x: int, gamma: int, beta: int, axis: int = -1, eps: float = 1e-5, *, name: str | None = None
    ) -> int:
        return self.add_node(LayerNorm(axis, eps), [x, gamma, beta], name=name)

    def rms_norm(
        self, x: int, gamma: int, beta: int, axis: int = -1, eps: float = 1e-5, *, name: str | None = None
    ) -> int:
        """`x / sqrt(mean(x^2) + eps) * gamma + beta` over the last axis (beta is added)."""
        return self.add_node(RmsNorm(axis, eps), [x, gamma, beta], name=name)

    def group_norm(
        self, x: int, gamma: int, beta: int, num_groups: int, eps: float = 1e-5, *, name: str | None = None
    ) -> int:
        return self.add_node(GroupNorm(num_groups, eps), [x, gamma, beta], name=name)

    def fused_residual_ln(
        self,
        x: int,
        residual: int,
        gamma: int,
        beta: int,
        bias: int | None = None,
        eps: float = 1e-5,
        *,
        name: str | None = None,
    ) -> int:
        """`LayerNorm(x + residual (+ bias))`; node inputs are x, residual, [bias], gamma, beta."""
        inputs = [x, residual, *([] if bias is None else [bias]), gamma, beta]
        return self.add_node(FusedResidualLN(bias is not None, eps), inputs, name=name)

    def fused_residual_rms_norm(
        self,
        x: int,
        residual: int,
        gamma: int,
        beta: int,
        bias: int | None = None,
        eps: float = 1e-5,
        *,
        name: str | None = None,
    ) -> int:
        """`RmsNorm(x + residual (+ bias))`; node inputs are x, residual, [bias], gamma, beta."""
        inputs = [x, residual, *([] if bias is None else [bias]), gamma, beta]
        return self.add_node(FusedResidualRmsNorm(bias is not None, eps), inputs, name=name)


#: The ops of this family.
OPS: tuple[type[Op], ...] = (LayerNorm, RmsNorm, GroupNorm, FusedResidualLN, FusedResidualRmsNorm,)

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    struct_form(LayerNorm, ("axis", I32), ("eps", F32)),
    struct_form(RmsNorm, ("axis", I32), ("eps", F32)),
    struct_form(GroupNorm, ("num_groups", USIZE), ("eps", F32)),
    struct_form(FusedResidualLN, ("has_bias", BOOL), ("eps", F32)),
    struct_form(FusedResidualRmsNorm, ("has_bias", BOOL), ("eps", F32)),
)
