"""Rows moved along a sequence axis: KvAppend (one row written into a KV cache) and Roll (cyclic
shift). Both exist only in the newest upstream JSON (spec part 2, section 1.11); their contract
is upstream's `kv_append_shape` and `lower_kv_append` / `lower_roll` rewrites."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import AttributeValueError, DTypeError, ShapeError
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import BinaryArityOp, UnaryOp, collect_ops
from rlx_mil.ir.serde.codecs import I64, USIZE, USIZE_VEC, VecCodec, struct_form
from rlx_mil.ir.serde.versions import NEWEST
from rlx_mil.ir.shape import Shape, Static
from rlx_mil.ir.shape_checks import conflict, require_int, unsigned_axis


@dataclass(frozen=True)
class KvAppend(BinaryArityOp):
    """`row` (one step along `axis`) written into `cache` at index `pos`; the result is the
    `[..pos+1]` prefix: `concat(cache[..pos], row)` along `axis`. Upstream's native kernels
    alias the cache buffer; the value is the same."""

    type_name: ClassVar[str] = "KvAppend"
    axis: int
    pos: int

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("cache", "row")


@dataclass(frozen=True)
class Roll(UnaryOp):
    """`np.roll(x, shift, dim)` for each `(shift, dim)` pair in order: `out[i] = x[(i - k) mod n]`."""

    type_name: ClassVar[str] = "Roll"
    shifts: tuple[int, ...]
    dims: tuple[int, ...]


# -------------------------------------------------------------------------------- shape rules


@shape_rule(KvAppend)
def _kv_append(op: KvAppend, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    cache, row = ins
    axis = unsigned_axis(op.axis, cache.rank, "axis", operand="cache")
    pos = require_int(op.pos, "pos", minimum=0)
    if row.rank != cache.rank:
        raise ShapeError(f"row {row} must have the cache's rank {cache.rank} (one step of the cache)", operand="row")
    if row.dtype is not cache.dtype:
        raise DTypeError(f"row is {row.dtype.value} but the cache is {cache.dtype.value}", operand="row")
    capacity = cache.dims[axis]
    if isinstance(capacity, Static) and pos >= capacity.size:
        raise AttributeValueError(
            f"pos {pos} is past the cache's axis-{axis} capacity {capacity.size} (size the cache to its capacity)"
        )
    if conflict(row.dims[axis], Static(1)):
        raise ShapeError(f"row {row} must be one step (size 1) along axis {axis}", operand="row")
    for i, (c, r) in enumerate(zip(cache.dims, row.dims, strict=True)):
        if i != axis and conflict(c, r):
            raise ShapeError(f"row {row} differs from the cache {cache} in dim {i}", operand="row")
    return Shape((*cache.dims[:axis], Static(pos + 1), *cache.dims[axis + 1:]), cache.dtype)


@shape_rule(Roll)
def _roll(op: Roll, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    if len(op.shifts) != len(op.dims):
        raise AttributeValueError(f"shifts ({len(op.shifts)}) and dims ({len(op.dims)}) must pair up")
    for shift, dim in zip(op.shifts, op.dims, strict=True):
        require_int(shift, "shifts")
        unsigned_axis(dim, x.rank, "dims", operand="x")
        if not isinstance(x.dims[dim], Static):
            raise ShapeError(f"rolled dim {dim} of x {x} must be static", operand="x")
    return x


# -------------------------------------------------------------------------------- builder


class SequenceBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def kv_append(self, cache: int, row: int, axis: int, pos: int, *, name: str | None = None) -> int:
        """`cache[..pos]` followed by `row` along `axis` (the cache after writing row `pos`)."""
        return self.add_node(KvAppend(axis, pos), [cache, row], name=name)

    def roll(self, x: int, shifts: Sequence[int], dims: Sequence[int], *, name: str | None = None) -> int:
        """Cyclic shift of `x` by each `shifts[i]` along `dims[i]`."""
        op = Roll(self._sequence(shifts, "shifts", "Roll", name), self._sequence(dims, "dims", "Roll", name))
        return self.add_node(op, [x], name=name)


#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (newest upstream only).
JSON_FORMS = (
    struct_form(KvAppend, ("axis", USIZE), ("pos", USIZE), since=NEWEST),
    struct_form(Roll, ("shifts", VecCodec(I64)), ("dims", USIZE_VEC), since=NEWEST),
)
