"""Scatter / gather: ScatterAdd, ScatterNd, ScatterElements, GatherNd, GatherElements (spec part 2, section 4).

Index operands may be declared F32 (f32-encoded indices, exact below 2^24) or an integer
dtype; readers truncate toward zero. The ONNX-style ops follow ONNX opset-16 semantics:
negative indices count from the end, and an index outside `[-dim, dim)` is an error (upstream's
CPU clamps instead; rlx_mil refuses, spec part 2, section 9 Q26). ScatterAdd takes no negative
indices.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import AttributeValueError, DTypeError, ShapeError
from rlx_mil.ir.builder import BuilderBase, lookup
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import BinaryArityOp, TernaryOp, collect_ops
from rlx_mil.ir.serde.codecs import I32, USIZE, EnumCodec, struct_form
from rlx_mil.ir.serde.versions import NEWEST
from rlx_mil.ir.shape import Dim, DimLike, Shape
from rlx_mil.ir.shape_checks import conflict, normalize_axis, require_int, size_of, unsigned_axis

#: F32-encoded indices are exact up to here; a longer destination axis needs integer indices.
F32_EXACT_INDEX_LIMIT = 2**24


class ScatterNdReduction(enum.Enum):
    """How an update combines with the value already at its destination."""

    NONE = "None"
    ADD = "Add"
    MUL = "Mul"
    MAX = "Max"
    MIN = "Min"


@dataclass(frozen=True)
class ScatterAdd(BinaryArityOp):
    """`out = zeros(declared); out[..., indices[i], ...] += updates[..., i, ...]` along `axis`."""

    type_name: ClassVar[str] = "ScatterAdd"
    axis: int

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("updates", "indices")


@dataclass(frozen=True)
class ScatterNd(TernaryOp):
    type_name: ClassVar[str] = "ScatterNd"
    reduction: ScatterNdReduction

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("data", "indices", "updates")


@dataclass(frozen=True)
class ScatterElements(TernaryOp):
    type_name: ClassVar[str] = "ScatterElements"
    axis: int
    reduction: ScatterNdReduction

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("data", "indices", "updates")


@dataclass(frozen=True)
class GatherNd(BinaryArityOp):
    """`batch_dims` below 0 counts as 0 (upstream's CPU clamps it)."""

    type_name: ClassVar[str] = "GatherNd"
    batch_dims: int

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("data", "indices")


@dataclass(frozen=True)
class GatherElements(BinaryArityOp):
    type_name: ClassVar[str] = "GatherElements"
    axis: int

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("data", "indices")


# -------------------------------------------------------------------------------- shape rules


def check_index_dtype(indices: Shape, operand: str = "indices") -> None:
    dtype = indices.dtype
    if not (dtype.is_int or dtype.is_float):
        raise DTypeError(f"indices must be f32-encoded or an integer type, got {dtype.value}", operand=operand)


def _check_data_dtype(data: Shape, operand: str) -> None:
    if data.dtype.is_complex:
        raise DTypeError(f"{operand} cannot be complex", operand=operand)


def _require_same_dtype(shape: Shape, like: Shape, operand: str, like_operand: str) -> None:
    if shape.dtype is not like.dtype:
        raise DTypeError(
            f"{operand} is {shape.dtype.value} but {like_operand} is {like.dtype.value}", operand=operand
        )


def _f32_index_limit(indices: Shape, size: Dim, what: str) -> None:
    n = size_of(size)
    if indices.dtype.is_float and n is not None and n > F32_EXACT_INDEX_LIMIT:
        raise DTypeError(
            f"{what} has {n} entries, more than f32-encoded indices address exactly (2^24); use integer indices",
            operand="indices",
        )


def index_depth(indices: Shape, data: Shape, available: int, operand: str = "indices") -> int:
    """k = indices.shape[-1] of an ND op: static, 1 <= k <= `available` data dims."""
    if indices.rank < 1:
        raise ShapeError(f"indices must have rank >= 1 (the last dim holds coordinates), got {indices}", operand=operand)
    k = size_of(indices.dims[-1])
    if k is None:
        raise ShapeError(f"the last dim of indices {indices} (coordinates per index) must be static", operand=operand)
    if not 1 <= k <= available:
        raise ShapeError(
            f"indices {indices} hold {k} coordinates per index; data {data} allows 1..{available}", operand=operand
        )
    return k


def _same_dims(shape: Shape, want: Sequence[Dim], operand: str, what: str) -> None:
    if shape.rank != len(want) or any(conflict(a, b) for a, b in zip(shape.dims, want, strict=True)):
        raise ShapeError(f"{operand} must be {what} [{', '.join(map(str, want))}], got {shape}", operand=operand)


@shape_rule(ScatterAdd)
def _scatter_add(op: ScatterAdd, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    updates, indices = ins
    _check_data_dtype(updates, "updates")
    check_index_dtype(indices)
    if updates.rank < 1:
        raise ShapeError(f"updates must have rank >= 1, got {updates}", operand="updates")
    axis = unsigned_axis(op.axis, updates.rank, operand="updates")
    if indices.rank != 1:
        raise ShapeError(f"indices must be one-dimensional [num_updates], got {indices}", operand="indices")
    if conflict(indices.dims[0], updates.dims[axis]):
        raise ShapeError(
            f"indices {indices} must hold one index per slice of updates {updates} along axis {axis}",
            operand="indices",
        )
    if declared is None:
        raise ShapeError("ScatterAdd needs its output shape declared (the destination size is not in the inputs)")
    if declared.rank != updates.rank:
        raise ShapeError(f"the declared output {declared} must have the rank of updates {updates}")
    for d in range(updates.rank):
        if d != axis and conflict(declared.dims[d], updates.dims[d]):
            raise ShapeError(
                f"the declared output {declared} must match updates {updates} on every dim but axis {axis}",
                operand="updates",
            )
    _f32_index_limit(indices, declared.dims[axis], f"axis {axis} of the output")
    return Shape(declared.dims, updates.dtype)


@shape_rule(ScatterNd)
def _scatter_nd(op: ScatterNd, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    data, indices, updates = ins
    _check_data_dtype(data, "data")
    check_index_dtype(indices)
    if data.rank < 1:
        raise ShapeError(f"data must have rank >= 1, got {data}", operand="data")
    k = index_depth(indices, data, data.rank)
    _same_dims(updates, (*indices.dims[:-1], *data.dims[k:]), "updates", "indices.shape[:-1] + data.shape[k:] =")
    _require_same_dtype(updates, data, "updates", "data")
    for d in range(k):
        _f32_index_limit(indices, data.dims[d], f"dim {d} of data")
    return data


@shape_rule(ScatterElements)
def _scatter_elements(op: ScatterElements, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    data, indices, updates = ins
    _check_data_dtype(data, "data")
    check_index_dtype(indices)
    if data.rank < 1:
        raise ShapeError(f"data must have rank >= 1, got {data}", operand="data")
    axis = normalize_axis(op.axis, data.rank, operand="data")
    _elementwise_index_layout(data, indices, axis)
    _same_dims(updates, indices.dims, "updates", "the shape of indices")
    _require_same_dtype(updates, data, "updates", "data")
    _f32_index_limit(indices, data.dims[axis], f"axis {axis} of data")
    return data


def _elementwise_index_layout(data: Shape, indices: Shape, axis: int) -> None:
    """indices has data's rank and no dim beyond data's off the axis."""
    if indices.rank != data.rank:
        raise ShapeError(f"indices {indices} must have the rank of data {data}", operand="indices")
    for d in range(data.rank):
        have, limit = size_of(indices.dims[d]), size_of(data.dims[d])
        if d != axis and have is not None and limit is not None and have > limit:
            raise ShapeError(
                f"dim {d} of indices {indices} exceeds that of data {data} (only the axis {axis} may differ)",
                operand="indices",
            )


@shape_rule(GatherNd)
def _gather_nd(op: GatherNd, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    data, indices = ins
    _check_data_dtype(data, "data")
    check_index_dtype(indices)
    b = max(require_int(op.batch_dims, "batch_dims"), 0)
    if indices.rank < b + 1:
        raise ShapeError(f"indices {indices} need rank > batch_dims {b}", operand="indices")
    if data.rank < b + 1:
        raise ShapeError(f"data {data} needs rank > batch_dims {b}", operand="data")
    for d in range(b):
        if conflict(indices.dims[d], data.dims[d]):
            raise ShapeError(
                f"the first batch_dims={b} dims of indices {indices} and data {data} must agree", operand="indices"
            )
    k = index_depth(indices, data, data.rank - b)
    for d in range(k):
        _f32_index_limit(indices, data.dims[b + d], f"dim {b + d} of data")
    return Shape((*indices.dims[:-1], *data.dims[b + k:]), data.dtype)


@shape_rule(GatherElements)
def _gather_elements(op: GatherElements, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    data, indices = ins
    _check_data_dtype(data, "data")
    check_index_dtype(indices)
    if data.rank < 1:
        raise ShapeError(f"data must have rank >= 1, got {data}", operand="data")
    axis = normalize_axis(op.axis, data.rank, operand="data")
    _elementwise_index_layout(data, indices, axis)
    _f32_index_limit(indices, data.dims[axis], f"axis {axis} of data")
    return Shape(indices.dims, data.dtype)


# -------------------------------------------------------------------------------- builder

_REDUCTION_ALIASES = {"none": ScatterNdReduction.NONE, "update": ScatterNdReduction.NONE, "replace": ScatterNdReduction.NONE,
                      "+": ScatterNdReduction.ADD, "sum": ScatterNdReduction.ADD, "*": ScatterNdReduction.MUL,
                      "prod": ScatterNdReduction.MUL}


class ScatterBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def _reduction(self, reduction: ScatterNdReduction | str, op: str, name: str | None) -> ScatterNdReduction:
        found = lookup(reduction, ScatterNdReduction, _REDUCTION_ALIASES)
        if found is None:
            raise self._fail(
                AttributeValueError,
                f"unknown reduction {reduction!r} (None, Add, Mul, Max or Min)", op, name, "reduction",
            )
        return found

    def scatter_add(
        self, updates: int, indices: int, out_shape: Sequence[DimLike], axis: int = 0, *, name: str | None = None
    ) -> int:
        """Sum slices of `updates` into zeros of `out_shape` at `indices` along `axis`."""
        the_axis = self._signed_to_unsigned(axis, updates)
        dtype = self._nodes[updates].shape.dtype if self._is_node_id(updates) else DType.F32
        declared = self._shape_arg(out_shape, dtype, "ScatterAdd", name)
        return self.add_node(ScatterAdd(the_axis), [updates, indices], declared, name=name)

    def scatter_nd(
        self, data: int, indices: int, updates: int, reduction: ScatterNdReduction | str = "None",
        *, name: str | None = None,
    ) -> int:
        """ONNX ScatterND: `out = data`, then `out[indices[p]] = / += / *= / max / min updates[p]`."""
        op = ScatterNd(self._reduction(reduction, "ScatterNd", name))
        return self.add_node(op, [data, indices, updates], name=name)

    def scatter_elements(
        self, data: int, indices: int, updates: int, axis: int = 0, reduction: ScatterNdReduction | str = "None",
        *, name: str | None = None,
    ) -> int:
        """ONNX ScatterElements along `axis` (negative counts from the end)."""
        op = ScatterElements(axis, self._reduction(reduction, "ScatterElements", name))
        return self.add_node(op, [data, indices, updates], name=name)

    def gather_nd(self, data: int, indices: int, batch_dims: int = 0, *, name: str | None = None) -> int:
        """ONNX GatherND: the slices of `data` addressed by the last dim of `indices`."""
        return self.add_node(GatherNd(batch_dims), [data, indices], name=name)

    def gather_elements(self, data: int, indices: int, axis: int = 0, *, name: str | None = None) -> int:
        """ONNX GatherElements (`np.take_along_axis` without broadcasting)."""
        return self.add_node(GatherElements(axis), [data, indices], name=name)


#: The ops of this family.
OPS = collect_ops(globals())

REDUCTION = EnumCodec(ScatterNdReduction, "ScatterNdReduction")

#: Their JSON forms (newest upstream; 0.2.2 spelled ScatterAdd as the bare string "ScatterAdd",
#: which means axis 0).
JSON_FORMS = (
    # 0.2.2 spelled ScatterAdd as the bare variant name, meaning axis 0.
    struct_form(ScatterAdd, ("axis", USIZE), newest_fields=(("axis", 0),), legacy_unit=True),
    struct_form(ScatterNd, ("reduction", REDUCTION), since=NEWEST),
    struct_form(ScatterElements, ("axis", I32), ("reduction", REDUCTION), since=NEWEST),
    struct_form(GatherNd, ("batch_dims", I32), since=NEWEST),
    struct_form(GatherElements, ("axis", I32), since=NEWEST),
)

__all__ = [
    "F32_EXACT_INDEX_LIMIT",
    "GatherElements",
    "GatherNd",
    "ScatterAdd",
    "ScatterBuilder",
    "ScatterElements",
    "ScatterNd",
    "ScatterNdReduction",
]
