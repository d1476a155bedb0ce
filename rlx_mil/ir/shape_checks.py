"""Checks the shape rules of every op family share.

A dimension check only fails when it is provably wrong: two static sizes that differ.
Dynamic dims pass unless a rule needs their value. Errors carry `operand=` where one input is
at fault; the node is added by `Graph.add_node`.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlx_mil.errors import AttributeValueError, DTypeError, ShapeError
from rlx_mil.ir.shape import Dim, Shape, Static

Dims = tuple[Dim, ...]


def dims_text(dims: Sequence[Dim]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def size_of(d: Dim) -> int | None:
    return d.size if isinstance(d, Static) else None


def conflict(a: Dim, b: Dim) -> bool:
    """True when two dims are provably different (both static, unequal)."""
    return isinstance(a, Static) and isinstance(b, Static) and a.size != b.size


def numel(dims: Sequence[Dim]) -> int | None:
    n = 1
    for d in dims:
        if not isinstance(d, Static):
            return None
        n *= d.size
    return n


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def require_int(value: object, what: str, minimum: int | None = None) -> int:
    if not is_int(value):
        raise AttributeValueError(f"{what} must be an integer, got {value!r}")
    assert isinstance(value, int)
    if minimum is not None and value < minimum:
        raise AttributeValueError(f"{what} must be >= {minimum}, got {value}")
    return value


def require_rank(shape: Shape, operand: str, *, exact: Sequence[int] = (), minimum: int | None = None) -> None:
    if exact and shape.rank not in exact:
        want = " or ".join(str(r) for r in exact)
        raise ShapeError(f"{operand} must have rank {want}, got {shape}", operand=operand)
    if minimum is not None and shape.rank < minimum:
        raise ShapeError(f"{operand} must have rank >= {minimum}, got {shape}", operand=operand)


def require_dims(shape: Shape, expected: Sequence[Dim], operand: str, what: str) -> None:
    """`shape.dims` must be `expected` (dims that are dynamic on either side pass)."""
    if shape.rank != len(expected) or any(conflict(a, b) for a, b in zip(shape.dims, expected, strict=True)):
        raise ShapeError(f"{operand} must be {what} {dims_text(expected)}, got {shape}", operand=operand)


def require_numel(shape: Shape, expected: int | None, operand: str, what: str) -> None:
    n = numel(shape.dims)
    if expected is not None and n is not None and n != expected:
        raise ShapeError(f"{operand} must hold {what} = {expected} elements, got {shape} ({n})", operand=operand)


def normalize_axis(axis: int, rank: int, what: str = "axis", operand: str | None = None) -> int:
    """A signed (i32) axis mapped into [0, rank); AttributeValueError when out of range."""
    require_int(axis, what)
    if not -rank <= axis < rank:
        raise AttributeValueError(f"{what} {axis} is out of range for rank {rank}", operand=operand)
    return axis + rank if axis < 0 else axis


def unsigned_axis(axis: int, rank: int, what: str = "axis", operand: str | None = None) -> int:
    """A usize axis: must already be in [0, rank)."""
    require_int(axis, what)
    if not 0 <= axis < rank:
        raise AttributeValueError(f"{what} {axis} is out of range for rank {rank} (must be 0..{rank - 1})", operand=operand)
    return axis


def broadcast_pair(left: Sequence[Dim], right: Sequence[Dim], right_operand: str = "rhs") -> Dims:
    """NumPy broadcasting with the spec's dynamic-dim rule (section 1.4).

    `1` vs `d` gives `d`; equal dims give that dim; any other pairing involving a dynamic dim
    gives the left operand's dim. Two unequal static sizes, neither 1, are a ShapeError
    naming `right_operand`.
    """
    rank = max(len(left), len(right))
    padded_left: list[Dim | None] = [None] * (rank - len(left)) + list(left)
    padded_right: list[Dim | None] = [None] * (rank - len(right)) + list(right)
    out: list[Dim] = []
    for a, b in zip(padded_left, padded_right, strict=True):
        if a is None:
            assert b is not None
            out.append(b)
        elif b is None or b == Static(1) or a == b:
            out.append(a)
        elif a == Static(1):
            out.append(b)
        elif isinstance(a, Static) and isinstance(b, Static):
            raise ShapeError(
                f"cannot broadcast {dims_text(left)} with {right_operand} {dims_text(right)}",
                operand=right_operand,
            )
        else:
            out.append(a)
    return tuple(out)


def broadcast_all(named: Sequence[tuple[str, Sequence[Dim]]]) -> Dims:
    """Fold `broadcast_pair` left to right; the first operand's dims win dynamic ties."""
    result: Dims = tuple(named[0][1])
    for operand, dims in named[1:]:
        result = broadcast_pair(result, dims, operand)
    return result


def fits_into(small: Sequence[Dim], target: Sequence[Dim]) -> bool:
    """True when `small` broadcasts to `target` without changing it."""
    if len(small) > len(target):
        return False
    for a, b in zip(reversed(small), reversed(target), strict=False):
        if a != Static(1) and conflict(a, b):
            return False
    return True


def matmul_dims(a: Shape, b: Shape, a_operand: str = "lhs", b_operand: str = "rhs") -> Dims:
    """`[..., M, K] @ [..., K, N] -> [..., M, N]` with broadcast batch dims (spec 5.1)."""
    require_rank(a, a_operand, minimum=2)
    require_rank(b, b_operand, minimum=2)
    k_a, k_b = a.dims[-1], b.dims[-2]
    if k_a != k_b:
        raise ShapeError(
            f"contraction dims differ: {a_operand} {a} has K={k_a}, {b_operand} {b} has K={k_b}",
            operand=b_operand,
        )
    batch = broadcast_pair(a.dims[:-2], b.dims[:-2], b_operand)
    return (*batch, a.dims[-2], b.dims[-1])


def require_float(shape: Shape, operand: str, op_text: str) -> None:
    if not shape.dtype.is_float:
        raise DTypeError(f"{op_text} needs a float {operand}, got {shape.dtype.value}", operand=operand)


def leading_flattened(dims: Sequence[Dim], last: Dim) -> Dims | None:
    """`[prod(dims[:-1]), last]` when the leading dims are static (fusion passes' form)."""
    rows = numel(dims[:-1])
    return None if rows is None else (Static(rows), last)


def declared_or(inferred: Shape, declared: Shape | None, alternative: Dims | None) -> Shape:
    """The inferred shape, unless the declaration spells an accepted alternative layout."""
    if declared is not None and alternative is not None and declared.dims == alternative:
        return Shape(alternative, inferred.dtype)
    return inferred
