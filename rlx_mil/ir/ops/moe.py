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
    Op,
    TernaryOp,
    UnaryOp,
    collect_ops,
)
from rlx_mil.ir.ops.quant import GGUF_BLOCKS, QuantKind, QuantScheme, QuantSchemeCodec
from rlx_mil.ir.serde.codecs import (
    struct_form,
    unit_form,
)
from rlx_mil.ir.serde.versions import NEWEST
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


@dataclass(frozen=True)
class DequantGroupedMatMulMlx(Op):
    """MLX-affine experts: row i is `input[i] @ W[e]^T` with `W[e][o, c] = code * scale + bias`
    per group of `group_size` along K; codes are `bits`-bit words packed LSB-first (newest
    upstream only). Expert ids are clamped into [0, E - 1], as upstream's kernels do."""

    type_name: ClassVar[str] = "DequantGroupedMatMulMlx"
    scheme: QuantScheme

    def arity(self) -> int | None:
        return 5

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("input", "weight", "scales", "biases", "expert_idx")


#: Word widths MLX's affine quantization packs.
MLX_BITS = (2, 3, 4, 5, 6, 8)


@shape_rule(DequantGroupedMatMulMlx)
def _dequant_grouped_matmul_mlx(op: DequantGroupedMatMulMlx, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, words, scales, biases, ids = ins
    scheme = op.scheme
    if not isinstance(scheme, QuantScheme) or scheme.kind is not QuantKind.MLX_AFFINE:
        raise AttributeValueError(f"DequantGroupedMatMulMlx takes the MlxAffine scheme, got {scheme}")
    if scheme.bits not in MLX_BITS:
        raise AttributeValueError(f"MlxAffine bits must be one of {list(MLX_BITS)}, got {scheme.bits}")
    require_rank(x, "input", exact=(2,))
    _check_expert_ids(ids, x.dims[0])
    require_rank(scales, "scales", exact=(3,))
    if biases.rank != 3 or any(conflict(a, b) for a, b in zip(biases.dims, scales.dims, strict=True)):
        raise ShapeError(f"biases {biases} must have the shape of scales {scales}", operand="biases")
    for shape, role in ((scales, "scales"), (biases, "biases")):
        if not shape.dtype.is_float:
            raise DTypeError(f"{role} must be float, got {shape.dtype.value}", operand=role)
    if words.dtype is not DType.U8:
        raise DTypeError(f"weight must be U8 bytes of packed words, got {words.dtype.value}", operand="weight")
    bits, group_size = scheme.bits or 0, scheme.group_size or 0
    k, experts, n, groups = (size_of(d) for d in (x.dims[1], *scales.dims))
    if k is not None and groups is not None and (groups == 0 or k != groups * group_size):
        raise ShapeError(f"scales {scales} must hold K / group_size = {k} / {group_size} groups per row",
                         operand="scales")
    total = numel(words.dims)
    if k is not None and experts is not None and n is not None and total is not None and total * 8 != experts * n * k * bits:
        raise ShapeError(f"weight {words} must hold E * N * K * bits / 8 = {experts} * {n} * {k} * {bits} / 8 bytes",
                         operand="weight")
    return Shape((x.dims[0], scales.dims[1]), x.dtype)


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

    def dequant_grouped_matmul_mlx(
        self, x: int, weight: int, scales: int, biases: int, expert_idx: int, bits: int, group_size: int, *,
        name: str | None = None,
    ) -> int:
        """Row i: `x[i] @ W[e]^T`, `W` MLX-affine `bits`-bit words with per-group scale and bias."""
        scheme = QuantScheme(QuantKind.MLX_AFFINE, bits=bits, group_size=group_size)
        return self.add_node(DequantGroupedMatMulMlx(scheme), [x, weight, scales, biases, expert_idx], name=name)


#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    unit_form(GroupedMatMul),
    struct_form(DequantGroupedMatMul, ("scheme", QuantSchemeCodec())),
    struct_form(DequantMoEWeights, ("scheme", QuantSchemeCodec())),
    struct_form(DequantGroupedMatMulMlx, ("scheme", QuantSchemeCodec()), since=NEWEST),
)
