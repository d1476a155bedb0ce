"""Shared hypothesis strategies for IR shapes, dtypes, axes and attention layouts.

Sizes stay small so that tests building zero arrays or running reference kernels stay fast.
Import from test modules as ``from strategies import ...`` (pytest puts ``tests/`` on
``sys.path`` because ``tests/conftest.py`` lives there).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlx_mil.ir.dtype import DType
from rlx_mil.ir.shape import Shape

#: Every dtype of the IR subset (the complex types are outside it).
ALL_DTYPES: tuple[DType, ...] = tuple(d for d in DType if not d.is_complex)
FLOAT_DTYPES: tuple[DType, ...] = (DType.F32, DType.F16, DType.BF16, DType.F64)
INT_DTYPES: tuple[DType, ...] = (DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U32)


def dtypes() -> st.SearchStrategy[DType]:
    return st.sampled_from(ALL_DTYPES)


def float_dtypes() -> st.SearchStrategy[DType]:
    return st.sampled_from(FLOAT_DTYPES)


def int_dtypes() -> st.SearchStrategy[DType]:
    return st.sampled_from(INT_DTYPES)


def dims(min_rank: int = 0, max_rank: int = 4, min_side: int = 1, max_side: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """A static shape as a tuple of ints."""
    return hnp.array_shapes(min_dims=min_rank, max_dims=max_rank, min_side=min_side, max_side=max_side)


def shapes(
    min_rank: int = 0, max_rank: int = 4, min_side: int = 1, max_side: int = 4, dtype: st.SearchStrategy[DType] | None = None
) -> st.SearchStrategy[Shape]:
    """An IR Shape (static dims) with a dtype drawn from `dtype` (default F32)."""
    dtype_strategy = dtype if dtype is not None else st.just(DType.F32)
    return st.builds(Shape.of, dims(min_rank, max_rank, min_side, max_side), dtype_strategy)


def broadcastable(num_shapes: int, min_rank: int = 0, max_rank: int = 4, max_side: int = 4) -> st.SearchStrategy[tuple[tuple[int, ...], ...]]:
    """`num_shapes` shapes that broadcast together under NumPy rules."""
    return hnp.mutually_broadcastable_shapes(
        num_shapes=num_shapes, min_dims=min_rank, max_dims=max_rank, min_side=1, max_side=max_side
    ).map(lambda b: tuple(b.input_shapes))


@st.composite
def axis_of(draw: st.DrawFn, rank: int, signed: bool = True) -> int:
    """An in-range axis for `rank` (negative too when `signed`)."""
    low = -rank if signed else 0
    return draw(st.integers(low, rank - 1))


@st.composite
def axis_subsets(draw: st.DrawFn, rank: int) -> tuple[int, ...]:
    """A non-empty set of distinct non-negative axes, in random order."""
    chosen = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
    return tuple(chosen)


def permutations_of(rank: int) -> st.SearchStrategy[tuple[int, ...]]:
    return st.permutations(list(range(rank))).map(tuple)


@st.composite
def factorizations(draw: st.DrawFn, total: int, max_rank: int = 4) -> tuple[int, ...]:
    """A shape whose element count is `total` (a random split into factors)."""
    out: list[int] = []
    rest = total
    for _ in range(draw(st.integers(0, max_rank - 1))):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        d = draw(st.sampled_from(divisors))
        out.append(d)
        rest //= d
    out.append(rest)
    return tuple(draw(st.permutations(out)))


@dataclass(frozen=True)
class AttentionCase:
    """q/k/v dims for one attention layout (`bhsd`, `bshd`, `bsx` or `sx`), GQA included."""

    layout: str
    batch: int
    num_heads: int
    num_kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int

    def dims_of(self, heads: int, seq: int) -> tuple[int, ...]:
        b, d = self.batch, self.head_dim
        if self.layout == "bhsd":
            return (b, heads, seq, d)
        if self.layout == "bshd":
            return (b, seq, heads, d)
        if self.layout == "bsx":
            return (b, seq, heads * d)
        return (seq, heads * d)

    @property
    def q(self) -> tuple[int, ...]:
        return self.dims_of(self.num_heads, self.q_len)

    @property
    def k(self) -> tuple[int, ...]:
        return self.dims_of(self.num_kv_heads, self.kv_len)

    @property
    def v(self) -> tuple[int, ...]:
        return self.k


@st.composite
def attention_cases(draw: st.DrawFn, gqa: bool = True) -> AttentionCase:
    """A valid attention geometry. Rank-4 layouts avoid the ambiguous readings: BHSD needs
    k/v's head axis == num_heads only for q, so kv heads may differ; BSHD needs q's dim 1
    (the sequence) != num_heads, else upstream reads it as BHSD."""
    layout = draw(st.sampled_from(["bhsd", "bshd", "bsx", "sx"]))
    num_heads = draw(st.integers(1, 4))
    kv_choices = [h for h in range(1, num_heads + 1) if num_heads % h == 0] if gqa else [num_heads]
    num_kv_heads = draw(st.sampled_from(kv_choices))
    batch = 1 if layout == "sx" else draw(st.integers(1, 2))
    q_len = draw(st.integers(1, 5))
    if layout == "bshd" and q_len == num_heads:
        q_len += 1
    kv_len = draw(st.integers(1, 5))
    head_dim = draw(st.sampled_from([2, 4, 6]))
    return AttentionCase(layout, batch, num_heads, num_kv_heads, q_len, kv_len, head_dim)
