"""Shape and data-movement ops: Reshape, Transpose, Narrow, Concat, Expand, Gather (spec 8.1-8.6),
and the structural ops of spec part 2, section 3: Pad, Slice, Tile, Trilu, Reverse.

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
from rlx_mil.ir.ops import PadKind
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.holding import INT_RANGES, convert, kind_of, to_int32
from rlx_mil.lowering.registry import lowering


def _check_declared(ctx: LowerContext, sizes: tuple[int, ...], what: str) -> None:
    declared = ctx.out_shape.sizes()
    if declared != sizes and not (sizes in ((), (1,)) and declared in ((), (1,))):
        raise ctx.fail(ShapeError, f"{what} gives {list(sizes)}, but the node declares {list(declared)}")


def _same_dtype(ctx: LowerContext, var: Any, i: int) -> Any:
    """Input `i` held as the node's declared dtype (data movement keeps values; a declared
    dtype that differs from the input's is honoured with Cast semantics)."""
    return convert(ctx, var, ctx.input_shape(i).dtype, ctx.out_shape.dtype, suffix=f"input{i}_cast")


def _check_numel(ctx: LowerContext, sizes: tuple[int, ...]) -> None:
    if math.prod(sizes) == 0:
        raise ctx.unsupported(f"Core ML cannot hold the zero-size tensor {list(sizes)}")


