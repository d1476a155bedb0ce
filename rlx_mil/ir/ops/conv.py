"""Convolution and pooling over NC* layouts (spec section 11); the transposed, 3-D and fused
bias + activation convolutions of part-2 spec section 5."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir.builder import BuilderBase, lookup
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import Op, UnaryOp, collect_ops
from rlx_mil.ir.ops.elementwise import ACTIVATION, ActivationKind, activation_kind_arg
from rlx_mil.ir.ops.reduce import REDUCE_ALIASES, ReduceOp
from rlx_mil.ir.serde.codecs import (
    BOOL,
    USIZE,
    USIZE_VEC,
    EnumCodec,
    OptionCodec,
    struct_form,
)
from rlx_mil.ir.serde.versions import NEWEST
from rlx_mil.ir.shape import Dim, Shape, Static
from rlx_mil.ir.shape_checks import (
    conflict,
    require_dims,
    require_float,
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


@dataclass(frozen=True)
class ConvTranspose2d(Op):
    """PyTorch `conv_transpose2d` (no bias); w is `[C_in, C_out/groups, kH, kW]`."""

    type_name: ClassVar[str] = "ConvTranspose2d"
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    output_padding: tuple[int, ...]
    groups: int

    def arity(self) -> int | None:
        return 2

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "w")


@dataclass(frozen=True)
class Conv3d(Op):
    """PyTorch `conv3d` (no bias) on `[N, C, D, H, W]`; the kernel size is w's."""

    type_name: ClassVar[str] = "Conv3d"
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int

    def arity(self) -> int | None:
        return 2

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "w")


@dataclass(frozen=True)
class ConvTranspose3d(Op):
    """PyTorch `conv_transpose3d` (no bias); w is `[C_in, C_out/groups, kD, kH, kW]`."""

    type_name: ClassVar[str] = "ConvTranspose3d"
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    output_padding: tuple[int, ...]
    groups: int

    def arity(self) -> int | None:
        return 2

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "w")


@dataclass(frozen=True)
class FusedConvBiasAct(Op):
    """`act(conv(x, w) + bias (+ residual))`, the conv exactly as `Conv`."""

    type_name: ClassVar[str] = "FusedConvBiasAct"
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    activation: ActivationKind | None
    has_residual: bool

    def arity(self) -> int | None:
        return 4 if self.has_residual else 3

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "w", "bias", "residual") if self.has_residual else ("x", "w", "bias")


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


def _conv_shape(
    x: Shape, w: Shape, kernel_size: Sequence[int] | None, stride: Sequence[int], padding: Sequence[int],
    dilation: Sequence[int], groups_attr: int, spatial: int | None = None,
) -> Shape:
    """Conv's output shape; `kernel_size` None takes the kernel from w (which must be static)."""
    if spatial is None:
        require_rank(x, "x", minimum=3)
    else:
        require_rank(x, "x", exact=(spatial + 2,))
    spatial = x.rank - 2
    require_rank(w, "w", exact=(x.rank,))
    groups = require_int(groups_attr, "groups", minimum=1)
    # Conv's lists may be empty (the defaults); Conv3d's are fixed 3-element arrays.
    lenient = kernel_size is not None
    kernel = (
        _spatial_attr(kernel_size, spatial, "kernel_size", None)
        if kernel_size is not None else [_static_kernel(w, i) for i in range(spatial)]
    )
    stride = _spatial_attr(stride, spatial, "stride", 1 if lenient else None)
    padding = _spatial_attr(padding, spatial, "padding", 0 if lenient else None)
    dilation = _spatial_attr(dilation, spatial, "dilation", 1 if lenient else None)
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


def _static_kernel(w: Shape, i: int) -> int:
    size = size_of(w.dims[2 + i])
    if size is None:
        raise ShapeError(f"w {w} needs static kernel dims (the kernel size is read from w)", operand="w")
    return size


