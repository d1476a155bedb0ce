"""Upstream's Kitten TTS alignment helpers that have exact IR forms: rlx-cpu's ONNX reference
kernels (`onnx_ref.rs` over `onnx_control_flow.rs`), which upstream's Core ML backend runs on
the host. Each writes a fixed, declared output from I64 counts read at run time, so each is a
comparison of positions against the count and a Where:

* `onnx.AlignmentRange` (1 input, the frame count): `i` at flat position `i < frames`, 0 after
  (`alignment_range_ids`);
* `onnx.ExpandI64Align` (data, shape): `data[i]` (flattened) at flat position `i < shape[0]`,
  0 after and past the data's end (`expand_i64_align`);
* `onnx.VocoderWaveformSlice` (wave, align_frames): the F32 waveform along its time axis (axis
  2 of a rank-3 wave, else the last) from sample 10 on, copied while `t < frames * 600 - 20`
  (the kernel's `[10, frames * 600 - 10)`; 600 samples a frame is the hop it hard-codes for Kitten
  mini 0.8) and while samples remain, 0 after (`vocoder_waveform_slice`). Read only where the
  output has the wave's rank and its sizes off the time axis (the kernel copies rows of the
  output's stride from the wave's, which is a slice only then).

A count is the first element of its operand (0 for an empty one), truncated to I64 as Rust's
`as` does (the IR's Cast); a negative count copies nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from rlx_mil.errors import UnsupportedOpFormatError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.node import NodeOrigin
from rlx_mil.ir.op_base import Op
from rlx_mil.ir.ops.elementwise import Binary, BinaryOp, Cast, CmpOp, Compare, Where
from rlx_mil.ir.ops.leaf import Constant
from rlx_mil.ir.ops.shape import Concat, Narrow, Reshape
from rlx_mil.ir.shape import Shape, Static

ALIGNMENT_RANGE_NAME = "onnx.AlignmentRange"
EXPAND_I64_ALIGN_NAME = "onnx.ExpandI64Align"
VOCODER_WAVEFORM_SLICE_NAME = "onnx.VocoderWaveformSlice"
#: Samples a frame (`SAMPLES_PER_ALIGNMENT_FRAME`) and samples trimmed at each end, as upstream's
#: `vocoder_waveform_slice` hard-codes them.
VOCODER_HOP = 600
VOCODER_TRIM = 10

#: name -> its number of inputs.
ALIGNMENT_HELPERS = {ALIGNMENT_RANGE_NAME: 1, EXPAND_I64_ALIGN_NAME: 2, VOCODER_WAVEFORM_SLICE_NAME: 2}


@dataclass(frozen=True)
class AlignmentHelper(Op):
    """Which alignment helper a node is while it is read (never added to a graph)."""

    type_name: ClassVar[str] = "onnx.AlignmentHelper"
    helper: str


def add_alignment_helper(add: Callable[..., int], operands: Sequence[Shape], helper: str, inputs: Sequence[int],
                         shape: Shape, path: str, name: str | None, origin: NodeOrigin | None) -> int:
    """The IR nodes computing `helper` as upstream's kernel does; returns the output node."""
    if not shape.is_static or not all(o.is_static for o in operands):
        raise UnsupportedOpFormatError(f"{path}: {helper} is read for static shapes, got {list(operands)} -> {shape}")

    def const(values: Sequence[int], dims: Sequence[int], dtype: DType = DType.I64) -> int:
        raw = np.asarray(values, np.int64 if dtype is DType.I64 else np.float32).tobytes()
        return add(Constant(raw), [], Shape(tuple(Static(d) for d in dims), dtype))

    def count(i: int) -> int:
        """The first element of operand `i` as I64, at least 0 (shape [1])."""
        sizes = operands[i].sizes()
        if math.prod(sizes) == 0:
            return const([0], [1])
        flat = add(Reshape((math.prod(sizes),)), [inputs[i]]) if len(sizes) != 1 else inputs[i]
        first = add(Narrow(0, 0, 1), [flat])
        first = first if operands[i].dtype is DType.I64 else add(Cast(DType.I64), [first])
        return add(Binary(BinaryOp.MAX), [first, const([0], [1])])

    if helper == VOCODER_WAVEFORM_SLICE_NAME:
        return _vocoder_slice(add, const, count, operands[0], inputs[0], shape, path, name, origin)
    total = math.prod(shape.sizes())
    positions = const(range(total), [total])
    if helper == ALIGNMENT_RANGE_NAME:
        values = positions
        limit = count(0)
    else:
        data = operands[0]
        length = math.prod(data.sizes())
        if length == 0:
            values = const([0] * total, [total])
        else:
            flat = add(Reshape((length,)), [inputs[0]]) if len(data.dims) != 1 else inputs[0]
            flat = flat if data.dtype is DType.I64 else add(Cast(DType.I64), [flat])
            if length >= total:
                values = add(Narrow(0, 0, total), [flat]) if length > total else flat
            else:
                values = add(Concat(0), [flat, const([0] * (total - length), [total - length])])
        limit = count(1)
    out = add(Where(), [add(Compare(CmpOp.LT), [positions, limit]), values, const([0], [1])])
    return _finish(add, out, shape, name, origin)


