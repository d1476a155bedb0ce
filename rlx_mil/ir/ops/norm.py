"""Normalisation: LayerNorm, RmsNorm, GroupNorm and the fused residual norms (spec section 6);
BatchNormInference, LayerNorm2d, AdaLayerNorm and its companion GatedResidual (part-2 spec
section 5; upstream keeps them with the norms)."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir.builder import BuilderBase, lookup
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import Op, collect_ops, fix_f32
from rlx_mil.ir.serde.codecs import (
    BOOL,
    F32,
    I32,
    USIZE,
    EnumCodec,
    struct_form,
    unit_form,
)
from rlx_mil.ir.serde.versions import NEWEST
from rlx_mil.ir.shape import Dim, Shape
from rlx_mil.ir.shape_checks import (
    declared_or,
    dims_text,
    fits_into,
    leading_flattened,
    require_dims,
    require_float,
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


@dataclass(frozen=True)
class BatchNormInference(Op):
    """`(x - mean) / sqrt(var + eps) * gamma + beta` with running statistics; the channel is
    the LAST axis of x (upstream's rule, not PyTorch's axis 1; part-2 spec 9 Q29)."""

    type_name: ClassVar[str] = "BatchNormInference"
    eps: float

    def __post_init__(self) -> None:
        super().__post_init__()
        fix_f32(self, "eps")

    def arity(self) -> int | None:
        return 5

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "gamma", "beta", "running_mean", "running_var")


@dataclass(frozen=True)
class LayerNorm2d(Op):
    """LayerNorm across the channels of `[N, C, H, W]` at every spatial position (SAM)."""

    type_name: ClassVar[str] = "LayerNorm2d"
    eps: float

    def __post_init__(self) -> None:
        super().__post_init__()
        fix_f32(self, "eps")

    def arity(self) -> int | None:
        return 3

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "gamma", "beta")


class AdaNormKind(enum.Enum):
    LAYER_NORM = "LayerNorm"
    RMS_NORM = "RmsNorm"


@dataclass(frozen=True)
class AdaLayerNorm(Op):
    """`norm(x) * (1 + scale) + shift` over the last axis, the norm without affine (DiT)."""

    type_name: ClassVar[str] = "AdaLayerNorm"
    norm: AdaNormKind
    eps: float

    def __post_init__(self) -> None:
        super().__post_init__()
        fix_f32(self, "eps")

    def arity(self) -> int | None:
        return 3

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "scale", "shift")


@dataclass(frozen=True)
class GatedResidual(Op):
    """`x + gate * y` (adaLN-Zero's gated residual); y has x's shape, gate broadcasts to it."""

    type_name: ClassVar[str] = "GatedResidual"

    def arity(self) -> int | None:
        return 3

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "y", "gate")


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


def _check_eps(eps: float) -> None:
    if not math.isfinite(eps) or eps < 0:
        raise AttributeValueError(f"eps must be finite and >= 0, got {eps}")


@shape_rule(BatchNormInference)
def _batch_norm_inference(op: BatchNormInference, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    require_rank(x, "x", minimum=1)
    require_float(x, "x", "BatchNormInference")
    _check_eps(op.eps)
    for shape, operand in zip(ins[1:], ("gamma", "beta", "running_mean", "running_var"), strict=True):
        require_dims(shape, (x.dims[-1],), operand, "[C] (C = the last axis of x) =")
        require_float(shape, operand, "BatchNormInference")
    return x


@shape_rule(LayerNorm2d)
def _layer_norm_2d(op: LayerNorm2d, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, gamma, beta = ins
    require_rank(x, "x", exact=(4,))
    require_float(x, "x", "LayerNorm2d")
    _check_eps(op.eps)
    _check_affine_channels(gamma, x, "gamma")
    _check_affine_channels(beta, x, "beta")
    return x


def _check_affine_channels(param: Shape, x: Shape, operand: str) -> None:
    require_dims(param, (x.dims[1],), operand, "[C] =")
    require_float(param, operand, "LayerNorm2d")


@shape_rule(AdaLayerNorm)
def _ada_layer_norm(op: AdaLayerNorm, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, scale, shift = ins
    require_rank(x, "x", minimum=1)
    require_float(x, "x", "AdaLayerNorm")
    if not isinstance(op.norm, AdaNormKind):
        raise AttributeValueError(f"norm must be an AdaNormKind, got {op.norm!r}")
    _check_eps(op.eps)
    for shape, operand in ((scale, "scale"), (shift, "shift")):
        require_float(shape, operand, "AdaLayerNorm")
        if not fits_into(shape.dims, x.dims):
            raise ShapeError(
                f"{operand} {shape} must broadcast to x {dims_text(x.dims)} without changing it", operand=operand
            )
    return x


@shape_rule(GatedResidual)
def _gated_residual(op: GatedResidual, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, y, gate = ins
    require_float(x, "x", "GatedResidual")
    require_dims(y, x.dims, "y", "x's shape")
    require_float(y, "y", "GatedResidual")
    require_float(gate, "gate", "GatedResidual")
    if not fits_into(gate.dims, x.dims):
        raise ShapeError(f"gate {gate} must broadcast to x {dims_text(x.dims)} without changing it", operand="gate")
    return x


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


    def batch_norm_inference(
        self,
        x: int,
        gamma: int,
        beta: int,
        running_mean: int,
        running_var: int,
        eps: float = 1e-5,
        *,
        name: str | None = None,
    ) -> int:
        """Inference BatchNorm over the LAST axis of x (stats `[C]`, C = x's last dim)."""
        return self.add_node(BatchNormInference(eps), [x, gamma, beta, running_mean, running_var], name=name)

    def layer_norm_2d(self, x: int, gamma: int, beta: int, eps: float = 1e-6, *, name: str | None = None) -> int:
        """LayerNorm over the channel axis of `[N, C, H, W]` at every spatial position."""
        return self.add_node(LayerNorm2d(eps), [x, gamma, beta], name=name)

    def ada_layer_norm(
        self,
        x: int,
        scale: int,
        shift: int,
        norm: AdaNormKind | str = AdaNormKind.LAYER_NORM,
        eps: float = 1e-6,
        *,
        name: str | None = None,
    ) -> int:
        """`norm(x) * (1 + scale) + shift`; `norm` is "layer_norm" / "rms_norm" (or the enum)."""
        kind = lookup(norm, AdaNormKind, _ADA_NORM_ALIASES)
        if kind is None:
            raise self._fail(AttributeValueError, f"unknown AdaLayerNorm norm {norm!r}", "AdaLayerNorm", name)
        return self.add_node(AdaLayerNorm(kind, eps), [x, scale, shift], name=name)

    def gated_residual(self, x: int, y: int, gate: int, *, name: str | None = None) -> int:
        """`x + gate * y`."""
        return self.add_node(GatedResidual(), [x, y, gate], name=name)


_ADA_NORM_ALIASES = {"layernorm": AdaNormKind.LAYER_NORM, "ln": AdaNormKind.LAYER_NORM,
                     "rmsnorm": AdaNormKind.RMS_NORM, "rms": AdaNormKind.RMS_NORM}

#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    struct_form(LayerNorm, ("axis", I32), ("eps", F32)),
    struct_form(RmsNorm, ("axis", I32), ("eps", F32)),
    struct_form(GroupNorm, ("num_groups", USIZE), ("eps", F32)),
    struct_form(FusedResidualLN, ("has_bias", BOOL), ("eps", F32)),
    struct_form(FusedResidualRmsNorm, ("has_bias", BOOL), ("eps", F32)),
    # Newest upstream only (absent from 0.2.2).
    struct_form(BatchNormInference, ("eps", F32), since=NEWEST),
    # In 0.2.2 and newest with the same fields.
    struct_form(LayerNorm2d, ("eps", F32)),
    # Newest upstream only.
    struct_form(AdaLayerNorm, ("norm", EnumCodec(AdaNormKind, "AdaNormKind")), ("eps", F32), since=NEWEST),
    unit_form(GatedResidual, since=NEWEST),
)
