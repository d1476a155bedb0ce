"""Conv and Pool over `[N, C, *spatial]` tensors with 1-3 spatial dims (spec section 11).

Attribute lists may be empty (stride and dilation 1, padding 0) or hold one value per spatial
dim; a single value for several dims applies to all of them, as the reference reads it.
Padding is symmetric. Pool padding never changes Max/Min/Sum/Prod (padded cells hold the
reduction's identity); Mean divides by the full kernel area, padded cells included.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product
from typing import Any

import numpy as np

from rlx_mil.errors import AttributeValueError, GraphError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.ops import ReduceOp
from rlx_mil.lower.context import LowerContext
from rlx_mil.lower.registry import lowering


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
    ops.Conv, family="conv",
    notes="`conv` (1-D/2-D/3-D; strides, pad_type custom with symmetric pads, dilations, groups; no"
    " bias); a Param/Constant weight becomes a const; a run-time weight is passed as a tensor, its"
    " dilation spelled as zero taps (reshape/pad/slice_by_size) since Core ML's conv takes"
    " dilations only with const weights",
)
def lower_conv(op: ops.Conv, ctx: LowerContext) -> Any:
    spatial = _spatial_rank(ctx)
    w_sizes = ctx.input_shape(1).sizes()
    x_sizes = ctx.input_shape(0).sizes()
    if len(w_sizes) != spatial + 2:
        raise _fault(ctx, ShapeError, f"w must be [C_out, C_in/groups, *kernel] of rank {spatial + 2},"
                     f" got {list(w_sizes)}", "w")
    kernel = [int(k) for k in w_sizes[2:]]
    if op.kernel_size and _per_dim(ctx, op.kernel_size, spatial, None, "kernel_size") != kernel:
        raise _fault(ctx, ShapeError, f"kernel_size {list(op.kernel_size)} differs from w's spatial dims {kernel}", "w")
    stride = _per_dim(ctx, op.stride, spatial, 1, "stride")
    padding = _per_dim(ctx, op.padding, spatial, 0, "padding")
    dilation = _per_dim(ctx, op.dilation, spatial, 1, "dilation")
    _check_window(ctx, kernel, stride, padding, dilation)
    groups = int(op.groups)
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
    return _mb().conv(
        x=ctx.var(0), weight=weight, strides=stride, pad_type="custom", pad=_pads(padding),
        dilations=dilation, groups=groups, name=ctx.name(),
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
    ops.Pool, family="conv",
    notes="Max: `max_pool`; Mean: `avg_pool` with exclude_padding_from_average=False (divides by the"
    " full kernel area); Sum: `avg_pool` times the kernel area; Min: -max_pool(-x); Prod: one strided"
    " `slice_by_index` per kernel offset multiplied together (padding with 1 via `pad` first)",
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