def _finish(add: Callable[..., int], flat: int, shape: Shape, name: str | None, origin: NodeOrigin | None) -> int:
    """The flat I64 values in the declared shape and dtype."""
    sizes = tuple(shape.sizes())
    if shape.dtype is not DType.I64:
        flat = add(Cast(shape.dtype), [flat])
    return add(Reshape(sizes), [flat], shape, name=name, origin=origin)


def _vocoder_slice(add: Callable[..., int], const: Callable[..., int], count: Callable[[int], int], wave: Shape,
                   wave_id: int, shape: Shape, path: str, name: str | None, origin: NodeOrigin | None) -> int:
    sizes, out_sizes = list(wave.sizes()), list(shape.sizes())
    rank = len(sizes)
    axis = 2 if rank == 3 else rank - 1
    if (rank < 1 or wave.dtype is not DType.F32 or shape.dtype is not DType.F32 or len(out_sizes) != rank
            or any(a != b for i, (a, b) in enumerate(zip(sizes, out_sizes, strict=True)) if i != axis)):
        raise UnsupportedOpFormatError(
            f"{path}: {VOCODER_WAVEFORM_SLICE_NAME} is read for an F32 wave and output of one rank whose sizes"
            f" agree off the time axis {axis}, got {wave} -> {shape}")
    out_time = out_sizes[axis]
    kept = min(max(sizes[axis] - VOCODER_TRIM, 0), out_time)
    parts = []
    if kept:
        parts.append(add(Narrow(axis, VOCODER_TRIM, kept), [wave_id]))
    if out_time > kept:
        pad = [out_time - kept if i == axis else s for i, s in enumerate(sizes)]
        parts.append(const([0.0] * math.prod(pad), pad, DType.F32))
    samples = parts[0] if len(parts) == 1 else add(Concat(axis), parts)
    # frames * hop - 2 * trim, the frames clamped first so the product stays small (a count past
    # the output copies everything either way).
    frames = add(Binary(BinaryOp.MIN), [count(1), const([out_time + 1], [1])])
    limit = add(Binary(BinaryOp.SUB), [add(Binary(BinaryOp.MUL), [frames, const([VOCODER_HOP], [1])]),
                                       const([2 * VOCODER_TRIM], [1])])
    times = const(range(out_time), [out_time if i == axis else 1 for i in range(rank)])
    keep = add(Compare(CmpOp.LT), [times, limit])
    return add(Where(), [keep, samples, const([0.0], [1], DType.F32)], shape, name=name, origin=origin)
