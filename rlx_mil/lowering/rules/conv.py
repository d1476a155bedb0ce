"""Conv and Pool over `[N, C, *spatial]` tensors with 1-3 spatial dims (spec section 11).

Attribute lists may be empty (stride and dilation 1, padding 0) or hold one value per spatial
dim; a single value for several dims applies to all of them, as the reference reads it.
Padding is symmetric. Pool padding never changes Max/Min/Sum/Prod (padded cells hold the
reduction's identity); Mean divides by the full kernel area, padded cells included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import product
from typing import Any

import numpy as np

from rlx_mil.errors import AttributeValueError, DTypeError, GraphError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.ops import ReduceOp
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.target import Target


def _mb() -> Any:
    from coremltools.converters.mil import Builder as mb

    return mb


def _fault(ctx: LowerContext, kind: type[GraphError], message: str, operand: str | None = None) -> GraphError:
    """A graph error naming this node, op and (where one is at fault) the operand."""
    return kind(message, node=ctx.node.id, op=ctx.op.type_name, name=ctx.node.name, operand=operand)


def _per_dim(ctx: LowerContext, values: Sequence[int], count: int, default: int | None, what: str) -> list[int]:
    if len(values) == 0 and default is not None:
        return [default] * count
    if len(values) == 1 and count > 1:
        return [int(values[0])] * count
    if len(values) != count:
        raise _fault(ctx, AttributeValueError, f"{what} {list(values)} needs one entry per spatial dim ({count})")
    return [int(v) for v in values]


def _spatial_rank(ctx: LowerContext) -> int:
    rank = len(ctx.input_shape(0).sizes())
    if not 3 <= rank <= 5:
        raise _fault(ctx, ShapeError, f"x must be [N, C, *spatial] with 1-3 spatial dims, got rank {rank}", "x")
    return rank - 2


def _check_window(ctx: LowerContext, kernel: list[int], stride: list[int], padding: list[int],
                  dilation: list[int]) -> None:
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise _fault(
            ctx, AttributeValueError,
            f"kernel {kernel}, stride {stride} and dilation {dilation} must be >= 1 and padding {padding} >= 0",
        )


def _pads(padding: list[int]) -> list[int]:
    """MIL `pad` lists before/after per spatial dim."""
    return [p for p in padding for _ in (0, 1)]


@lowering(
    notes=(
        "`conv` (1-D/2-D/3-D; strides, pad_type custom with symmetric pads, dilations, groups; no"
        " bias); a Param/Constant weight becomes a const; a run-time weight is passed as a tensor, its"
        " dilation spelled as zero taps (reshape/pad/slice_by_size) since Core ML's conv takes"
        " dilations only with const weights"
    ),
)
def lower_conv(op: ops.Conv, ctx: LowerContext) -> Any:
    return emit_conv(ctx, op.kernel_size, op.stride, op.padding, op.dilation, op.groups, name=ctx.name())


def emit_conv(
    ctx: LowerContext, kernel_size: Sequence[int], stride_attr: Sequence[int], padding_attr: Sequence[int],
    dilation_attr: Sequence[int], groups_attr: int, *, name: str, bias: np.ndarray | None = None,
) -> Any:
    """MIL `conv` of input 0 by weight input 1 after checking the geometry (empty attribute
    lists take the defaults); `bias` (known at conversion) goes into the conv."""
    spatial = _spatial_rank(ctx)
    w_sizes = ctx.input_shape(1).sizes()
    x_sizes = ctx.input_shape(0).sizes()
    if len(w_sizes) != spatial + 2:
        raise _fault(ctx, ShapeError, f"w must be [C_out, C_in/groups, *kernel] of rank {spatial + 2},"
                     f" got {list(w_sizes)}", "w")
    kernel = [int(k) for k in w_sizes[2:]]
    if kernel_size and _per_dim(ctx, kernel_size, spatial, None, "kernel_size") != kernel:
        raise _fault(ctx, ShapeError, f"kernel_size {list(kernel_size)} differs from w's spatial dims {kernel}", "w")
    stride = _per_dim(ctx, stride_attr, spatial, 1, "stride")
    padding = _per_dim(ctx, padding_attr, spatial, 0, "padding")
    dilation = _per_dim(ctx, dilation_attr, spatial, 1, "dilation")
    _check_window(ctx, kernel, stride, padding, dilation)
    groups = int(groups_attr)
    c_in, c_out = x_sizes[1], w_sizes[0]
    if groups < 1 or c_out % groups or w_sizes[1] * groups != c_in:
        raise _fault(
            ctx, AttributeValueError,
            f"groups={groups} must divide C_out={c_out}, and w's C_in/groups={w_sizes[1]} times groups must"
            f" equal C_in={c_in}", "w",
        )
    weight = ctx.var(1)
    if ctx.value(1) is None and max(dilation) > 1:
        # Core ML's conv takes dilations only with a const weight: spread the taps of a
        # run-time weight with zeros instead, which gives the same sums.
        weight = _dilate_weight(ctx, weight, kernel, dilation)
        dilation = [1] * spatial
    extra: dict[str, Any] = {} if bias is None else {"bias": bias.astype(ctx.float_dtype)}
    return _mb().conv(
        x=ctx.var(0), weight=weight, strides=stride, pad_type="custom", pad=_pads(padding),
        dilations=dilation, groups=groups, name=name, **extra,
    )


def _dilate_weight(ctx: LowerContext, weight: Any, kernel: list[int], dilation: list[int]) -> Any:
    """[C_out, C_in/g, *k] -> [C_out, C_in/g, *(d*(k-1)+1)] with d-1 zeros between taps. Each
    dilated axis is viewed as [before, k, 1, after] so no tensor exceeds Core ML's rank 5."""
    mb = _mb()
    for i, (k, d) in enumerate(zip(kernel, dilation, strict=True)):
        if d == 1 or k == 1:
            continue
        axis = 2 + i
        sizes = [int(s) for s in weight.shape]
        before, after = int(np.prod(sizes[:axis])), int(np.prod(sizes[axis + 1:]))
        taps = mb.reshape(x=weight, shape=[before, k, 1, after], name=ctx.name("taps"))
        gapped = mb.pad(x=taps, pad=np.array([0, d - 1, 0, 0], dtype=np.int32), mode="constant",
                        constant_val=ctx.scalar(0.0), name=ctx.name("taps_gap"))
        spread = mb.reshape(x=gapped, shape=[before, k * d, after], name=ctx.name("taps_spread"))
        span = d * (k - 1) + 1
        kept = mb.slice_by_size(x=spread, begin=[0, 0, 0], size=[before, span, after], name=ctx.name("taps_kept"))
        sizes[axis] = span
        weight = mb.reshape(x=kept, shape=sizes, name=ctx.name("dilated_w"))
    return weight


