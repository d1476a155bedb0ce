"""Random: RngNormal, RngUniform, Sample (spec part 2, section 8).

RngNormal/RngUniform fill their declared shape from upstream's Philox stream seeded with
`combine_seed(42, key)`; the optional input is a shape template whose values are never
read. Sample draws one token id per row of logits `[V]` or `[B, V]` after temperature,
top-k and top-p filtering. Core ML's random ops use their own generators: converted models
are distribution-equivalent, not bit-exact (see docs/indexing-quant-random.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import AttributeValueError, DTypeError, ShapeError
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import Op, UnaryOp, collect_ops, fix_f32
from rlx_mil.ir.serde.codecs import F32, U64_MAX, USIZE, OptionCodec, struct_form
from rlx_mil.ir.serde.versions import NEWEST
from rlx_mil.ir.shape import DimLike, Shape, Static
from rlx_mil.ir.shape_checks import require_int, size_of

#: Upstream's default global RNG seed (`RngOptions::default()`), re-applied on every run.
GLOBAL_SEED = 42


def _check_u64(op: Op, name: str) -> None:
    value = getattr(op, name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U64_MAX:
        raise AttributeValueError(f"{name} must be a u64 (0 <= {name} < 2^64), got {value!r}", op=op.type_name)


class _Generator(Op):
    def arity(self) -> int | None:
        return 1

    def accepted_arities(self) -> tuple[int, ...]:
        return (0, 1)

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("template",) if count == 1 else ()


@dataclass(frozen=True)
class RngNormal(_Generator):
    type_name: ClassVar[str] = "RngNormal"
    mean: float
    scale: float
    key: int
    op_seed: float | None

    def __post_init__(self) -> None:
        super().__post_init__()
        fix_f32(self, "mean", "scale", "op_seed")
        _check_u64(self, "key")


@dataclass(frozen=True)
class RngUniform(_Generator):
    type_name: ClassVar[str] = "RngUniform"
    low: float
    high: float
    key: int
    op_seed: float | None

    def __post_init__(self) -> None:
        super().__post_init__()
        fix_f32(self, "low", "high", "op_seed")
        _check_u64(self, "key")


@dataclass(frozen=True)
class Sample(UnaryOp):
    type_name: ClassVar[str] = "Sample"
    top_k: int
    top_p: float
    temperature: float
    seed: int

    def __post_init__(self) -> None:
        super().__post_init__()
        fix_f32(self, "top_p", "temperature")
        _check_u64(self, "seed")

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("logits",)


# -------------------------------------------------------------------------------- shape rules


def _finite(op: Op, *names: str) -> None:
    for name in names:
        value = getattr(op, name)
        if value is not None and not math.isfinite(value):
            raise AttributeValueError(f"{name} must be finite, got {value}")


def _generated(op: _Generator, declared: Shape | None) -> Shape:
    if declared is None:
        raise ShapeError(f"{op.type_name} fills its declared shape; pass the output shape")
    if not declared.dtype.is_float:
        raise DTypeError(f"{op.type_name} produces floats, the declared dtype is {declared.dtype.value}")
    return declared


@shape_rule(RngNormal)
def _rng_normal(op: RngNormal, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    _finite(op, "mean", "scale", "op_seed")
    if op.scale < 0:
        raise AttributeValueError(f"scale must be >= 0, got {op.scale}")
    return _generated(op, declared)


@shape_rule(RngUniform)
def _rng_uniform(op: RngUniform, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    _finite(op, "low", "high", "op_seed")
    if op.high < op.low:
        raise AttributeValueError(f"high {op.high} is below low {op.low}")
    return _generated(op, declared)


@shape_rule(Sample)
def _sample(op: Sample, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    logits = ins[0]
    require_int(op.top_k, "top_k", minimum=0)
    _finite(op, "top_p", "temperature")
    if not logits.dtype.is_float:
        raise DTypeError(f"logits must be floats, got {logits.dtype.value}", operand="logits")
    if logits.rank not in (1, 2):
        raise ShapeError(f"logits must be [V] or [B, V], got {logits}", operand="logits")
    if size_of(logits.dims[-1]) == 0:
        raise ShapeError(f"logits {logits} have no tokens to sample from", operand="logits")
    rows = logits.dims[0] if logits.rank == 2 else Static(1)
    return Shape((rows,), DType.F32)


# -------------------------------------------------------------------------------- builder


class RngBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def rng_normal(
        self, shape: Sequence[DimLike], mean: float = 0.0, scale: float = 1.0, key: int = 0, *,
        template: int | None = None, op_seed: float | None = None, dtype: DType | str = "f32",
        name: str | None = None,
    ) -> int:
        """`mean + scale * N(0, 1)` filling `shape`, from the stream keyed by `key`."""
        declared = self._shape_arg(shape, dtype, "RngNormal", name)
        op = RngNormal(mean, scale, key, op_seed)
        return self.add_node(op, [] if template is None else [template], declared, name=name)

    def rng_uniform(
        self, shape: Sequence[DimLike], low: float = 0.0, high: float = 1.0, key: int = 0, *,
        template: int | None = None, op_seed: float | None = None, dtype: DType | str = "f32",
        name: str | None = None,
    ) -> int:
        """Uniform values in [low, high) filling `shape`, from the stream keyed by `key`."""
        declared = self._shape_arg(shape, dtype, "RngUniform", name)
        op = RngUniform(low, high, key, op_seed)
        return self.add_node(op, [] if template is None else [template], declared, name=name)

    def sample(
        self, logits: int, *, top_k: int = 0, top_p: float = 1.0, temperature: float = 1.0, seed: int = 0,
        name: str | None = None,
    ) -> int:
        """One token id (as F32) per row of `logits` after temperature, top-k, top-p."""
        return self.add_node(Sample(top_k, top_p, temperature, seed), [logits], name=name)


#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (`Sample` unchanged since 0.2.2).
JSON_FORMS = (
    struct_form(RngNormal, ("mean", F32), ("scale", F32), ("key", USIZE), ("op_seed", OptionCodec(F32)), since=NEWEST),
    struct_form(RngUniform, ("low", F32), ("high", F32), ("key", USIZE), ("op_seed", OptionCodec(F32)), since=NEWEST),
    struct_form(Sample, ("top_k", USIZE), ("top_p", F32), ("temperature", F32), ("seed", USIZE)),
)
