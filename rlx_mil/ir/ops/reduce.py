"""Reductions along axes: Softmax, Reduce, Cumsum, TopK (spec section 7)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import AttributeValueError, DTypeError
from rlx_mil.ir.builder import BuilderBase, lookup
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import Op, UnaryOp
from rlx_mil.ir.serde.codecs import (
    BOOL,
    I32,
    USIZE,
    USIZE_VEC,
    EnumCodec,
    struct_form,
)
from rlx_mil.ir.shape import Shape, Static
from rlx_mil.ir.shape_checks import (
    Dims,
    normalize_axis,
    require_int,
    require_rank,
    size_of,
    unsigned_axis,
)


class ReduceOp(enum.Enum):
    SUM = "Sum"
    MEAN = "Mean"
    MAX = "Max"
    MIN = "Min"
    PROD = "Prod"


@dataclass(frozen=True)
class Softmax(UnaryOp):
    type_name: ClassVar[str] = "Softmax"
    axis: int


@dataclass(frozen=True)
class Reduce(UnaryOp):
    type_name: ClassVar[str] = "Reduce"
    op: ReduceOp
    axes: tuple[int, ...]
    keep_dim: bool


@dataclass(frozen=True)
class Cumsum(UnaryOp):
    type_name: ClassVar[str] = "Cumsum"
    axis: int
    exclusive: bool


@dataclass(frozen=True)
class TopK(UnaryOp):
    type_name: ClassVar[str] = "TopK"
    k: int


# -------------------------------------------------------------------------------- shape rules


@shape_rule(Softmax)
def _softmax(op: Softmax, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    normalize_axis(op.axis, ins[0].rank)
    return ins[0]


@shape_rule(Cumsum)
def _cumsum(op: Cumsum, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    normalize_axis(op.axis, ins[0].rank)
    return ins[0]


@shape_rule(Reduce)
def _reduce(op: Reduce, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    if not op.axes:
        raise AttributeValueError("axes must not be empty")
    for axis in op.axes:
        unsigned_axis(axis, x.rank, "reduce axis")
    if len(set(op.axes)) != len(op.axes):
        raise AttributeValueError(f"axes must be unique, got {list(op.axes)}")
    reduced = set(op.axes)
    if op.keep_dim:
        dims: Dims = tuple(Static(1) if i in reduced else d for i, d in enumerate(x.dims))
    else:
        dims = tuple(d for i, d in enumerate(x.dims) if i not in reduced)
    return Shape(dims, x.dtype)


@shape_rule(TopK)
def _topk(op: TopK, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    require_rank(x, "x", minimum=1)
    k = require_int(op.k, "k", minimum=1)
    n = size_of(x.dims[-1])
    if n is not None and k > n:
        raise AttributeValueError(f"k={k} exceeds the last dim {n} of x {x}", operand="x")
    dtype = declared.dtype if declared is not None else DType.F32
    if dtype in (DType.BOOL, DType.C64):
        raise DTypeError(f"TopK indices cannot be {dtype.value}")
    return Shape((*x.dims[:-1], Static(k)), dtype)


# -------------------------------------------------------------------------------- builder


REDUCE_ALIASES = {"avg": ReduceOp.MEAN, "average": ReduceOp.MEAN}


class ReduceBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def softmax(self, x: int, axis: int = -1, *, name: str | None = None) -> int:
        return self.add_node(Softmax(axis), [x], name=name)

    def reduce(
        self,
        x: int,
        op: ReduceOp | str,
        axes: int | Sequence[int],
        keep_dim: bool = False,
        *,
        name: str | None = None,
    ) -> int:
        """`Reduce(op)` over `axes` (negative axes count from the end)."""
        the_op = lookup(op, ReduceOp, REDUCE_ALIASES)
        if the_op is None:
            raise self._fail(AttributeValueError, f"unknown reduction {op!r}", "Reduce", name)
        axis_list = [axes] if isinstance(axes, int) else list(self._sequence(axes, "axes", "Reduce", name))
        the_axes = tuple(self._signed_to_unsigned(a, x) for a in axis_list)
        return self.add_node(Reduce(the_op, the_axes, keep_dim), [x], name=name)

    def sum(self, x: int, axes: int | Sequence[int], keep_dim: bool = False, *, name: str | None = None) -> int:
        """Sum reduction (pyrlx name); same as `reduce_sum`."""
        return self.reduce(x, ReduceOp.SUM, axes, keep_dim, name=name)

    def mean(self, x: int, axes: int | Sequence[int], keep_dim: bool = False, *, name: str | None = None) -> int:
        return self.reduce(x, ReduceOp.MEAN, axes, keep_dim, name=name)

    def max(self, x: int, axes: int | Sequence[int], keep_dim: bool = False, *, name: str | None = None) -> int:
        """Max *reduction* over `axes`; the element-wise maximum is `maximum`."""
        return self.reduce(x, ReduceOp.MAX, axes, keep_dim, name=name)

    def min(self, x: int, axes: int | Sequence[int], keep_dim: bool = False, *, name: str | None = None) -> int:
        """Min *reduction* over `axes`; the element-wise minimum is `minimum`."""
        return self.reduce(x, ReduceOp.MIN, axes, keep_dim, name=name)

    def prod(self, x: int, axes: int | Sequence[int], keep_dim: bool = False, *, name: str | None = None) -> int:
        return self.reduce(x, ReduceOp.PROD, axes, keep_dim, name=name)

    reduce_sum = sum

    reduce_mean = mean

    reduce_max = max

    reduce_min = min

    reduce_prod = prod

    def cumsum(self, x: int, axis: int, exclusive: bool = False, *, name: str | None = None) -> int:
        return self.add_node(Cumsum(axis, exclusive), [x], name=name)

    def topk(self, x: int, k: int, *, dtype: DType | str = "f32", name: str | None = None) -> int:
        """Indices of the `k` largest entries along the last axis, as `dtype` values."""
        the_dtype = self._dtype_arg(dtype, "TopK", name)
        declared = None
        dims = self._dims(x)
        if the_dtype is not DType.F32 and dims:
            declared = Shape((*dims[:-1], Static(k) if isinstance(k, int) and k >= 0 else dims[-1]), the_dtype)
        return self.add_node(TopK(k), [x], declared, name=name)


#: The ops of this family.
OPS: tuple[type[Op], ...] = (Softmax, Reduce, Cumsum, TopK,)

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    struct_form(Softmax, ("axis", I32)),
    struct_form(Reduce, ("op", EnumCodec(ReduceOp, "ReduceOp")), ("axes", USIZE_VEC), ("keep_dim", BOOL)),
    struct_form(Cumsum, ("axis", I32), ("exclusive", BOOL)),
    struct_form(TopK, ("k", USIZE)),
)