@lowering(
    notes=(
        "Max: `max_pool`; Mean: `avg_pool` with exclude_padding_from_average=False (divides by the"
        " full kernel area); Sum: `avg_pool` times the kernel area; Min: -max_pool(-x); Prod: one strided"
        " `slice_by_index` per kernel offset multiplied together (padding with 1 via `pad` first)"
    ),
)
def lower_pool(op: ops.Pool, ctx: LowerContext) -> Any:
    mb = _mb()
    spatial = _spatial_rank(ctx)
    if not op.kernel_size:
        raise _fault(ctx, AttributeValueError, "kernel_size must not be empty")
    kernel = _per_dim(ctx, op.kernel_size, spatial, None, "kernel_size")
    stride = _per_dim(ctx, op.stride, spatial, 1, "stride")
    padding = _per_dim(ctx, op.padding, spatial, 0, "padding")
    _check_window(ctx, kernel, stride, padding, [1] * spatial)
    x = ctx.var(0)
    window = {"kernel_sizes": kernel, "strides": stride, "pad_type": "custom", "pad": _pads(padding)}
    kind = op.kind
    if kind is ReduceOp.MAX:
        return mb.max_pool(x=x, **window, name=ctx.name())
    if kind is ReduceOp.MEAN:
        return mb.avg_pool(x=x, **window, exclude_padding_from_average=False, name=ctx.name())
    if kind is ReduceOp.SUM:
        mean = mb.avg_pool(x=x, **window, exclude_padding_from_average=False, name=ctx.name("mean"))
        return mb.mul(x=mean, y=ctx.scalar(float(np.prod(kernel))), name=ctx.name())
    if kind is ReduceOp.MIN:
        negated = mb.mul(x=x, y=ctx.scalar(-1.0), name=ctx.name("neg"))
        pooled = mb.max_pool(x=negated, **window, name=ctx.name("max"))
        return mb.mul(x=pooled, y=ctx.scalar(-1.0), name=ctx.name())
    if kind is ReduceOp.PROD:
        return _prod_pool(ctx, x, kernel, stride, padding)
    raise ctx.unsupported(f"pool kind {kind.value} has no lowering")


