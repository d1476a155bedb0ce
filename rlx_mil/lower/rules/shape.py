"""Shape and data-movement ops: Reshape, Transpose, Narrow, Concat, Expand, Gather (spec 8.1-8.6).

Input/Param/Constant nodes are handled by the driver. Shapes are static by the time rules run,
so every size below is a plain int.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.lower.context import LowerContext
from rlx_mil.lower.registry import declare_unsupported, lowering
from rlx_mil.lower.rules.elementwise import convert, kind_of, shape_error, to_int32


def _attribute_error(ctx: LowerContext, message: str, operand: str | None = None) -> AttributeValueError:
    return AttributeValueError(message, node=ctx.node.id, op=ctx.op.type_name, name=ctx.node.name, operand=operand)


def _check_declared(ctx: LowerContext, sizes: tuple[int, ...], what: str) -> None:
    declared = ctx.out_shape.sizes()
    if declared != sizes and not (sizes in ((), (1,)) and declared in ((), (1,))):
        raise shape_error(ctx, f"{what} gives {list(sizes)}, but the node declares {list(declared)}")


def _same_dtype(ctx: LowerContext, var: Any, i: int) -> Any:
    """Input `i` held as the node's declared dtype (data movement keeps values; a declared
    dtype that differs from the input's is honoured with Cast semantics)."""
    return convert(ctx, var, ctx.input_shape(i).dtype, ctx.out_shape.dtype, suffix=f"input{i}_cast")


def _check_numel(ctx: LowerContext, sizes: tuple[int, ...]) -> None:
    if math.prod(sizes) == 0:
        raise ctx.unsupported(f"Core ML cannot hold the zero-size tensor {list(sizes)}")


