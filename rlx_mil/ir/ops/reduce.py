"""Reductions along axes: Softmax, Reduce, Cumsum, TopK (spec section 7)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import (
    AttributeValueError,
    DTypeError,
    ShapeError,
)
from rlx_mil.ir.builder import BuilderBase, lookup
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import (
    UnaryOp,
    collect_ops,
)
from rlx_mil.ir.serde.codecs import (
    BOOL,
    I32,
    USIZE,
    USIZE_VEC,
    EnumCodec,
    struct_form,
)
from rlx_mil.ir.serde.versions import NEWEST
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


@dataclass(frozen=True)
class _CumulativeOp(UnaryOp):
    """Scan along `axis` (negative counts from the end); `exclusive` shifts right by one and
    starts from the identity (1 for CumProd, -inf for CumMax)."""

    axis: int
    exclusive: bool


@dataclass(frozen=True)
class CumProd(_CumulativeOp):
    type_name: ClassVar[str] = "CumProd"


@dataclass(frozen=True)
class CumMax(_CumulativeOp):
    """Running NaN-ignoring maximum (`np.fmax.accumulate`)."""

    type_name: ClassVar[str] = "CumMax"


@dataclass(frozen=True)
class _ArgReduceOp(UnaryOp):
    """Index of the extreme value along `axis` as an F32 value (first index wins ties; NaN is
    skipped unless it is the first element)."""

    axis: int
    keep_dim: bool


@dataclass(frozen=True)
class ArgMax(_ArgReduceOp):
    type_name: ClassVar[str] = "ArgMax"


@dataclass(frozen=True)
class ArgMin(_ArgReduceOp):
    type_name: ClassVar[str] = "ArgMin"


@dataclass(frozen=True)
class _SortOp(UnaryOp):
    """Stable sort of every line along `axis`; equal values keep ascending index order in both
    directions; NaN sorts last."""

    axis: int
    descending: bool


@dataclass(frozen=True)
class Sort(_SortOp):
    type_name: ClassVar[str] = "Sort"


@dataclass(frozen=True)
class ArgSort(_SortOp):
    """The permutation Sort applies, as F32 indices."""

    type_name: ClassVar[str] = "ArgSort"


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
    if dtype is DType.BOOL or dtype.is_complex:
        raise DTypeError(f"TopK indices cannot be {dtype.value}")
    return Shape((*x.dims[:-1], Static(k)), dtype)


def _cumulative(op: CumProd | CumMax, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    normalize_axis(op.axis, ins[0].rank)
    return ins[0]


shape_rule(CumProd)(_cumulative)
shape_rule(CumMax)(_cumulative)


def _arg_reduce(op: ArgMax | ArgMin, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    axis = unsigned_axis(op.axis, x.rank)
    if x.dims[axis] == Static(0):
        raise ShapeError(f"{op.type_name} over the empty axis {axis} of x {x} has no answer", operand="x")
    if x.dtype.is_complex:
        raise DTypeError(f"{op.type_name} cannot order complex values", operand="x")
    dims = list(x.dims)
    if op.keep_dim:
        dims[axis] = Static(1)
    else:
        del dims[axis]
    return Shape(tuple(dims), DType.F32)


shape_rule(ArgMax)(_arg_reduce)
shape_rule(ArgMin)(_arg_reduce)


def _sort(op: Sort | ArgSort, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    unsigned_axis(op.axis, x.rank)
    if x.dtype.is_complex:
        raise DTypeError(f"{op.type_name} cannot order complex values", operand="x")
    return x if isinstance(op, Sort) else x.with_dtype(DType.F32)


shape_rule(Sort)(_sort)
shape_rule(ArgSort)(_sort)


# -------------------------------------------------------------------------------- builder


REDUCE_ALIASES = {"avg": ReduceOp.MEAN, "average": ReduceOp.MEAN}


class ReduceBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def cumprod(self, x: int, axis: int, exclusive: bool = False, *, name: str | None = None) -> int:
        return self.add_node(CumProd(axis, exclusive), [x], name=name)

    def cummax(self, x: int, axis: int, exclusive: bool = False, *, name: str | None = None) -> int:
        """Running NaN-ignoring maximum along `axis`."""
        return self.add_node(CumMax(axis, exclusive), [x], name=name)

    def argmax(self, x: int, axis: int, keep_dim: bool = False, *, name: str | None = None) -> int:
        """Index (as F32) of the largest value along `axis`; ties go to the first index."""
        return self.add_node(ArgMax(self._signed_to_unsigned(axis, x), keep_dim), [x], name=name)

    def argmin(self, x: int, axis: int, keep_dim: bool = False, *, name: str | None = None) -> int:
        """Index (as F32) of the smallest value along `axis`; ties go to the first index."""
        return self.add_node(ArgMin(self._signed_to_unsigned(axis, x), keep_dim), [x], name=name)

    def sort(self, x: int, axis: int = -1, descending: bool = False, *, name: str | None = None) -> int:
        """Stable sort along `axis`."""
        return self.add_node(Sort(self._signed_to_unsigned(axis, x), descending), [x], name=name)

    def argsort(self, x: int, axis: int = -1, descending: bool = False, *, name: str | None = None) -> int:
        """The stable-sort permutation along `axis`, as F32 indices."""
        return self.add_node(ArgSort(self._signed_to_unsigned(axis, x), descending), [x], name=name)

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
OPS = collect_ops(globals())

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    struct_form(Softmax, ("axis", I32)),
    struct_form(Reduce, ("op", EnumCodec(ReduceOp, "ReduceOp")), ("axes", USIZE_VEC), ("keep_dim", BOOL)),
    struct_form(Cumsum, ("axis", I32), ("exclusive", BOOL)),
    struct_form(TopK, ("k", USIZE)),
    struct_form(CumProd, ("axis", I32), ("exclusive", BOOL), since=NEWEST),
    struct_form(CumMax, ("axis", I32), ("exclusive", BOOL), since=NEWEST),
    struct_form(ArgMax, ("axis", USIZE), ("keep_dim", BOOL), since=NEWEST),
    struct_form(ArgMin, ("axis", USIZE), ("keep_dim", BOOL), since=NEWEST),
    struct_form(Sort, ("axis", USIZE), ("descending", BOOL), since=NEWEST),
    struct_form(ArgSort, ("axis", USIZE), ("descending", BOOL), since=NEWEST),
)
