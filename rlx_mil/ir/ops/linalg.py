"""Matrix products: MatMul, LoRA and the fused matmul + bias + activation (spec section 5)."""

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
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import (
    BinaryArityOp,
    Op,
    collect_ops,
    fix_f32,
)
from rlx_mil.ir.ops.elementwise import ACTIVATION, ActivationKind, activation_kind_arg
from rlx_mil.ir.serde.codecs import (
    F32,
    USIZE_VEC,
    OptionCodec,
    struct_form,
    unit_form,
)
from rlx_mil.ir.serde.versions import NEWEST
from rlx_mil.ir.shape import Shape
from rlx_mil.ir.shape_checks import (
    conflict,
    dims_text,
    fits_into,
    matmul_dims,
    require_rank,
    unsigned_axis,
)


@dataclass(frozen=True)
class MatMul(BinaryArityOp):
    type_name: ClassVar[str] = "MatMul"

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("lhs", "rhs")


@dataclass(frozen=True)
class LoraMatMul(Op):
    type_name: ClassVar[str] = "LoraMatMul"
    scale: float

    def __post_init__(self) -> None:
        super().__post_init__()
        fix_f32(self, "scale")

    def arity(self) -> int | None:
        return 4

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "w", "a", "b")


@dataclass(frozen=True)
class FusedMatMulBiasAct(Op):
    type_name: ClassVar[str] = "FusedMatMulBiasAct"
    activation: ActivationKind | None = None

    def arity(self) -> int | None:
        return 3

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "w", "bias")


@dataclass(frozen=True)
class FusedMatMulResidual(Op):
    """`matmul(lhs, rhs) + residual`, the residual a full tensor of the product's shape (newest
    upstream only)."""

    type_name: ClassVar[str] = "FusedMatMulResidual"

    def arity(self) -> int | None:
        return 3

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("lhs", "rhs", "residual")


@dataclass(frozen=True)
class DotGeneral(BinaryArityOp):
    """XLA `dot_general`: contract the paired `*_contracting` axes, batch over the paired
    `*_batch` axes; output = batch dims (lhs order) + lhs free dims + rhs free dims."""

    type_name: ClassVar[str] = "DotGeneral"
    lhs_contracting: tuple[int, ...]
    rhs_contracting: tuple[int, ...]
    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("lhs", "rhs")


# -------------------------------------------------------------------------------- shape rules