@lowering(
    ops.Reshape, family="shape",
    notes="`reshape` to the declared sizes (a -1 in new_shape is resolved from the element count); no op when the shape is unchanged.",
)
def lower_reshape(op: ops.Reshape, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    new_shape = [int(d) for d in op.new_shape]
    if sum(1 for d in new_shape if d == -1) > 1 or any(d < -1 for d in new_shape):
        raise _attribute_error(ctx, f"new_shape {new_shape} may hold one -1 and otherwise sizes >= 0", "new_shape")
    numel = math.prod(sizes)
    known = math.prod(d for d in new_shape if d != -1)
    if -1 in new_shape:
        if known == 0 or numel % known:
            raise shape_error(ctx, f"cannot reshape {list(sizes)} to {new_shape}", "x")
        resolved = tuple(numel // known if d == -1 else d for d in new_shape)
    elif known != numel:
        raise shape_error(ctx, f"cannot reshape {list(sizes)} ({numel} elements) to {new_shape}", "x")
    else:
        resolved = tuple(new_shape)
    _check_declared(ctx, resolved, f"reshaping to {new_shape}")
    x = _same_dtype(ctx, ctx.var(0), 0)
    target = ctx.out_shape.sizes()
    if tuple(x.shape) == target:
        return x
    return mb.reshape(x=x, shape=np.asarray(target, dtype=np.int32), name=ctx.name())


@lowering(ops.Transpose, family="shape", notes="`transpose` with the perm; no op for the identity perm.")
def lower_transpose(op: ops.Transpose, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    perm = [int(p) for p in op.perm]
    if sorted(perm) != list(range(len(sizes))):
        raise _attribute_error(ctx, f"perm {perm} is not a permutation of 0..{len(sizes) - 1}", "perm")
    _check_declared(ctx, tuple(sizes[p] for p in perm), f"transposing {list(sizes)} by {perm}")
    x = _same_dtype(ctx, ctx.var(0), 0)
    if perm == list(range(len(sizes))):
        return x
    return mb.transpose(x=x, perm=perm, name=ctx.name())


@lowering(
    ops.Narrow, family="shape",
    notes="`slice_by_size` along the axis; no op when the slice is the whole axis; a zero-length slice is rejected.",
)
def lower_narrow(op: ops.Narrow, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    axis, start, length = int(op.axis), int(op.start), int(op.len)
    if not 0 <= axis < len(sizes):
        raise _attribute_error(ctx, f"axis {axis} is out of range for rank {len(sizes)}", "axis")
    if start < 0 or length < 0 or start + length > sizes[axis]:
        raise _attribute_error(
            ctx, f"slice start={start} len={length} does not fit axis {axis} of size {sizes[axis]}", "len"
        )
    out = tuple(length if i == axis else d for i, d in enumerate(sizes))
    _check_declared(ctx, out, f"narrowing axis {axis} to [{start}, {start + length})")
    _check_numel(ctx, out)
    x = _same_dtype(ctx, ctx.var(0), 0)
    if length == sizes[axis]:
        return x
    begin = np.zeros(len(sizes), dtype=np.int32)
    begin[axis] = start
    return mb.slice_by_size(x=x, begin=begin, size=np.asarray(out, dtype=np.int32), name=ctx.name())


@lowering(
    ops.Concat, family="shape",
    notes="`concat` (interleave=False) of the inputs converted to the declared dtype; zero-length pieces are dropped; one input is no op.",
)
def lower_concat(op: ops.Concat, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    if ctx.num_inputs == 0:
        raise ShapeError("Concat needs at least one input", node=ctx.node.id, op=ctx.op.type_name, name=ctx.node.name)
    first = ctx.input_shape(0).sizes()
    axis = int(op.axis)
    if not 0 <= axis < len(first):
        raise _attribute_error(ctx, f"axis {axis} is out of range for rank {len(first)}", "axis")
    total = 0
    for i in range(ctx.num_inputs):
        s = ctx.input_shape(i).sizes()
        if len(s) != len(first) or any(s[d] != first[d] for d in range(len(first)) if d != axis):
            raise shape_error(ctx, f"input {i} {list(s)} does not match input 0 {list(first)} off axis {axis}", str(i))
        total += s[axis]
    out = tuple(total if d == axis else first[d] for d in range(len(first)))
    _check_declared(ctx, out, f"concatenating along axis {axis}")
    _check_numel(ctx, out)
    pieces = [_same_dtype(ctx, ctx.var(i), i) for i in range(ctx.num_inputs) if ctx.input_shape(i).sizes()[axis] > 0]
    if len(pieces) == 1:
        return pieces[0]
    return mb.concat(values=pieces, axis=axis, interleave=False, name=ctx.name())


@lowering(
    ops.Expand, family="shape",
    notes="`reshape` to the target rank (left-padded with 1s) then `tile` of the size-1 dims that grow; every target the same (tile exists on all).",
)
def lower_expand(op: ops.Expand, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    target = [int(d) for d in op.target_shape]
    if len(target) < len(sizes):
        raise _attribute_error(ctx, f"target_shape {target} has lower rank than the input {list(sizes)}", "target_shape")
    padded = (1,) * (len(target) - len(sizes)) + tuple(sizes)
    result: list[int] = []
    for have, want in zip(padded, target, strict=True):
        if want == -1:
            result.append(have)
        elif want < 0:
            raise _attribute_error(ctx, f"target_shape {target} has a negative size other than -1", "target_shape")
        elif have not in (want, 1):
            raise shape_error(ctx, f"cannot expand {list(sizes)} to {target}: only size-1 dims may grow", "x")
        else:
            result.append(want)
    out = tuple(result)
    _check_declared(ctx, out, f"expanding {list(sizes)} to {target}")
    _check_numel(ctx, out)
    x = _same_dtype(ctx, ctx.var(0), 0)
    if padded != tuple(sizes):
        x = mb.reshape(x=x, shape=np.asarray(padded, dtype=np.int32), name=ctx.name("padded"))
    reps = [w // h if h != w else 1 for h, w in zip(padded, out, strict=True)]
    if all(r == 1 for r in reps):
        return x
    return mb.tile(x=x, reps=np.asarray(reps, dtype=np.int32), name=ctx.name())


def gather_indices(ctx: LowerContext, limit: int, operand: int = 1, role: str = "indices") -> Any:
    """Input `operand` (indices) as int32: float indices truncate toward zero (spec 8.6)."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    idx_dt = ctx.input_shape(operand).dtype
    value = ctx.value(operand)
    if value is not None:
        arr = np.asarray(value)
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise _attribute_error(ctx, f"constant {role} must be finite", role)
        idx = np.trunc(arr.astype(np.float64)) if arr.dtype.kind == "f" else arr.astype(np.int64)
        if arr.size and (idx.min() < 0 or idx.max() >= limit):
            raise _attribute_error(ctx, f"constant {role} must lie in [0, {limit})", role)
        return ctx.const(idx.astype(np.int32), "indices")
    var = ctx.var(operand)
    if kind_of(idx_dt) != "float":
        return to_int32(ctx, var, idx_dt, "indices_int")
    source = getattr(var, "op", None)
    if source is not None and source.op_type == "cast" and source.x.dtype == types.fp32 and var.dtype == types.fp16:
        # Float indices fed through an fp32 program input: cast them from fp32 directly, so ids
        # above 2048 (not all fp16 values) stay exact under fp16 precision.
        return mb.cast(x=source.x, dtype="int32", name=ctx.name("indices_int"))
    # Valid indices are >= 0, where floor is truncation.
    floored = mb.floor(x=var, name=ctx.name("indices_floor"))
    return mb.cast(x=floored, dtype="int32", name=ctx.name("indices_int"))


@lowering(
    ops.Gather, family="shape",
    notes=(
        "`gather` along the axis with int32 indices (NumPy take layout). Float indices: floor +"
        " cast (exact fp32 path for program inputs under fp16); constant indices are checked and"
        " become an int32 const. Bool tables go through int32."
    ),
)
def lower_gather(op: ops.Gather, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    table_sizes = ctx.input_shape(0).sizes()
    idx_sizes = ctx.input_shape(1).sizes()
    axis = int(op.axis)
    if not 0 <= axis < len(table_sizes):
        raise _attribute_error(ctx, f"axis {axis} is out of range for rank {len(table_sizes)}", "axis")
    out = (*table_sizes[:axis], *idx_sizes, *table_sizes[axis + 1:])
    _check_declared(ctx, out, f"gathering {list(idx_sizes)} indices from {list(table_sizes)} along axis {axis}")
    _check_numel(ctx, out)
    indices = gather_indices(ctx, table_sizes[axis])
    if not idx_sizes:
        indices = mb.reshape(x=indices, shape=np.asarray([1], dtype=np.int32), name=ctx.name("indices_1d"))
    table_dt, out_dt = ctx.input_shape(0).dtype, ctx.out_shape.dtype
    table = ctx.var(0)
    held = table_dt
    if table_dt is DType.BOOL:
        table, held = to_int32(ctx, table, table_dt, "table_int"), DType.I32
    result = mb.gather(x=table, indices=indices, axis=axis, name=ctx.name())
    if not idx_sizes:
        result = mb.reshape(x=result, shape=np.asarray(out, dtype=np.int32), name=ctx.name("squeezed"))
    return convert(ctx, result, held, out_dt, suffix="out")


# Ops of this family without a rule yet; conversion names the op and the reason.
declare_unsupported(ops.Pad, "not lowered yet (MIL `pad`, circular by slice + concat)")
declare_unsupported(ops.Slice, "not lowered yet (MIL `slice_by_index` with a stride)")
declare_unsupported(ops.Tile, "not lowered yet (MIL `tile`)")
declare_unsupported(ops.Trilu, "not lowered yet (`band_part` / `select` with a constant mask)")
declare_unsupported(ops.Reverse, "not lowered yet (MIL `reverse`)")
