"""Mixture-of-experts matmuls: one weight per row picked by an expert id (spec part 2, sections
2.4-2.6). Expert ids are F32-encoded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import (
    AttributeValueError,
    DTypeError,
    ShapeError,
)
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import (
    TernaryOp,
    UnaryOp,
    collect_ops,
)
from rlx_mil.ir.ops.quant import GGUF_BLOCKS, QuantScheme, QuantSchemeCodec
from rlx_mil.ir.serde.codecs import (
    struct_form,
    unit_form,
)
from rlx_mil.ir.shape import Dim, Shape, Static
from rlx_mil.ir.shape_checks import (
    conflict,
    numel,
    require_rank,
    size_of,
)


@dataclass(frozen=True)
class GroupedMatMul(TernaryOp):
    """`out[i] = input[i] @ weight[expert_idx[i]]`; input `[M, K]`, weight `[E, K, N]`."""

    type_name: ClassVar[str] = "GroupedMatMul"

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("input", "weight", "expert_idx")


@dataclass(frozen=True)
class DequantGroupedMatMul(TernaryOp):
    """GroupedMatMul with E GGUF-encoded `[N, K]` expert slabs in `packed_w`."""

    type_name: ClassVar[str] = "DequantGroupedMatMul"
    scheme: QuantScheme

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("input", "packed_w", "expert_idx")


@dataclass(frozen=True)
class DequantMoEWeights(UnaryOp):
    """E GGUF-encoded `[N, K]` slabs decoded, each transposed, stacked to `[E, K, N]`."""

    type_name: ClassVar[str] = "DequantMoEWeights"
    scheme: QuantScheme

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("packed_w",)


# -------------------------------------------------------------------------------- shape rules


def _check_expert_ids(ids: Shape, rows: Dim) -> None:
    require_rank(ids, "expert_idx", exact=(1,))
    if conflict(ids.dims[0], rows):
        raise ShapeError(f"expert_idx {ids} needs one id per input row ({rows})", operand="expert_idx")


@shape_rule(GroupedMatMul)
def _grouped_matmul(op: GroupedMatMul, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, w, ids = ins
    require_rank(x, "input", exact=(2,))
    require_rank(w, "weight", exact=(3,))
    if conflict(x.dims[1], w.dims[1]):
        raise ShapeError(f"K differs: input {x} and weight {w} ([E, K, N])", operand="weight")
    _check_expert_ids(ids, x.dims[0])
    return Shape((x.dims[0], w.dims[2]), x.dtype)


def _gguf_slab_bytes(scheme: QuantScheme, k: int, n: int) -> int:
    if not scheme.kind.is_gguf:
        raise AttributeValueError(f"expert weights must use a GGUF scheme, got {scheme}")
    elems, block_bytes = GGUF_BLOCKS[scheme.kind]
    if (k * n) % elems:
        raise ShapeError(f"K*N = {k * n} is not a whole number of {scheme} blocks of {elems}")
    return k * n // elems * block_bytes


def _check_packed_experts(scheme: QuantScheme, packed: Shape, k: int | None, n: int | None, experts: int | None) -> None:
    if packed.dtype is not DType.U8:
        raise DTypeError(f"packed_w must be U8 bytes, got {packed.dtype.value}", operand="packed_w")
    total = numel(packed.dims)
    if k is None or n is None:
        return
    slab = _gguf_slab_bytes(scheme, k, n)
    if total is not None and (total % slab or (experts is not None and total != experts * slab)):
        raise ShapeError(f"packed_w {packed} is not a whole number of {scheme} expert slabs of {slab} bytes",
                         operand="packed_w")


@shape_rule(DequantGroupedMatMul)
def _dequant_grouped_matmul(op: DequantGroupedMatMul, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, packed, ids = ins
    require_rank(x, "input", exact=(2,))
    _check_expert_ids(ids, x.dims[0])
    if declared is None or declared.rank != 2:
        raise ShapeError("the weights are packed: pass the output shape [M, N]")
    _check_packed_experts(op.scheme, packed, size_of(x.dims[1]), size_of(declared.dims[1]), None)
    return Shape((x.dims[0], declared.dims[1]), x.dtype)


@shape_rule(DequantMoEWeights)
def _dequant_moe_weights(op: DequantMoEWeights, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    if declared is None or declared.rank != 3:
        raise ShapeError("the weights are packed: pass the output shape [E, K, N]")
    e, k, n = (size_of(d) for d in declared.dims)
    _check_packed_experts(op.scheme, ins[0], k, n, e)
    return declared.with_dtype(DType.F32)


# -------------------------------------------------------------------------------- builder


class MoeBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def grouped_matmul(self, x: int, weight: int, expert_idx: int, *, name: str | None = None) -> int:
        """Row i of `x` times `weight[expert_idx[i]]`."""
        return self.add_node(GroupedMatMul(), [x, weight, expert_idx], name=name)

    def dequant_grouped_matmul(
        self, x: int, packed_w: int, expert_idx: int, scheme: QuantScheme, out_features: int, *, name: str | None = None
    ) -> int:
        """GroupedMatMul with GGUF-packed experts; the output is `[M, out_features]`."""
        rows = (self._dims(x) or (Static(0),))[0]
        declared = Shape((rows, Static(out_features)), DType.F32)
        return self.add_node(DequantGroupedMatMul(scheme), [x, packed_w, expert_idx], declared, name=name)

    def dequant_moe_weights(
        self, packed_w: int, scheme: QuantScheme, experts: int, k: int, n: int, *, name: str | None = None
    ) -> int:
        """The `[experts, k, n]` F32 expert weights in `packed_w`."""
        declared = Shape((Static(experts), Static(k), Static(n)), DType.F32)
        return self.add_node(DequantMoEWeights(scheme), [packed_w], declared, name=name)


#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    unit_form(GroupedMatMul),
    struct_form(DequantGroupedMatMul, ("scheme", QuantSchemeCodec())),
    struct_form(DequantMoEWeights, ("scheme", QuantSchemeCodec())),
)