@shape_rule(MatMul)
def _matmul(op: MatMul, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return Shape(matmul_dims(ins[0], ins[1]), ins[0].dtype)


@shape_rule(LoraMatMul)
def _lora_matmul(op: LoraMatMul, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, w, a, b = ins
    if not math.isfinite(op.scale):
        raise AttributeValueError(f"scale must be finite, got {op.scale}")
    require_rank(w, "w", exact=(2,))
    dims = matmul_dims(x, w, "x", "w")
    k, n = w.dims
    require_rank(a, "a", exact=(2,))
    require_rank(b, "b", exact=(2,))
    if conflict(a.dims[0], k):
        raise ShapeError(f"a must be [K={k}, r], got {a}", operand="a")
    if conflict(b.dims[0], a.dims[1]) or conflict(b.dims[1], n):
        raise ShapeError(f"b must be [r={a.dims[1]}, N={n}], got {b}", operand="b")
    return Shape(dims, x.dtype)


@shape_rule(FusedMatMulBiasAct)
def _fused_matmul_bias_act(op: FusedMatMulBiasAct, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, w, bias = ins
    dims = matmul_dims(x, w, "x", "w")
    if not fits_into(bias.dims, dims):
        raise ShapeError(f"bias {bias} does not broadcast onto the product {dims_text(dims)}", operand="bias")
    return Shape(dims, x.dtype)


@shape_rule(FusedMatMulResidual)
def _fused_matmul_residual(op: FusedMatMulResidual, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    lhs, rhs, residual = ins
    dims = matmul_dims(lhs, rhs)
    if residual.rank != len(dims) or any(conflict(a, b) for a, b in zip(residual.dims, dims, strict=True)):
        raise ShapeError(f"residual {residual} must have the product's shape {dims_text(dims)}", operand="residual")
    if residual.dtype is not lhs.dtype:
        raise ShapeError(f"residual is {residual.dtype.value} but lhs is {lhs.dtype.value}", operand="residual")
    return Shape(dims, lhs.dtype)


@shape_rule(DotGeneral)
def _dot_general(op: DotGeneral, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    lhs, rhs = ins
    for name, axes, shape in (
        ("lhs_contracting", op.lhs_contracting, lhs), ("rhs_contracting", op.rhs_contracting, rhs),
        ("lhs_batch", op.lhs_batch, lhs), ("rhs_batch", op.rhs_batch, rhs),
    ):
        for axis in axes:
            unsigned_axis(axis, shape.rank, name)
    if len(op.lhs_contracting) != len(op.rhs_contracting) or len(op.lhs_batch) != len(op.rhs_batch):
        raise AttributeValueError("contracting and batch axes must come in lhs/rhs pairs of equal length")
    for side, used in (("lhs", (*op.lhs_batch, *op.lhs_contracting)), ("rhs", (*op.rhs_batch, *op.rhs_contracting))):
        if len(set(used)) != len(used):
            raise AttributeValueError(f"{side} names an axis twice in its batch and contracting axes")
    for kind, pairs in (("contracting", zip(op.lhs_contracting, op.rhs_contracting, strict=True)),
                        ("batch", zip(op.lhs_batch, op.rhs_batch, strict=True))):
        for i, j in pairs:
            if conflict(lhs.dims[i], rhs.dims[j]):
                raise ShapeError(
                    f"{kind} dims differ: lhs {lhs} axis {i} is {lhs.dims[i]}, rhs {rhs} axis {j} is {rhs.dims[j]}",
                    operand="rhs",
                )
    lhs_free = [d for i, d in enumerate(lhs.dims) if i not in (*op.lhs_batch, *op.lhs_contracting)]
    rhs_free = [d for i, d in enumerate(rhs.dims) if i not in (*op.rhs_batch, *op.rhs_contracting)]
    return Shape((*(lhs.dims[i] for i in op.lhs_batch), *lhs_free, *rhs_free), lhs.dtype)


# -------------------------------------------------------------------------------- builder


class LinalgBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def dot_general(
        self,
        lhs: int,
        rhs: int,
        lhs_contracting: Sequence[int],
        rhs_contracting: Sequence[int],
        lhs_batch: Sequence[int] = (),
        rhs_batch: Sequence[int] = (),
        *,
        name: str | None = None,
    ) -> int:
        """XLA-style `dot_general` (see `DotGeneral`)."""
        axes = [self._sequence(a, what, "DotGeneral", name) for a, what in (
            (lhs_contracting, "lhs_contracting"), (rhs_contracting, "rhs_contracting"),
            (lhs_batch, "lhs_batch"), (rhs_batch, "rhs_batch"))]
        return self.add_node(DotGeneral(*axes), [lhs, rhs], name=name)

    def matmul(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.add_node(MatMul(), [a, b], name=name)

    def lora_matmul(self, x: int, w: int, a: int, b: int, scale: float, *, name: str | None = None) -> int:
        """`x @ w + scale * ((x @ a) @ b)`; `scale` is the adapter's alpha / r."""
        return self.add_node(LoraMatMul(scale), [x, w, a, b], name=name)

    def fused_matmul_bias_act(
        self, x: int, w: int, bias: int, activation: ActivationKind | str | None = None, *, name: str | None = None
    ) -> int:
        kind = None if activation is None else activation_kind_arg(self, activation, "FusedMatMulBiasAct", name)
        return self.add_node(FusedMatMulBiasAct(kind), [x, w, bias], name=name)

    def fused_matmul_residual(self, lhs: int, rhs: int, residual: int, *, name: str | None = None) -> int:
        """`lhs @ rhs + residual` (the residual has the product's shape)."""
        return self.add_node(FusedMatMulResidual(), [lhs, rhs, residual], name=name)


#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    unit_form(MatMul),
    struct_form(LoraMatMul, ("scale", F32)),
    struct_form(FusedMatMulBiasAct, ("activation", OptionCodec(ACTIVATION))),
    unit_form(FusedMatMulResidual, since=NEWEST),
    struct_form(DotGeneral, ("lhs_contracting", USIZE_VEC), ("rhs_contracting", USIZE_VEC), ("lhs_batch", USIZE_VEC), ("rhs_batch", USIZE_VEC)),
)
