"""Leaf ops: run-time inputs, named weights and constants (spec section 3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from rlx_mil.errors import AttributeValueError, DTypeError, ShapeError
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import LeafOp, Op, collect_ops
from rlx_mil.ir.serde.codecs import (
    STR,
    USIZE,
    VecCodec,
    struct_form,
)
from rlx_mil.ir.shape import DimLike, Shape, Static
from rlx_mil.ir.shape_checks import (
    numel,
)


@dataclass(frozen=True)
class Input(LeafOp):
    type_name: ClassVar[str] = "Input"
    name: str


@dataclass(frozen=True)
class Param(LeafOp):
    type_name: ClassVar[str] = "Param"
    name: str


@dataclass(frozen=True)
class Constant(LeafOp):
    """Raw little-endian bytes of the declared dtype, row-major."""

    type_name: ClassVar[str] = "Constant"
    data: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.data, bytes):
            try:
                object.__setattr__(self, "data", bytes(self.data))
            except (TypeError, ValueError):
                raise AttributeValueError(
                    f"data must be bytes (or byte values 0..255), got {type(self.data).__name__}",
                    op=self.type_name, operand="data",
                ) from None


# -------------------------------------------------------------------------------- shape rules


def declared_leaf(op: Op, declared: Shape | None) -> None:
    if declared is None:
        raise ShapeError(f"{op.type_name} nodes need a declared shape (nothing to infer it from)")


@shape_rule(Input)
def _input(op: Input, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    declared_leaf(op, declared)
    return None


@shape_rule(Param)
def _param(op: Param, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    declared_leaf(op, declared)
    return None


@shape_rule(Constant)
def _constant(op: Constant, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    declared_leaf(op, declared)
    assert declared is not None
    if declared.dtype.is_complex:
        raise DTypeError(f"{declared.dtype.value} constants are outside the rlx_mil IR subset")
    n = numel(declared.dims)
    if n is not None and len(op.data) != n * declared.dtype.itemsize:
        raise AttributeValueError(
            f"data holds {len(op.data)} bytes but {declared} needs {n} x {declared.dtype.itemsize}"
            f" = {n * declared.dtype.itemsize}",
            operand="data",
        )
    return None


# -------------------------------------------------------------------------------- builder


class LeafBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def input(self, name: str, shape: Sequence[DimLike] | Shape, dtype: DType | str = "f32") -> int:
        """A tensor fed at run time (`Input`); the node is named `name`."""
        return self.add_node(Input(name), [], self._shape_arg(shape, dtype, "Input", name), name=name)

    def param(self, name: str, shape: Sequence[DimLike] | Shape, dtype: DType | str = "f32") -> int:
        """A weight bound by name before running (`Param`); the node is named `name`."""
        return self.add_node(Param(name), [], self._shape_arg(shape, dtype, "Param", name), name=name)

    def constant(self, array: object, dtype: DType | str | None = None, name: str | None = None) -> int:
        """A `Constant` holding `array` as little-endian bytes of `dtype`.

        Without `dtype`, NumPy arrays keep their dtype; plain Python data becomes F32 when it
        holds floats (pyrlx's default) and keeps NumPy's choice otherwise.
        """
        values = np.asarray(array)
        if dtype is None:
            if not isinstance(array, (np.ndarray, np.generic)) and values.dtype == np.float64:
                the_dtype = DType.F32
            else:
                the_dtype = self._dtype_arg(values.dtype, "Constant", name)
        else:
            the_dtype = self._dtype_arg(dtype, "Constant", name)
        data = self._encode(values, the_dtype, name)
        return self.add_node(Constant(data), [], Shape(tuple(Static(s) for s in values.shape), the_dtype), name=name)

    def _encode(self, values: np.ndarray, dtype: DType, name: str | None) -> bytes:
        if dtype.is_complex:
            raise self._fail(DTypeError, f"{dtype.value} constants are outside the rlx_mil IR subset", "Constant", name)
        if values.dtype.kind not in "biuf":
            raise self._fail(DTypeError, f"cannot store {values.dtype} values in a constant", "Constant", name)
        if dtype is DType.BOOL:
            return (values != 0).astype(np.uint8).tobytes()
        if dtype is DType.BF16:
            return _bf16_bytes(values.astype(np.float32))
        target = dtype.numpy.newbyteorder("<")
        if dtype.is_int:
            info = np.iinfo(target)
            with np.errstate(invalid="ignore"):
                exact = np.all(np.isfinite(values)) and np.all(values == np.trunc(values))
            if not exact or (values.size and (values.min() < info.min or values.max() > info.max)):
                raise self._fail(
                    AttributeValueError, f"values do not fit {dtype.value} exactly", "Constant", name, "data"
                )
        return np.ascontiguousarray(values.astype(target)).tobytes()


def _bf16_bytes(values: np.ndarray) -> bytes:
    """Little-endian bfloat16 bytes, rounding float32 to nearest-even (NaN stays quiet NaN)."""
    bits = np.ascontiguousarray(values, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = np.where(is_nan, (bits >> 16) | 0x0040, rounded)
    return rounded.astype("<u2").tobytes()

#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    struct_form(Input, ("name", STR)),
    struct_form(Param, ("name", STR)),
    struct_form(Constant, ("data", VecCodec(USIZE)))  # the reader decodes the payload itself,
)
