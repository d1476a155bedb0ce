"""Projections with a constant weight (`linear`, `matmul` with a constant `y`, `conv`) computed
in pieces: along their output channels (`output_pieces`) or along the axis they contract, as a
sum of partial products (`partial_sums`). Shared by the Neural Engine form's rewrites that keep
dims under 16,384 (`wide_split`) and weight slices off the 1 MiB notch (`notch`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlx_mil.coreml.deploy.weight_slices import granularity, is_constant, slice_weight
from rlx_mil.errors import ConversionError

PROJECTIONS = ("linear", "matmul", "conv")
#: base name -> a name not used yet in the function
Fresh = Callable[[str], str]


def weight_of(op: Any) -> tuple[str, Any, int] | None:
    """(input name, constant weight var, its output-channel axis) of a projection op; None for
    any other op (a computed weight, a grouped conv, a matmul of two activations)."""
    if op.op_type == "linear":
        w = op.inputs.get("weight")
        return ("weight", w, 0) if w is not None and is_constant(w) and len(w.shape) == 2 else None
    if op.op_type == "conv":
        w = op.inputs.get("weight")
        groups = op.inputs.get("groups")
        if w is None or not is_constant(w) or (groups is not None and int(groups.val) != 1):
            return None
        return "weight", w, 0
    if op.op_type == "matmul":
        y = op.inputs.get("y")
        if y is None or not is_constant(y) or len(y.shape) != 2:
            return None
        transpose_y = op.inputs.get("transpose_y")
        return "y", y, (0 if transpose_y is not None and bool(transpose_y.val) else 1)
    return None


def out_axis(op: Any) -> int:
    """The output-channel axis of a projection's output."""
    return 1 if op.op_type == "conv" else len(op.outputs[0].shape) - 1


def contracted_axes(op: Any) -> tuple[int, int] | None:
    """(axis of `x`, axis of the weight) a projection contracts; None where `x` is transposed."""
    found = weight_of(op)
    if found is None:
        return None
    rank = len(op.inputs["x"].shape)
    if op.op_type == "linear":
        return rank - 1, 1
    if op.op_type == "conv":
        return 1, 1
    transpose_x = op.inputs.get("transpose_x")
    if transpose_x is not None and bool(transpose_x.val):
        return None
    return rank - 1, 1 if found[2] == 0 else 0


def output_pieces(op: Any, sizes: Sequence[int], fresh: Fresh) -> list[Any]:
    """`op` as one op per consecutive block of `sizes` output channels (ops inserted before
    `op`, which is left in place), each from the matching slice of its weight and bias. The
    weight slices are constants placed at the start of the function, where any op may read
    them (a tied embedding's lookup does, `shared_table`)."""
    from coremltools.converters.mil import Builder as mb

    found = weight_of(op)
    if found is None:
        raise ConversionError(f"op {op.name!r} ({op.op_type}) has no constant weight to split")
    key, weight, w_axis = found
    bias = op.inputs.get("bias")
    first = op.enclosing_block.operations[0]
    outs, start = [], 0
    for i, size in enumerate(sizes):
        kwargs = dict(op.inputs)
        kwargs[key] = slice_weight(weight, w_axis, start, start + size, fresh(f"{weight.name}_part{i}"), first)
        if bias is not None:
            if bias.val is None:
                raise ConversionError(f"op {op.name!r}: a computed bias cannot be split")
            kwargs["bias"] = mb.const(val=bias.val[start:start + size], name=fresh(f"{bias.name}_part{i}"), before_op=op)
        outs.append(getattr(mb, op.op_type)(**kwargs, name=fresh(f"{op.name}_part{i}"), before_op=op))
        start += size
    return outs


def partial_sums(op: Any, x_pieces: Sequence[Any], sizes: Sequence[int], fresh: Fresh) -> Any | None:
    """`op`'s output as the sum of each piece of its input (consecutive blocks of `sizes` along
    the contracted axis) times the matching slice of its weight, the bias added once; ops
    inserted before `op`. None where the weight cannot be cut at those blocks."""
    from coremltools.converters.mil import Builder as mb

    found, axes = weight_of(op), contracted_axes(op)
    if found is None or axes is None:
        return None
    key, weight, _ = found
    w_axis = axes[1]
    starts = np.cumsum((0, *sizes))
    if any(int(s) % granularity(weight, w_axis) for s in starts[1:-1]):
        return None
    total: Any = None
    for i, piece in enumerate(x_pieces):
        kwargs = dict(op.inputs)
        kwargs["x"] = piece
        kwargs[key] = slice_weight(weight, w_axis, int(starts[i]), int(starts[i + 1]), fresh(f"{weight.name}_part{i}"), op)
        if i and "bias" in kwargs:
            del kwargs["bias"]
        part = getattr(mb, op.op_type)(**kwargs, name=fresh(f"{op.name}_part{i}"), before_op=op)
        total = part if total is None else mb.add(x=total, y=part, name=fresh(f"{op.name}_sum{i}"), before_op=op)
    return total