def _prod_pool(ctx: LowerContext, x: Any, kernel: list[int], stride: list[int], padding: list[int]) -> Any:
    """Product over each window as the product of kernel-area strided slices, one per offset
    inside the window (Core ML has no product pooling)."""
    mb = _mb()
    if any(padding):
        # `pad` lists the trailing dims it pads: exactly the spatial ones.
        x = mb.pad(x=x, pad=np.array(_pads(padding), dtype=np.int32), mode="constant",
                   constant_val=ctx.scalar(1.0), name=ctx.name("pad_ones"))
    sizes = [int(s) for s in x.shape]
    lead = sizes[:2]
    out = [(sizes[2 + i] - kernel[i]) // stride[i] + 1 for i in range(len(kernel))]
    result = None
    for offset in product(*(range(k) for k in kernel)):
        begin = [0, 0, *offset]
        end = [*lead, *(offset[i] + (out[i] - 1) * stride[i] + 1 for i in range(len(kernel)))]
        piece = mb.slice_by_index(
            x=x, begin=begin, end=end, stride=[1, 1, *stride], name=ctx.name("window"),
        )
        result = piece if result is None else mb.mul(x=result, y=piece, name=ctx.name("prod"))
    assert result is not None
    return result


# ---------------------------------------------------------------------------------- part-2 spec section 5


@lowering(
    notes=(
        "`conv` with 3 spatial dims (as Conv: custom symmetric pads, dilations, groups); a run-time"
        " weight with dilation takes Conv's zero-tap path"
    ),
)
def lower_conv3d(op: ops.Conv3d, ctx: LowerContext) -> Any:
    if len(ctx.input_shape(0).sizes()) != 5:
        raise _fault(ctx, ShapeError, f"x must be [N, C, D, H, W], got {list(ctx.input_shape(0).sizes())}", "x")
    return emit_conv(ctx, (), op.stride, op.padding, op.dilation, op.groups, name=ctx.name())


@lowering(
    notes=(
        "`conv` with the bias inside it when the bias is a Param/Constant (else `add` of the"
        " [C, 1, ...] bias), `add` residual, then the activation exactly as the Activation op lowers it"
    ),
)
def lower_fused_conv_bias_act(op: ops.FusedConvBiasAct, ctx: LowerContext) -> Any:
    from rlx_mil.lowering.rules.elementwise import float_activation

    mb = _mb()
    if not ctx.input_shape(0).dtype.is_float:
        raise _fault(ctx, DTypeError, f"x must be a float tensor, got {ctx.input_shape(0).dtype.value}", "x")
    c_out = int(ctx.input_shape(1).sizes()[0]) if ctx.input_shape(1).sizes() else 0
    bias_sizes = ctx.input_shape(2).sizes()
    if math.prod(bias_sizes) != c_out:
        raise _fault(ctx, ShapeError, f"bias must hold C_out = {c_out} values, got shape {list(bias_sizes)}", "bias")
    last = op.activation is None and not op.has_residual
    bias = ctx.value(2)
    if bias is not None:
        y = emit_conv(ctx, op.kernel_size, op.stride, op.padding, op.dilation, op.groups,
                      name=ctx.name() if last else ctx.name("conv"),
                      bias=np.asarray(bias, dtype=np.float32).reshape(c_out))
    else:
        y = emit_conv(ctx, op.kernel_size, op.stride, op.padding, op.dilation, op.groups, name=ctx.name("conv"))
        spatial = len(ctx.input_shape(0).sizes()) - 2
        shaped = mb.reshape(x=ctx.var(2), shape=[c_out] + [1] * spatial, name=ctx.name("bias_shape"))
        y = mb.add(x=y, y=shaped, name=ctx.name() if last else ctx.name("biased"))
    if op.has_residual:
        if tuple(ctx.input_shape(3).sizes()) != tuple(int(d) for d in y.shape):
            raise _fault(ctx, ShapeError, f"residual {list(ctx.input_shape(3).sizes())} must match the conv output"
                         f" {[int(d) for d in y.shape]}", "residual")
        y = mb.add(x=y, y=ctx.var(3), name=ctx.name() if op.activation is None else ctx.name("residual_sum"))
    if op.activation is not None:
        y = float_activation(ctx, op.activation, y)
    return y


def _lower_conv_transpose(
    ctx: LowerContext, spatial: int, kernel_size: Sequence[int], stride_attr: Sequence[int],
    padding_attr: Sequence[int], dilation_attr: Sequence[int], output_padding_attr: Sequence[int], groups_attr: int,
) -> Any:
    mb = _mb()
    x_sizes, w_sizes = ctx.input_shape(0).sizes(), ctx.input_shape(1).sizes()
    if len(x_sizes) != spatial + 2 or len(w_sizes) != spatial + 2:
        raise _fault(ctx, ShapeError, f"x and w must have rank {spatial + 2}, got {list(x_sizes)} and {list(w_sizes)}")
    kernel = [int(k) for k in w_sizes[2:]]
    if kernel_size and _per_dim(ctx, kernel_size, spatial, None, "kernel_size") != kernel:
        raise _fault(ctx, ShapeError, f"kernel_size {list(kernel_size)} differs from w's spatial dims {kernel}", "w")
    stride = _per_dim(ctx, stride_attr, spatial, None, "stride")
    padding = _per_dim(ctx, padding_attr, spatial, None, "padding")
    dilation = _per_dim(ctx, dilation_attr, spatial, None, "dilation")
    extra = _per_dim(ctx, output_padding_attr, spatial, None, "output_padding")
    _check_window(ctx, kernel, stride, padding, dilation)
    groups = int(groups_attr)
    if groups < 1 or x_sizes[1] % groups or w_sizes[0] != x_sizes[1] or min(extra) < 0:
        raise _fault(ctx, AttributeValueError, f"w {list(w_sizes)} must be [C_in={x_sizes[1]}, C_out/groups, *kernel],"
                     f" groups={groups} must divide C_in and output_padding {extra} be >= 0", "w")
    weight = ctx.var(1)
    if ctx.value(1) is None:
        ctx.require_target(Target.IOS17, "a run-time weight (conv_transpose takes only const weights before iOS17)")
        if max(dilation) > 1:
            weight = _dilate_weight(ctx, weight, kernel, dilation)
            dilation = [1] * spatial
    # The full result is cropped by `padding` at both ends and grown by `output_padding` at the
    # end: crop p - output_padding there, and where output_padding > p, pad the zeros no tap reaches.
    pads = [v for p, e in zip(padding, extra, strict=True) for v in (p, max(p - e, 0))]
    grow = [max(e - p, 0) for p, e in zip(padding, extra, strict=True)]
    y = mb.conv_transpose(
        x=ctx.var(0), weight=weight, pad_type="custom", pad=pads, strides=stride, dilations=dilation,
        groups=groups, name=ctx.name("full") if any(grow) else ctx.name(),
    )
    if any(grow):
        y = mb.pad(x=y, pad=np.array([v for g in grow for v in (0, g)], dtype=np.int32), mode="constant",
                   constant_val=ctx.scalar(0.0), name=ctx.name())
    want = tuple(ctx.out_shape.sizes())
    if tuple(int(d) for d in y.shape) != want:
        raise _fault(ctx, ShapeError, f"declared shape {list(want)} differs from the result {[int(d) for d in y.shape]}")
    return y


@lowering(
    notes=(
        "`conv_transpose` (PyTorch weight layout, custom pads: padding before, padding - output_padding"
        " after; `pad` with zeros where output_padding > padding); a run-time weight needs iOS17 (const"
        " weights only before) and spells dilation as zero taps"
    ),
)
def lower_conv_transpose2d(op: ops.ConvTranspose2d, ctx: LowerContext) -> Any:
    return _lower_conv_transpose(
        ctx, 2, op.kernel_size, op.stride, op.padding, op.dilation, op.output_padding, op.groups
    )


@lowering(
    notes=(
        "as ConvTranspose2d with 3 spatial dims (`conv_transpose`, custom pads, `pad` for"
        " output_padding > padding); a run-time weight needs iOS17"
    ),
)
def lower_conv_transpose3d(op: ops.ConvTranspose3d, ctx: LowerContext) -> Any:
    return _lower_conv_transpose(ctx, 3, (), op.stride, op.padding, op.dilation, op.output_padding, op.groups)
