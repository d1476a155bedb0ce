"""Slices of a constant weight along one axis, as new MIL ops: a `const`, or the `constexpr_*`
op that decodes a compressed weight, rebuilt from the slices of its codes (no weight is
decompressed or copied whole; the slices of a C-contiguous array along its first axis are views).

Used by the program rewrites that split wide projections (`wide_split`) and move weight slices
off the Neural Engine's 1 MiB notch (`notch`). A weight whose encoding cannot be cut where it is
asked to (a cut inside a LUT group or a scale block, a sparse or vector-palettized weight, an
iOS16 LUT with packed indices) is a `ConversionError` naming the weight; `granularity` says
where it can be cut.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlx_mil.errors import ConversionError


def is_constant(var: Any) -> bool:
    """A var computed at compile time: a `const` or a `constexpr_*` op's output."""
    op = getattr(var, "op", None)
    return op is not None and (op.op_type == "const" or op.op_type.startswith("constexpr_"))


def _arg(op: Any, name: str) -> Any:
    return op.inputs.get(name)


def _cut_step(size: int, parts: int) -> int:
    """Rows per group where `size` rows share `parts` tables / scales (1: one spans them all,
    so any cut keeps it)."""
    return size // parts if parts > 1 else 1


def granularity(var: Any, axis: int) -> int:
    """The step at which `var` (a constant weight) can be cut along `axis`: 1 for a plain
    const, the LUT group or scale block size of a compressed one. A weight that cannot be
    cut along `axis` at all is a `ConversionError`."""
    op = var.op
    rank = len(var.shape)
    axis %= rank
    kind = op.op_type
    if kind == "const":
        return 1
    if kind == "constexpr_lut_to_dense":
        lut = _arg(op, "lut")
        if lut is None or lut.val is None or len(lut.shape) != rank + 2:
            raise ConversionError(f"weight {var.name!r}: an iOS16 constexpr_lut_to_dense (packed indices) cannot be"
                                  " sliced; convert for iOS18")
        if lut.shape[-1] != 1:
            raise ConversionError(f"weight {var.name!r}: a vector-palettized weight cannot be sliced")
        return _cut_step(int(var.shape[axis]), int(lut.shape[axis]))
    if kind == "constexpr_blockwise_shift_scale":
        scale = _arg(op, "scale")
        data = _arg(op, "data")
        inner = granularity(data, axis) if not _is_const_op(data) else 1
        return math.lcm(_cut_step(int(var.shape[axis]), int(scale.shape[axis])), inner)
    if kind == "constexpr_affine_dequantize":
        return 1
    if kind == "constexpr_cast":
        return granularity(_arg(op, "source_val"), axis)
    raise ConversionError(f"weight {var.name!r}: a {kind} weight cannot be sliced (only const, constexpr_lut_to_dense,"
                          " constexpr_blockwise_shift_scale, constexpr_affine_dequantize and constexpr_cast)")


def _is_const_op(var: Any) -> bool:
    return var is not None and var.op is not None and var.op.op_type == "const"


def _take(array: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    index = [slice(None)] * array.ndim
    index[axis] = slice(start, stop)
    part = array[tuple(index)]
    # A slice along a later axis is strided: the blob writer needs contiguous data.
    return part if part.flags.c_contiguous else np.ascontiguousarray(part)


def slice_weight(var: Any, axis: int, start: int, stop: int, name: str, before_op: Any) -> Any:
    """`var[start:stop]` along `axis` as a new constant var (ops inserted before `before_op`),
    compressed as `var` is. `start` and `stop` must be multiples of `granularity(var, axis)`
    (or `stop` the full size)."""
    from coremltools.converters.mil import Builder as mb

    op = var.op
    rank = len(var.shape)
    axis %= rank
    size = int(var.shape[axis])
    if not 0 <= start < stop <= size:
        raise ConversionError(f"weight {var.name!r}: slice [{start}:{stop}] of axis {axis} outside its {size} rows")
    step = granularity(var, axis)
    if start % step or (stop % step and stop != size):
        raise ConversionError(f"weight {var.name!r}: slice [{start}:{stop}] of axis {axis} cuts a group of {step}"
                              " rows of its compressed encoding")
    kind = op.op_type
    if kind == "const":
        return mb.const(val=_take(var.val, axis, start, stop), name=name, before_op=before_op)
    if kind == "constexpr_lut_to_dense":
        indices = _arg(op, "indices").val
        lut = _arg(op, "lut").val
        groups = lut.shape[axis]
        if groups > 1:
            rows = size // groups
            lut = _take(lut, axis, start // rows, -(-stop // rows))
        kwargs: dict[str, Any] = {}
        if _arg(op, "vector_axis") is not None:
            kwargs["vector_axis"] = _arg(op, "vector_axis").val
        return mb.constexpr_lut_to_dense(indices=_take(indices, axis, start, stop), lut=lut, name=name,
                                         before_op=before_op, **kwargs)
    if kind == "constexpr_blockwise_shift_scale":
        data = _arg(op, "data")
        sliced = (_take(data.val, axis, start, stop) if _is_const_op(data)
                  else slice_weight(data, axis, start, stop, f"{name}_data", before_op))
        scale = _arg(op, "scale").val
        offset_var = _arg(op, "offset")
        offset = offset_var.val if offset_var is not None else None
        blocks = scale.shape[axis]
        if blocks > 1:
            rows = size // blocks
            scale = _take(scale, axis, start // rows, -(-stop // rows))
            if offset is not None:
                offset = _take(offset, axis, start // rows, -(-stop // rows))
        extra = {"offset": offset} if offset is not None else {}
        return mb.constexpr_blockwise_shift_scale(data=sliced, scale=scale, name=name, before_op=before_op, **extra)
    if kind == "constexpr_affine_dequantize":
        data = _arg(op, "quantized_data").val
        qaxis = int(_arg(op, "axis").val)
        zero, scale = _arg(op, "zero_point").val, _arg(op, "scale").val
        if qaxis % rank == axis:
            zero = zero[start:stop] if np.ndim(zero) == 1 else zero
            scale = scale[start:stop] if np.ndim(scale) == 1 else scale
        return mb.constexpr_affine_dequantize(quantized_data=_take(data, axis, start, stop), zero_point=zero,
                                              scale=scale, axis=np.int32(qaxis), name=name, before_op=before_op)
    if kind == "constexpr_cast":
        source = slice_weight(_arg(op, "source_val"), axis, start, stop, f"{name}_source", before_op)
        return mb.constexpr_cast(source_val=source, output_dtype=_arg(op, "output_dtype").val, name=name,
                                 before_op=before_op)
    raise ConversionError(f"weight {var.name!r}: a {kind} weight cannot be sliced")


def remove_if_unused(block: Any, var: Any) -> None:
    """Remove the op producing the constant `var` (and the constants only it read) when nothing
    reads `var` any more."""
    op = getattr(var, "op", None)
    if op is None or op.enclosing_block is not block or not is_constant(var):
        return
    if any(out.child_ops or out in block.outputs for out in op.outputs):
        return
    inputs = list(op.get_flattened_inputs())
    block.remove_ops([op])
    for inner in inputs:
        remove_if_unused(block, inner)
