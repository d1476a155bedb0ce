"""Convolution and pooling over NC* layouts (spec section 11)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir.builder import BuilderBase, lookup
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import Op, UnaryOp
from rlx_mil.ir.ops.reduce import REDUCE_ALIASES, ReduceOp
from rlx_mil.ir.serde.codecs import (
    USIZE,
    USIZE_VEC,
    EnumCodec,
    struct_form,
)
from rlx_mil.ir.shape import Dim, Shape, Static
from rlx_mil.ir.shape_checks import (
    conflict,
    require_int,
    require_rank,
    size_of,
)


@dataclass(frozen=True)
class Conv(Op):
    type_name: ClassVar[str] = "Conv"
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int

    def arity(self) -> int | None:
        return 2

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "w")


@dataclass(frozen=True)
class Pool(UnaryOp):
    type_name: ClassVar[str] = "Pool"
    kind: ReduceOp
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]


# -------------------------------------------------------------------------------- shape rules


def _spatial_attr(values: Sequence[int], spatial: int, what: str, default: int | None) -> list[int]:
    if len(values) == 0 and default is not None:
        return [default] * spatial
    if len(values) != spatial:
        raise AttributeValueError(f"{what} needs {spatial} entries (one per spatial dim), got {list(values)}")
    return [require_int(v, what) for v in values]


def _window_out(size: Dim, kernel: int, stride: int, pad: int, dilation: int, axis: int) -> Dim:
    if not isinstance(size, Static):
        raise ShapeError(f"spatial dim {axis} of x must be static, got {size}", operand="x")
    span = dilation * (kernel - 1) + 1
    if size.size + 2 * pad < span:
        raise ShapeError(
            f"spatial dim {axis} of x (size {size.size}, padding {pad}) is smaller than the window {span}",
            operand="x",
        )
    return Static((size.size + 2 * pad - span) // stride + 1)


@shape_rule(Conv)
def _conv(op: Conv, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, w = ins
    require_rank(x, "x", minimum=3)
    spatial = x.rank - 2
    require_rank(w, "w", exact=(x.rank,))
    groups = require_int(op.groups, "groups", minimum=1)
    kernel = _spatial_attr(op.kernel_size, spatial, "kernel_size", None)
    stride = _spatial_attr(op.stride, spatial, "stride", 1)
    padding = _spatial_attr(op.padding, spatial, "padding", 0)
    dilation = _spatial_attr(op.dilation, spatial, "dilation", 1)
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise AttributeValueError("kernel_size, stride and dilation must be >= 1 and padding >= 0")
    if any(conflict(w.dims[2 + i], Static(kernel[i])) for i in range(spatial)):
        raise ShapeError(f"w {w} spatial dims differ from kernel_size {kernel}", operand="w")
    c_in, c_out, w_in = size_of(x.dims[1]), size_of(w.dims[0]), size_of(w.dims[1])
    if c_in is not None and w_in is not None and c_in != w_in * groups:
        raise ShapeError(f"x has C_in={c_in} channels but w {w} expects {w_in} x groups={groups}", operand="w")
    if c_out is not None and c_out % groups:
        raise AttributeValueError(f"C_out={c_out} of w {w} is not divisible by groups={groups}", operand="w")
    out = [_window_out(x.dims[2 + i], kernel[i], stride[i], padding[i], dilation[i], 2 + i) for i in range(spatial)]
    return Shape((x.dims[0], w.dims[0], *out), x.dtype)


@shape_rule(Pool)
def _pool(op: Pool, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    require_rank(x, "x", minimum=3)
    spatial = x.rank - 2
    kernel = _spatial_attr(op.kernel_size, spatial, "kernel_size", None)
    stride = _spatial_attr(op.stride, spatial, "stride", None)
    padding = _spatial_attr(op.padding, spatial, "padding", None)
    if min(kernel) < 1 or min(stride) < 1 or min(padding) < 0:
        raise AttributeValueError("kernel_size and stride must be >= 1 and padding >= 0")
    out = [_window_out(x.dims[2 + i], kernel[i], stride[i], padding[i], 1, 2 + i) for i in range(spatial)]
    return Shape((*x.dims[:2], *out), x.dtype)


# -------------------------------------------------------------------------------- builder


class ConvBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def conv(
        self,
        x: int,
        w: int,
        stride: int | Sequence[int] | None = None,
        padding: int | Sequence[int] | None = None,
        dilation: int | Sequence[int] | None = None,
        groups: int = 1,
        *,
        name: str | None = None,
    ) -> int:
        """NCHW cross-correlation (no bias); `kernel_size` is read from w's spatial dims."""
        w_dims = self._dims(w) or ()
        kernel = tuple(d.size if isinstance(d, Static) else -1 for d in w_dims[2:])
        spatial = len(kernel)
        op = Conv(
            kernel,
            per_axis(stride, 1, spatial),
            per_axis(padding, 0, spatial),
            per_axis(dilation, 1, spatial),
            groups,
        )
        return self.add_node(op, [x, w], name=name)

    def pool(
        self,
        x: int,
        kind: ReduceOp | str,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        padding: int | Sequence[int] | None = None,
        *,
        name: str | None = None,
    ) -> int:
        """Window reduction over the spatial dims of `[N, C, *spatial]`; `kind` like `"max"`,
        `"mean"`/`"avg"`. `stride` defaults to the kernel size, `padding` to 0."""
        the_kind = lookup(kind, ReduceOp, REDUCE_ALIASES)
        if the_kind is None:
            raise self._fail(AttributeValueError, f"unknown pool kind {kind!r}", "Pool", name)
        rank = self._rank(x)
        spatial = max(rank - 2, 0) if rank is not None else 0
        kernel = per_axis(kernel_size, 1, spatial)
        strides = kernel if stride is None else per_axis(stride, 1, spatial)
        return self.add_node(Pool(the_kind, kernel, strides, per_axis(padding, 0, spatial)), [x], name=name)


def per_axis(value: int | Sequence[int] | None, default: int, count: int) -> tuple[int, ...]:
    if value is None:
        return (default,) * count
    if isinstance(value, int):
        return (value,) * count
    return tuple(value)

#: The ops of this family.
OPS: tuple[type[Op], ...] = (Conv, Pool,)

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    struct_form(
        Conv,
        ("kernel_size", USIZE_VEC),
        ("stride", USIZE_VEC),
        ("padding", USIZE_VEC),
        ("dilation", USIZE_VEC),
        ("groups", USIZE),
    ),
    struct_form(
        Pool,
        ("kind", EnumCodec(ReduceOp, "ReduceOp")),
        ("kernel_size", USIZE_VEC),
        ("stride", USIZE_VEC),
        ("padding", USIZE_VEC),
    ),
)
