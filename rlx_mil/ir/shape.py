"""Dims and shapes (spec section 1.2). The dtype is part of the shape, as upstream."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rlx_mil.ir.dtype import DType

#: Well-known dynamic symbols (upstream rlx-ir/src/dynamic.rs).
BATCH, SEQ, ROWS, PAST_SEQ = 0, 1, 2, 3

#: Largest tensor, in elements, that conversion and the reference evaluator accept. MIL shape
#: and index operands (reshape, slice, tile, gather) are int32, so larger tensors cannot be
#: addressed; checking declared shapes against it fails fast instead of allocating.
MAX_TENSOR_ELEMENTS = 2**31 - 1


@dataclass(frozen=True)
class Static:
    """A dimension of known size."""

    size: int

    def __str__(self) -> str:
        return str(self.size)


@dataclass(frozen=True)
class Dynamic:
    """A dimension whose size is bound later. Equal symbols mean equal sizes."""

    symbol: int

    def __str__(self) -> str:
        return f"?{self.symbol}"


Dim = Static | Dynamic
DimLike = int | Static | Dynamic


def as_dim(value: DimLike) -> Dim:
    if isinstance(value, (Static, Dynamic)):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"a dim must be an int, Static or Dynamic, got {value!r}")
    if value < 0:
        raise ValueError(f"a static dim must be >= 0, got {value}")
    return Static(value)


@dataclass(frozen=True)
class Shape:
    """Dims plus element type. Rank 0 is a scalar."""

    dims: tuple[Dim, ...]
    dtype: DType = DType.F32

    @staticmethod
    def of(dims: Iterable[DimLike], dtype: DType | str = DType.F32) -> Shape:
        return Shape(tuple(as_dim(d) for d in dims), DType.parse(dtype))

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, Static) for d in self.dims)

    def sizes(self) -> tuple[int, ...]:
        """Static sizes; raises ValueError when a dim is dynamic."""
        out = []
        for d in self.dims:
            if not isinstance(d, Static):
                raise ValueError(f"shape {self} has a dynamic dim; bind it first")
            out.append(d.size)
        return tuple(out)

    def numel(self) -> int:
        n = 1
        for s in self.sizes():
            n *= s
        return n

    def with_dims(self, dims: Sequence[DimLike]) -> Shape:
        return Shape(tuple(as_dim(d) for d in dims), self.dtype)

    def with_dtype(self, dtype: DType) -> Shape:
        return Shape(self.dims, dtype)

    def same_elements_as(self, other: Shape) -> bool:
        """Shape equality where `[]` and `[1]` count as equal (verifier rule)."""
        if self.dtype != other.dtype:
            return False
        if self.dims == other.dims:
            return True
        scalarish = ((), (Static(1),))
        return self.dims in scalarish and other.dims in scalarish

    def __str__(self) -> str:
        return f"{self.dtype.value}[{', '.join(str(d) for d in self.dims)}]"
