"""Data movement: Reshape, Transpose, Narrow, Concat, Expand, Gather (spec section 8)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import AttributeValueError, DTypeError, ShapeError
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import BinaryArityOp, Op, UnaryOp
from rlx_mil.ir.serde.codecs import (
    I64,
    USIZE,
    USIZE_VEC,
    VecCodec,
    struct_form,
)
from rlx_mil.ir.shape import ROWS, Dim, Dynamic, Shape, Static
from rlx_mil.ir.shape_checks import (
    conflict,
    is_int,
    numel,
    require_int,
    size_of,
    unsigned_axis,
)


@dataclass(frozen=True)
class Reshape(UnaryOp):
    type_name: ClassVar[str] = "Reshape"
    new_shape: tuple[int, ...]


@dataclass(frozen=True)
class Transpose(UnaryOp):
    type_name: ClassVar[str] = "Transpose"
    perm: tuple[int, ...]


@dataclass(frozen=True)
class Narrow(UnaryOp):
    type_name: ClassVar[str] = "Narrow"
    axis: int
    start: int
    len: int


@dataclass(frozen=True)
class Concat(Op):
    type_name: ClassVar[str] = "Concat"
    axis: int

    def arity(self) -> int | None:
        return None


@dataclass(frozen=True)
class Expand(UnaryOp):
    type_name: ClassVar[str] = "Expand"
    target_shape: tuple[int, ...]


@dataclass(frozen=True)
class Gather(BinaryArityOp):
    type_name: ClassVar[str] = "Gather"
    axis: int

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("table", "indices")


# -------------------------------------------------------------------------------- shape rules


@shape_rule(Reshape)
def _reshape(op: Reshape, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    new = list(op.new_shape)
    for v in new:
        if not is_int(v) or v < -1:
            raise AttributeValueError(f"new_shape entries must be integers >= -1, got {list(op.new_shape)}")
    if new.count(-1) > 1:
        raise AttributeValueError(f"new_shape may hold at most one -1, got {new}")
    known = math.prod(v for v in new if v != -1)
    total = numel(x.dims)
    dims: list[Dim] = [Static(v) for v in new if v != -1]
    if -1 in new:
        pos = new.index(-1)
        fill: Dim
        if total is None:
            symbols = {d.symbol for d in x.dims if isinstance(d, Dynamic)}
            fill = Dynamic(symbols.pop()) if len(symbols) == 1 else Dynamic(ROWS)
        else:
            if known == 0 or total % known != 0:
                raise ShapeError(f"cannot reshape {x} ({total} elements) into {new}", operand="x")
            fill = Static(total // known)
        dims.insert(pos, fill)
    elif total is not None and total != known:
        raise ShapeError(f"cannot reshape {x} ({total} elements) into {new} ({known} elements)", operand="x")
    return Shape(tuple(dims), x.dtype)


@shape_rule(Transpose)
def _transpose(op: Transpose, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    perm = list(op.perm)
    if not all(is_int(p) for p in perm) or sorted(perm) != list(range(x.rank)):
        raise AttributeValueError(f"perm {perm} is not a permutation of 0..{x.rank - 1} (x is {x})")
    return Shape(tuple(x.dims[p] for p in perm), x.dtype)


@shape_rule(Narrow)
def _narrow(op: Narrow, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    axis = unsigned_axis(op.axis, x.rank)
    start = require_int(op.start, "start", minimum=0)
    length = require_int(op.len, "len", minimum=0)
    size = size_of(x.dims[axis])
    if size is not None and start + length > size:
        raise AttributeValueError(
            f"start {start} + len {length} exceeds dim {axis} of x {x} (size {size})", operand="x"
        )
    dims = list(x.dims)
    dims[axis] = Static(length)
    return Shape(tuple(dims), x.dtype)


@shape_rule(Concat)
def _concat(op: Concat, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    first = ins[0]
    axis = unsigned_axis(op.axis, first.rank, operand="inputs[0]")
    total = 0
    dynamic_axis = False
    for i, s in enumerate(ins):
        operand = f"inputs[{i}]"
        if s.rank != first.rank:
            raise ShapeError(f"{operand} {s} must have rank {first.rank} like inputs[0] {first}", operand=operand)
        if s.dtype != first.dtype:
            raise DTypeError(f"{operand} is {s.dtype.value} but inputs[0] is {first.dtype.value}", operand=operand)
        for d in range(first.rank):
            if d != axis and conflict(s.dims[d], first.dims[d]):
                raise ShapeError(
                    f"{operand} {s} differs from inputs[0] {first} on dim {d} (concat axis is {axis})",
                    operand=operand,
                )
        size = size_of(s.dims[axis])
        if size is None:
            dynamic_axis = True
        else:
            total += size
    out_axis: Dim
    if not dynamic_axis:
        out_axis = Static(total)
    elif declared is not None and declared.rank == first.rank:
        out_axis = declared.dims[axis]
    else:
        raise ShapeError(f"the concat axis {axis} is dynamic; pass the output shape explicitly")
    dims = list(first.dims)
    dims[axis] = out_axis
    return Shape(tuple(dims), first.dtype)


@shape_rule(Expand)
def _expand(op: Expand, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    target = list(op.target_shape)
    for v in target:
        if not is_int(v) or v < -1:
            raise AttributeValueError(f"target_shape entries must be integers >= -1, got {target}")
    if len(target) < x.rank:
        raise ShapeError(f"cannot expand rank-{x.rank} x {x} to the lower rank {len(target)} of {target}", operand="x")
    padded: list[Dim] = [Static(1) for _ in range(len(target) - x.rank)]
    padded.extend(x.dims)
    dims: list[Dim] = []
    for i, (have, want) in enumerate(zip(padded, target, strict=True)):
        if want == -1:
            dims.append(have)
        elif have == Static(want) or have == Static(1) or isinstance(have, Dynamic):
            dims.append(Static(want))
        else:
            raise ShapeError(
                f"dim {i} of x {x} (left-padded to rank {len(target)}) is {have}; only size-1 dims can grow to {want}",
                operand="x",
            )
    return Shape(tuple(dims), x.dtype)


@shape_rule(Gather)
def _gather(op: Gather, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    table, indices = ins
    axis = unsigned_axis(op.axis, table.rank, operand="table")
    if indices.dtype is DType.C64:
        raise DTypeError("indices cannot be complex", operand="indices")
    return Shape((*table.dims[:axis], *indices.dims, *table.dims[axis + 1:]), table.dtype)


# -------------------------------------------------------------------------------- builder


class ShapeBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def reshape(self, x: int, new_shape: Sequence[int], *, name: str | None = None) -> int:
        """Row-major reshape; at most one -1 entry."""
        return self.add_node(Reshape(self._sequence(new_shape, "new_shape", "Reshape", name)), [x], name=name)

    def transpose(self, x: int, perm: Sequence[int], *, name: str | None = None) -> int:
        return self.add_node(Transpose(self._sequence(perm, "perm", "Transpose", name)), [x], name=name)

    def narrow(self, x: int, axis: int, start: int, length: int, *, name: str | None = None) -> int:
        """`x[..., start:start+length, ...]` along `axis`."""
        return self.add_node(Narrow(self._signed_to_unsigned(axis, x), start, length), [x], name=name)

    def concat(self, ids: Sequence[int], axis: int, *, name: str | None = None) -> int:
        ids = self._sequence(ids, "ids", "Concat", name)
        first = ids[0] if len(ids) else None
        return self.add_node(Concat(self._signed_to_unsigned(axis, first)), list(ids), name=name)

    def expand(self, x: int, target_shape: Sequence[int], *, name: str | None = None) -> int:
        """Broadcast to `target_shape` (left-padding with 1s; -1 keeps the input's dim)."""
        return self.add_node(Expand(self._sequence(target_shape, "target_shape", "Expand", name)), [x], name=name)

    def gather(self, table: int, indices: int, axis: int = 0, *, name: str | None = None) -> int:
        """`np.take(table, indices, axis)`."""
        return self.add_node(Gather(self._signed_to_unsigned(axis, table)), [table, indices], name=name)


#: The ops of this family.
OPS: tuple[type[Op], ...] = (Reshape, Transpose, Narrow, Concat, Expand, Gather,)

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    struct_form(Reshape, ("new_shape", VecCodec(I64))),
    struct_form(Transpose, ("perm", USIZE_VEC)),
    struct_form(Narrow, ("axis", USIZE), ("start", USIZE), ("len", USIZE)),
    struct_form(Concat, ("axis", USIZE)),
    struct_form(Expand, ("target_shape", VecCodec(I64))),
    struct_form(Gather, ("axis", USIZE)),
)