@shape_rule(Conv)
def _conv(op: Conv, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return _conv_shape(ins[0], ins[1], op.kernel_size, op.stride, op.padding, op.dilation, op.groups)


@shape_rule(Conv3d)
def _conv3d(op: Conv3d, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return _conv_shape(ins[0], ins[1], None, op.stride, op.padding, op.dilation, op.groups, spatial=3)


@shape_rule(FusedConvBiasAct)
def _fused_conv_bias_act(op: FusedConvBiasAct, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    require_float(x, "x", "FusedConvBiasAct")
    if not isinstance(op.has_residual, bool):
        raise AttributeValueError(f"has_residual must be a bool, got {op.has_residual!r}")
    out = _conv_shape(x, ins[1], op.kernel_size, op.stride, op.padding, op.dilation, op.groups)
    require_dims(ins[2], (out.dims[1],), "bias", "[C_out] =")
    if op.has_residual:
        require_dims(ins[3], out.dims, "residual", "the conv output's shape")
    return out


def _conv_transpose_shape(
    x: Shape, w: Shape, spatial: int, kernel_size: Sequence[int] | None, stride: Sequence[int],
    padding: Sequence[int], dilation: Sequence[int], output_padding: Sequence[int], groups_attr: int,
) -> Shape:
    require_rank(x, "x", exact=(spatial + 2,))
    require_rank(w, "w", exact=(spatial + 2,))
    groups = require_int(groups_attr, "groups", minimum=1)
    kernel = (
        [_static_kernel(w, i) for i in range(spatial)]
        if kernel_size is None else _spatial_attr(kernel_size, spatial, "kernel_size", None)
    )
    stride = _spatial_attr(stride, spatial, "stride", None)
    padding = _spatial_attr(padding, spatial, "padding", None)
    dilation = _spatial_attr(dilation, spatial, "dilation", None)
    output_padding = _spatial_attr(output_padding, spatial, "output_padding", None)
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or min(output_padding) < 0:
        raise AttributeValueError("kernel_size, stride and dilation must be >= 1, padding and output_padding >= 0")
    if any(conflict(w.dims[2 + i], Static(kernel[i])) for i in range(spatial)):
        raise ShapeError(f"w {w} spatial dims differ from kernel_size {kernel}", operand="w")
    if conflict(w.dims[0], x.dims[1]):
        raise ShapeError(f"w {w} must be [C_in = {x.dims[1]}, C_out/groups, *kernel]", operand="w")
    c_in = size_of(x.dims[1])
    if c_in is not None and c_in % groups:
        raise AttributeValueError(f"C_in={c_in} of x {x} is not divisible by groups={groups}", operand="x")
    out: list[Dim] = []
    for i in range(spatial):
        size = x.dims[2 + i]
        if not isinstance(size, Static):
            raise ShapeError(f"spatial dim {2 + i} of x must be static, got {size}", operand="x")
        length = (size.size - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel[i] - 1) + output_padding[i] + 1
        if size.size < 1 or length < 1:
            raise ShapeError(
                f"spatial dim {2 + i} of x (size {size.size}) gives an empty output with padding {padding[i]}",
                operand="x",
            )
        out.append(Static(length))
    c_out = size_of(w.dims[1])
    return Shape((x.dims[0], Static(c_out * groups) if c_out is not None else w.dims[1], *out), x.dtype)


@shape_rule(ConvTranspose2d)
def _conv_transpose2d(op: ConvTranspose2d, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return _conv_transpose_shape(
        ins[0], ins[1], 2, op.kernel_size, op.stride, op.padding, op.dilation, op.output_padding, op.groups
    )


@shape_rule(ConvTranspose3d)
def _conv_transpose3d(op: ConvTranspose3d, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return _conv_transpose_shape(
        ins[0], ins[1], 3, None, op.stride, op.padding, op.dilation, op.output_padding, op.groups
    )


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

    def conv_transpose2d(
        self,
        x: int,
        w: int,
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        output_padding: int | Sequence[int] = 0,
        groups: int = 1,
        *,
        name: str | None = None,
    ) -> int:
        """PyTorch `conv_transpose2d` (no bias), w `[C_in, C_out/groups, kH, kW]`."""
        w_dims = self._dims(w) or ()
        kernel = tuple(d.size if isinstance(d, Static) else -1 for d in w_dims[2:])
        op = ConvTranspose2d(
            kernel, per_axis(stride, 1, 2), per_axis(padding, 0, 2), per_axis(dilation, 1, 2),
            per_axis(output_padding, 0, 2), groups,
        )
        return self.add_node(op, [x, w], name=name)

    def conv3d(
        self,
        x: int,
        w: int,
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        *,
        name: str | None = None,
    ) -> int:
        """PyTorch `conv3d` (no bias) on `[N, C, D, H, W]`, w `[C_out, C_in/groups, kD, kH, kW]`."""
        op = Conv3d(per_axis(stride, 1, 3), per_axis(padding, 0, 3), per_axis(dilation, 1, 3), groups)
        return self.add_node(op, [x, w], name=name)

    def conv_transpose3d(
        self,
        x: int,
        w: int,
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        output_padding: int | Sequence[int] = 0,
        groups: int = 1,
        *,
        name: str | None = None,
    ) -> int:
        """PyTorch `conv_transpose3d` (no bias), w `[C_in, C_out/groups, kD, kH, kW]`."""
        op = ConvTranspose3d(
            per_axis(stride, 1, 3), per_axis(padding, 0, 3), per_axis(dilation, 1, 3),
            per_axis(output_padding, 0, 3), groups,
        )
        return self.add_node(op, [x, w], name=name)

    def fused_conv_bias_act(
        self,
        x: int,
        w: int,
        bias: int,
        activation: ActivationKind | str | None = None,
        residual: int | None = None,
        stride: int | Sequence[int] | None = None,
        padding: int | Sequence[int] | None = None,
        dilation: int | Sequence[int] | None = None,
        groups: int = 1,
        *,
        name: str | None = None,
    ) -> int:
        """`act(conv(x, w) + bias (+ residual))`; `kernel_size` is read from w."""
        w_dims = self._dims(w) or ()
        kernel = tuple(d.size if isinstance(d, Static) else -1 for d in w_dims[2:])
        spatial = len(kernel)
        kind = None if activation is None else activation_kind_arg(self, activation, "FusedConvBiasAct", name)
        op = FusedConvBiasAct(
            kernel, per_axis(stride, 1, spatial), per_axis(padding, 0, spatial), per_axis(dilation, 1, spatial),
            groups, kind, residual is not None,
        )
        return self.add_node(op, [x, w, bias, *([] if residual is None else [residual])], name=name)


def per_axis(value: int | Sequence[int] | None, default: int, count: int) -> tuple[int, ...]:
    if value is None:
        return (default,) * count
    if isinstance(value, int):
        return (value,) * count
    return tuple(value)

#: The ops of this family.
OPS = collect_ops(globals())

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
    # In 0.2.2 and newest with the same fields.
    struct_form(
        ConvTranspose2d,
        ("kernel_size", USIZE_VEC),
        ("stride", USIZE_VEC),
        ("padding", USIZE_VEC),
        ("dilation", USIZE_VEC),
        ("output_padding", USIZE_VEC),
        ("groups", USIZE),
    ),
    # Newest upstream only; upstream's fixed [usize; 3] arrays are JSON arrays too.
    struct_form(
        Conv3d, ("stride", USIZE_VEC), ("padding", USIZE_VEC), ("dilation", USIZE_VEC), ("groups", USIZE), since=NEWEST
    ),
    struct_form(
        ConvTranspose3d,
        ("stride", USIZE_VEC),
        ("padding", USIZE_VEC),
        ("dilation", USIZE_VEC),
        ("output_padding", USIZE_VEC),
        ("groups", USIZE),
        since=NEWEST,
    ),
    struct_form(
        FusedConvBiasAct,
        ("kernel_size", USIZE_VEC),
        ("stride", USIZE_VEC),
        ("padding", USIZE_VEC),
        ("dilation", USIZE_VEC),
        ("groups", USIZE),
        ("activation", OptionCodec(ACTIVATION)),
        ("has_residual", BOOL),
        since=NEWEST,
    ),
)