@lowering(
    notes="`reshape` to the declared sizes (a -1 in new_shape is resolved from the element count); no op when the shape is unchanged.",
)
def lower_reshape(op: ops.Reshape, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    new_shape = [int(d) for d in op.new_shape]
    if sum(1 for d in new_shape if d == -1) > 1 or any(d < -1 for d in new_shape):
        raise ctx.fail(AttributeValueError, f"new_shape {new_shape} may hold one -1 and otherwise sizes >= 0", "new_shape")
    numel = math.prod(sizes)
    known = math.prod(d for d in new_shape if d != -1)
    if -1 in new_shape:
        if known == 0 or numel % known:
            raise ctx.fail(ShapeError, f"cannot reshape {list(sizes)} to {new_shape}", "x")
        resolved = tuple(numel // known if d == -1 else d for d in new_shape)
    elif known != numel:
        raise ctx.fail(ShapeError, f"cannot reshape {list(sizes)} ({numel} elements) to {new_shape}", "x")
    else:
        resolved = tuple(new_shape)
    _check_declared(ctx, resolved, f"reshaping to {new_shape}")
    x = _same_dtype(ctx, ctx.var(0), 0)
    target = ctx.out_shape.sizes()
    if tuple(x.shape) == target:
        return x
    return mb.reshape(x=x, shape=np.asarray(target, dtype=np.int32), name=ctx.name())


@lowering(notes="`transpose` with the perm; no op for the identity perm.")
def lower_transpose(op: ops.Transpose, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    perm = [int(p) for p in op.perm]
    if sorted(perm) != list(range(len(sizes))):
        raise ctx.fail(AttributeValueError, f"perm {perm} is not a permutation of 0..{len(sizes) - 1}", "perm")
    _check_declared(ctx, tuple(sizes[p] for p in perm), f"transposing {list(sizes)} by {perm}")
    x = _same_dtype(ctx, ctx.var(0), 0)
    if perm == list(range(len(sizes))):
        return x
    return mb.transpose(x=x, perm=perm, name=ctx.name())


@lowering(
    notes="`slice_by_size` along the axis; no op when the slice is the whole axis; a zero-length slice is rejected.",
)
def lower_narrow(op: ops.Narrow, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    axis, start, length = int(op.axis), int(op.start), int(op.len)
    if not 0 <= axis < len(sizes):
        raise ctx.fail(AttributeValueError, f"axis {axis} is out of range for rank {len(sizes)}", "axis")
    if start < 0 or length < 0 or start + length > sizes[axis]:
        raise ctx.fail(AttributeValueError, f"slice start={start} len={length} does not fit axis {axis} of size {sizes[axis]}", "len"
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
    notes="`concat` (interleave=False) of the inputs converted to the declared dtype; zero-length pieces are dropped; one input is no op.",
)
def lower_concat(op: ops.Concat, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    if ctx.num_inputs == 0:
        raise ShapeError("Concat needs at least one input", node=ctx.node.id, op=ctx.op.type_name, name=ctx.node.name)
    first = ctx.input_shape(0).sizes()
    axis = int(op.axis)
    if not 0 <= axis < len(first):
        raise ctx.fail(AttributeValueError, f"axis {axis} is out of range for rank {len(first)}", "axis")
    total = 0
    for i in range(ctx.num_inputs):
        s = ctx.input_shape(i).sizes()
        if len(s) != len(first) or any(s[d] != first[d] for d in range(len(first)) if d != axis):
            raise ctx.fail(ShapeError, f"input {i} {list(s)} does not match input 0 {list(first)} off axis {axis}", str(i))
        total += s[axis]
    out = tuple(total if d == axis else first[d] for d in range(len(first)))
    _check_declared(ctx, out, f"concatenating along axis {axis}")
    _check_numel(ctx, out)
    pieces = [_same_dtype(ctx, ctx.var(i), i) for i in range(ctx.num_inputs) if ctx.input_shape(i).sizes()[axis] > 0]
    if len(pieces) == 1:
        return pieces[0]
    return mb.concat(values=pieces, axis=axis, interleave=False, name=ctx.name())


@lowering(
    notes="`reshape` to the target rank (left-padded with 1s) then `tile` of the size-1 dims that grow; every target the same (tile exists on all).",
)
def lower_expand(op: ops.Expand, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    target = [int(d) for d in op.target_shape]
    if len(target) < len(sizes):
        raise ctx.fail(AttributeValueError, f"target_shape {target} has lower rank than the input {list(sizes)}", "target_shape")
    padded = (1,) * (len(target) - len(sizes)) + tuple(sizes)
    result: list[int] = []
    for have, want in zip(padded, target, strict=True):
        if want == -1:
            result.append(have)
        elif want < 0:
            raise ctx.fail(AttributeValueError, f"target_shape {target} has a negative size other than -1", "target_shape")
        elif have not in (want, 1):
            raise ctx.fail(ShapeError, f"cannot expand {list(sizes)} to {target}: only size-1 dims may grow", "x")
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
            raise ctx.fail(AttributeValueError, f"constant {role} must be finite", role)
        idx = np.trunc(arr.astype(np.float64)) if arr.dtype.kind == "f" else arr.astype(np.int64)
        if arr.size and (idx.min() < 0 or idx.max() >= limit):
            raise ctx.fail(AttributeValueError, f"constant {role} must lie in [0, {limit})", role)
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
        raise ctx.fail(AttributeValueError, f"axis {axis} is out of range for rank {len(table_sizes)}", "axis")
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


# ------------------------------------------------------------------ structural ops (part 2, section 3)


def _held_for_gather(ctx: LowerContext, var: Any) -> tuple[Any, DType]:
    """`var` (holding the node's dtype) in a form MIL gather takes: Bool goes through int32."""
    dtype = ctx.out_shape.dtype
    if dtype is DType.BOOL:
        return to_int32(ctx, var, dtype, "input_int"), DType.I32
    return var, dtype


def _held_constant(ctx: LowerContext, value: float) -> Any:
    """The pad constant as the node's dtype holds it (Cast semantics: truncate and saturate)."""
    dtype = ctx.out_shape.dtype
    if kind_of(dtype) == "float":
        return ctx.float_dtype(value)
    if dtype is DType.BOOL:
        return np.bool_(value != 0)
    lo, hi = INT_RANGES[dtype]
    return np.int32(min(max(math.trunc(value), lo), hi))


_NP_PAD_MODES = {PadKind.REFLECT: "reflect", PadKind.REPLICATE: "edge", PadKind.CIRCULAR: "wrap"}


@lowering(
    notes=(
        "Constant: `pad` (mode constant) for floats; int/Bool data concatenates constant blocks."
        " Reflect / Replicate / Circular: one `gather` per padded axis with the constant source"
        " positions np.pad's rule gives (axis 0 first, so corners follow np.pad), which needs no"
        " MIL pad mode and holds on every axis and target."
    ),
)
def lower_pad(op: ops.Pad, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    if len(op.pads) != len(sizes):
        raise ctx.fail(AttributeValueError, f"pads needs {len(sizes)} (before, after) pairs, got {len(op.pads)}", "pads")
    kind = op.mode.kind
    for axis, (before, after) in enumerate(op.pads):
        limit = {PadKind.REFLECT: sizes[axis] - 1, PadKind.CIRCULAR: sizes[axis]}.get(kind)
        if before < 0 or after < 0 or (limit is not None and max(before, after) > limit):
            raise ctx.fail(AttributeValueError, f"{kind.value} padding of axis {axis} (size {sizes[axis]}) by {[before, after]}", "pads")
    out = tuple(n + b + a for n, (b, a) in zip(sizes, op.pads, strict=True))
    _check_declared(ctx, out, f"padding {list(sizes)} by {[list(p) for p in op.pads]}")
    _check_numel(ctx, out)
    _check_numel(ctx, sizes)
    x = _same_dtype(ctx, ctx.var(0), 0)
    padded_axes = [axis for axis, (b, a) in enumerate(op.pads) if b or a]
    if not padded_axes:
        return x
    dtype = ctx.out_shape.dtype
    if kind is PadKind.CONSTANT:
        fill = _held_constant(ctx, float(op.mode.value or 0.0))
        if kind_of(dtype) == "float":
            flat = np.asarray([v for pair in op.pads for v in pair], dtype=np.int32)
            return mb.pad(x=x, pad=flat, mode="constant", constant_val=fill, name=ctx.name())
        current = list(sizes)
        for axis in padded_axes:
            before, after = op.pads[axis]
            pieces = []
            for count, where in ((before, "before"), (after, "after")):
                if count:
                    block = list(current)
                    block[axis] = count
                    pieces.append((where, ctx.const(np.full(block, fill), f"axis{axis}_{where}")))
            parts = [p for w, p in pieces if w == "before"] + [x] + [p for w, p in pieces if w == "after"]
            x = mb.concat(values=parts, axis=axis, interleave=False, name=ctx.name(f"axis{axis}"))
            current[axis] += before + after
        return x
    held, holding = _held_for_gather(ctx, x)
    for axis in padded_axes:
        before, after = op.pads[axis]
        source = np.pad(np.arange(sizes[axis]), (before, after), mode=_NP_PAD_MODES[kind])  # type: ignore[call-overload]
        indices = ctx.const(source.astype(np.int32), f"axis{axis}_source")
        held = mb.gather(x=held, indices=indices, axis=axis, name=ctx.name(f"axis{axis}"))
    return convert(ctx, held, holding, dtype, suffix="out")


@lowering(
    notes=(
        "step 1: `slice_by_size`; step > 1: `slice_by_index` with that stride; step < 0: the same"
        " positive-stride slice from the lowest index read, then `reverse` along the axis (no"
        " negative MIL stride or wrapped end index). Indices outside the axis and len 0 are rejected."
    ),
)
def lower_slice(op: ops.Slice, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    axis, start, length, step = int(op.axis), int(op.start), int(op.len), int(op.step)
    if not 0 <= axis < len(sizes):
        raise ctx.fail(AttributeValueError, f"axis {axis} is out of range for rank {len(sizes)}", "axis")
    if step == 0:
        raise ctx.fail(AttributeValueError, "step must not be 0", "step")
    last = start + (length - 1) * step
    if length < 0 or (length and not (0 <= start < sizes[axis] and 0 <= last < sizes[axis])):
        raise ctx.fail(AttributeValueError, f"start {start}, len {length}, step {step} read outside axis {axis} of size {sizes[axis]}", "len"
        )
    out = tuple(length if i == axis else d for i, d in enumerate(sizes))
    _check_declared(ctx, out, f"slicing axis {axis}")
    _check_numel(ctx, out)
    x = _same_dtype(ctx, ctx.var(0), 0)
    low = min(start, last)
    if length == 1 or step == 1:
        if length == sizes[axis]:
            return x
        begin = np.zeros(len(sizes), dtype=np.int32)
        begin[axis] = low
        return mb.slice_by_size(x=x, begin=begin, size=np.asarray(out, dtype=np.int32), name=ctx.name())
    begin = np.zeros(len(sizes), dtype=np.int32)
    end = np.asarray(sizes, dtype=np.int32)
    stride = np.ones(len(sizes), dtype=np.int32)
    begin[axis], end[axis], stride[axis] = low, max(start, last) + 1, abs(step)
    name = ctx.name() if step > 0 else ctx.name("ascending")
    picked = mb.slice_by_index(x=x, begin=begin, end=end, stride=stride, name=name)
    if step > 0:
        return picked
    return mb.reverse(x=picked, axes=[axis], name=ctx.name())


@lowering(notes="`tile` with one rep per axis; no op when every rep is 1.")
def lower_tile(op: ops.Tile, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    reps = [int(r) for r in op.reps]
    if len(reps) != len(sizes) or any(r < 1 for r in reps):
        raise ctx.fail(AttributeValueError, f"reps must hold one count >= 1 per axis of {list(sizes)}, got {reps}", "reps")
    out = tuple(n * r for n, r in zip(sizes, reps, strict=True))
    _check_declared(ctx, out, f"tiling {list(sizes)} by {reps}")
    _check_numel(ctx, out)
    x = _same_dtype(ctx, ctx.var(0), 0)
    if all(r == 1 for r in reps):
        return x
    return mb.tile(x=x, reps=np.asarray(reps, dtype=np.int32), name=ctx.name())


@lowering(
    notes=(
        "`select` with a constant bool [rows, cols] keep-mask (np.triu/np.tril of ones) broadcast"
        " over the batch axes: the dropped triangle is exactly 0 even where x is NaN/inf"
        " (select semantics, spec part 2 section 9 Q17); no op when the mask keeps everything."
    ),
)
def lower_trilu(op: ops.Trilu, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    if len(sizes) < 2:
        raise ctx.fail(ShapeError, f"Trilu needs rank >= 2, got {list(sizes)}", "x")
    _check_declared(ctx, sizes, "Trilu")
    _check_numel(ctx, sizes)
    ones = np.ones(sizes[-2:], dtype=bool)
    keep = np.triu(ones, int(op.diagonal)) if op.upper else np.tril(ones, int(op.diagonal))
    x = _same_dtype(ctx, ctx.var(0), 0)
    if keep.all():
        return x
    dtype = ctx.out_shape.dtype
    zero: Any = ctx.scalar(0.0) if kind_of(dtype) == "float" else (np.bool_(False) if dtype is DType.BOOL else np.int32(0))
    return mb.select(cond=ctx.const(keep, "keep"), a=x, b=zero, name=ctx.name())


@lowering(notes="`reverse` over the listed axes; no axes is no op.")
def lower_reverse(op: ops.Reverse, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    axes = [int(a) for a in op.axes]
    if any(not 0 <= a < len(sizes) for a in axes) or len(set(axes)) != len(axes):
        raise ctx.fail(AttributeValueError, f"axes {axes} must be distinct axes of rank {len(sizes)}", "axes")
    _check_declared(ctx, sizes, "Reverse")
    _check_numel(ctx, sizes)
    x = _same_dtype(ctx, ctx.var(0), 0)
    if not axes:
        return x
    return mb.reverse(x=x, axes=axes, name=ctx.name())
