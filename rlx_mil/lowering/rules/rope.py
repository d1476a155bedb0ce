"""Rotary position embedding (spec 8.7): NeoX rotate-half, or GptJ adjacent pairs (spec part 2, 1.8)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.rules.norm import input_sizes, require_float


def _check_table(ctx: LowerContext, index: int, name: str, seq: int, half: int) -> tuple[int, int, int]:
    """(rows, cols, rows used) of a cos/sin table: all P rows from 0..S-1, or one broadcast row."""
    sizes = input_sizes(ctx, index)
    if not sizes or math.prod(sizes) == 0:
        raise ctx.fail(ShapeError, f"{name} must be a [P, head_dim/2] table, got {list(sizes)}", name)
    cols = sizes[-1]
    rows = math.prod(sizes[:-1])
    if cols < half:
        raise ctx.fail(ShapeError, f"{name} rows hold {cols} values but n_rot/2 = {half} are needed", name)
    if rows != 1 and rows < seq:
        raise ctx.fail(ShapeError, f"{name} has {rows} rows but the sequence has {seq} positions (need P >= S or P == 1)", name
        )
    return rows, cols, 1 if rows == 1 else seq


def _table_rows(ctx: LowerContext, index: int, name: str, rows: int, cols: int, used: int, half: int) -> Any:
    """A run-time table's rows 0..used-1 and columns 0..half-1 as a `[used, half]` var."""
    from coremltools.converters.mil import Builder as mb

    table = ctx.var(index)
    if len(input_sizes(ctx, index)) != 2:
        table = mb.reshape(x=table, shape=[rows, cols], name=ctx.name(f"{name}_2d"))
    if (used, half) != (rows, cols):
        table = mb.slice_by_index(x=table, begin=[0, 0], end=[used, half], name=ctx.name(f"{name}_rows"))
    return table


def _table(ctx: LowerContext, index: int, name: str, seq: int, half: int, rank4: bool, pairs: bool) -> Any:
    """Rows 0..S-1 (or the single broadcast row) and columns 0..half-1 of a cos/sin table, shaped
    to broadcast against the per-head view of x: [S', 1, half] for [.., S, H, D], [S', half] for
    [B, H, S, D]; with `pairs` (GptJ) one more trailing 1 to broadcast over each pair."""
    from coremltools.converters.mil import Builder as mb

    rows, cols, used = _check_table(ctx, index, name, seq, half)
    view = [used, half] if rank4 else [used, 1, half]
    if pairs:
        view.append(1)
    value = ctx.known_value(index)
    if value is not None:
        arr = np.asarray(value, dtype=np.float32).reshape(rows, cols)[:used, :half]
        return ctx.const(arr.reshape(view), name)
    part = _table_rows(ctx, index, name, rows, cols, used, half)
    return mb.reshape(x=part, shape=view, name=ctx.name(f"{name}_view"))


def _full_tables(ctx: LowerContext, seq: int, half: int, rank4: bool) -> tuple[Any, Any]:
    """Head-wide tables `[cos, cos]` and `[-sin, sin]` (rows 0..S-1, or the single broadcast
    row), shaped to broadcast against the per-head view of x: `[S', D]` for [B, H, S, D],
    `[S', 1, D]` for [.., S, H, D]. Built once per conversion for each pair of tables and
    geometry, and shared by every RoPE node using them (q and k of every layer)."""
    from coremltools.converters.mil import Builder as mb

    rows, cols, used = _check_table(ctx, 1, "cos", seq, half)
    _check_table(ctx, 2, "sin", seq, half)
    view = [used, 2 * half] if rank4 else [used, 1, 2 * half]
    keys = (ctx.value_key(1), ctx.value_key(2))
    # Tables known at conversion (and not compressed): read once, whatever the number of nodes.
    if None not in keys and not (ctx.compresses(1) or ctx.compresses(2)):

        def known(index: int, sign: float, what: str) -> Any:
            part = np.asarray(ctx.value(index), dtype=np.float32).reshape(rows, cols)[:used, :half]
            full = np.concatenate([sign * part, part], axis=-1).reshape(view)
            return ctx.const(full, what)

        cos = ctx.shared_var(("rope_cos", keys, used, half, rank4), lambda: known(1, 1.0, "cos"))
        sin = ctx.shared_var(("rope_sin", keys, used, half, rank4), lambda: known(2, -1.0, "sin"))
        return cos, sin

    def runtime(index: int, name: str, negate_first: bool) -> Any:
        part = _table_rows(ctx, index, name, rows, cols, used, half)
        first = mb.mul(x=part, y=ctx.scalar(-1.0), name=ctx.name(f"{name}_neg")) if negate_first else part
        full = mb.concat(values=[first, part], axis=-1, name=ctx.name(f"{name}_full"))
        return mb.reshape(x=full, shape=view, name=ctx.name(f"{name}_view"))

    table_ids = (ctx.node.inputs[1], ctx.node.inputs[2], id(ctx.var(1)), id(ctx.var(2)))
    cos = ctx.shared_var(("rope_cos_runtime", table_ids, used, half, rank4), lambda: runtime(1, "cos", False))
    sin = ctx.shared_var(("rope_sin_runtime", table_ids, used, half, rank4), lambda: runtime(2, "sin", True))
    return cos, sin


def _rotate_half_full(heads: Any, half: int, cos: Any, sin_signed: Any, ctx: LowerContext) -> Any:
    """NeoX over the whole head: x*[cos, cos] + concat(x2, x1)*[-sin, sin]. x1*cos - x2*sin ==
    x1*cos + x2*(-sin) exactly, so this is the textbook formula's arithmetic in 5 ops instead of 8."""
    from coremltools.converters.mil import Builder as mb

    first, second = mb.split(x=heads, split_sizes=[half, half], axis=-1, name=ctx.name("halves"))
    swapped = mb.concat(values=[second, first], axis=-1, name=ctx.name("swapped"))
    return mb.add(
        x=mb.mul(x=heads, y=cos, name=ctx.name("x_cos")),
        y=mb.mul(x=swapped, y=sin_signed, name=ctx.name("swapped_sin")),
        name=ctx.name("rotated"),
    )


@lowering(
    notes=(
        "NeoX over the whole head: rotate-half as x*[cos,cos] + concat(x2,x1)*[-sin,sin]:"
        " `reshape` to heads (rank 2/3), `split`, `concat`, `mul`, `mul`, `add`, `reshape` back (7 ops),"
        " the head-wide tables built once per conversion and shared by every RoPE node. n_rot <"
        " head_dim: `split` into the two rotated halves and the unrotated tail, `mul`/`sub`/`add` with"
        " table rows 0..S-1 (`slice_by_index`, or sliced at conversion for Param tables; a 1-row table"
        " broadcasts), `concat`, `reshape` back. A rank-4 x that is a head-major `Transpose` of a [B, S, H, D]"
        " tensor (Hugging Face q/k) is rotated before that transpose (then `transpose`), so no transpose"
        " feeds element-wise ops."
        " GptJ style: the rotated part is reshaped to [..., n_rot/2, 2] and `split` into the even and"
        " odd members of each pair, rotated the same way, then `concat` + `reshape` back"
    ),
)
def lower_rope(op: ops.Rope, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    head_dim, n_rot = op.head_dim, op.n_rot
    if head_dim < 1 or n_rot < 0 or n_rot % 2 != 0 or n_rot > head_dim:
        raise ctx.fail(AttributeValueError,
            f"need head_dim >= 1 and an even 0 <= n_rot <= head_dim, got head_dim={head_dim} n_rot={n_rot}",
        )
    require_float(ctx, 0, "x")
    require_float(ctx, 1, "cos")
    require_float(ctx, 2, "sin")
    sizes = input_sizes(ctx, 0)
    rank = len(sizes)
    if rank == 4:
        if sizes[3] != head_dim:
            raise ctx.fail(ShapeError, f"rank-4 x must be [B, H, S, {head_dim}], got {list(sizes)}", "x")
        seq = sizes[2]
        heads_view = list(sizes)
    elif rank in (2, 3):
        if sizes[-1] % head_dim != 0:
            raise ctx.fail(ShapeError, f"feature width {sizes[-1]} is not a multiple of head_dim {head_dim}", "x"
            )
        seq = sizes[-2]
        heads_view = [*sizes[:-1], sizes[-1] // head_dim, head_dim]
    else:
        raise ctx.fail(ShapeError, f"x must have rank 2, 3 or 4, got {list(sizes)}", "x")
    if ctx.out_shape.sizes() != sizes:
        raise ctx.fail(ShapeError, f"declared shape {list(ctx.out_shape.sizes())} is not x's {list(sizes)}")
    cos_rows, sin_rows = (math.prod(input_sizes(ctx, i)[:-1]) for i in (1, 2))
    if cos_rows != sin_rows:
        raise ctx.fail(ShapeError, f"cos has {cos_rows} rows but sin has {sin_rows}", "sin")

    x = ctx.var(0)
    half = n_rot // 2
    if half == 0:
        return x
    gptj = op.style is ops.RopeStyle.GPTJ
    seq_major = _seq_major_source(ctx) if rank == 4 else None
    if seq_major is not None:  # rotate [B, S, H, D] and make the result head-major after
        heads, heads_view, head_major = seq_major, [sizes[0], sizes[2], sizes[1], sizes[3]], False
    else:
        heads = x if rank == 4 else mb.reshape(x=x, shape=heads_view, name=ctx.name("heads"))
        head_major = rank == 4
    if not gptj and n_rot == head_dim:
        cos, sin_signed = _full_tables(ctx, seq, half, head_major)
        rotated = _rotate_half_full(heads, half, cos, sin_signed, ctx)
    else:
        cos = _table(ctx, 1, "cos", seq, half, head_major, gptj)
        sin = _table(ctx, 2, "sin", seq, half, head_major, gptj)
        if gptj:
            rotated = _rotate_pairs(heads, heads_view, head_dim, n_rot, cos, sin, ctx)
        else:
            rotated = _rotate_halves(heads, head_dim, n_rot, cos, sin, ctx)
    if seq_major is not None:
        return mb.transpose(x=rotated, perm=[0, 2, 1, 3], name=ctx.name())
    if rank == 4:
        return rotated
    return mb.reshape(x=rotated, shape=list(sizes), name=ctx.name())


def _seq_major_source(ctx: LowerContext) -> Any | None:
    """The [B, S, H, D] tensor a rank-4 x was made head-major from by a Transpose (as Hugging
    Face attention does before RoPE), else None. Rotating it before that transpose leaves no
    transpose feeding element-wise ops, so Core ML's costly `reduce_transposes` pass has
    nothing to move and is skipped (`rlx_mil.coreml.pipeline`)."""
    node = ctx.input_node(0)
    if not isinstance(node.op, ops.Transpose) or tuple(node.op.perm) != (0, 2, 1, 3) or ctx.value(0) is not None:
        return None
    return ctx.node_var(node.inputs[0])


def _rotate(first: Any, second: Any, cos: Any, sin: Any, ctx: LowerContext) -> tuple[Any, Any]:
    """(first*cos - second*sin, second*cos + first*sin)."""
    from coremltools.converters.mil import Builder as mb

    new_first = mb.sub(
        x=mb.mul(x=first, y=cos, name=ctx.name("first_cos")),
        y=mb.mul(x=second, y=sin, name=ctx.name("second_sin")),
        name=ctx.name("rot_first"),
    )
    new_second = mb.add(
        x=mb.mul(x=second, y=cos, name=ctx.name("second_cos")),
        y=mb.mul(x=first, y=sin, name=ctx.name("first_sin")),
        name=ctx.name("rot_second"),
    )
    return new_first, new_second


def _rotate_halves(heads: Any, head_dim: int, n_rot: int, cos: Any, sin: Any, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    half = n_rot // 2
    parts = [half, half] + ([head_dim - n_rot] if n_rot < head_dim else [])
    pieces = mb.split(x=heads, split_sizes=parts, axis=-1, name=ctx.name("halves"))
    new_first, new_second = _rotate(pieces[0], pieces[1], cos, sin, ctx)
    return mb.concat(values=[new_first, new_second, *pieces[2:]], axis=-1, name=ctx.name("rotated"))


def _rotate_pairs(
    heads: Any, heads_view: list[int], head_dim: int, n_rot: int, cos: Any, sin: Any, ctx: LowerContext
) -> Any:
    """GptJ: element pairs (2i, 2i+1) of the first n_rot dims rotate by row i of the tables."""
    from coremltools.converters.mil import Builder as mb

    half = n_rot // 2
    if n_rot < head_dim:
        rot, tail = mb.split(x=heads, split_sizes=[n_rot, head_dim - n_rot], axis=-1, name=ctx.name("rot_tail"))
    else:
        rot, tail = heads, None
    pair_view = [*heads_view[:-1], half, 2]
    pairs = mb.reshape(x=rot, shape=pair_view, name=ctx.name("pairs"))
    even, odd = mb.split(x=pairs, split_sizes=[1, 1], axis=-1, name=ctx.name("even_odd"))
    new_even, new_odd = _rotate(even, odd, cos, sin, ctx)
    joined = mb.concat(values=[new_even, new_odd], axis=-1, name=ctx.name("pairs_rotated"))
    rotated = mb.reshape(x=joined, shape=[*heads_view[:-1], n_rot], name=ctx.name("rot_flat"))
    if tail is None:
        return rotated
    return mb.concat(values=[rotated, tail], axis=-1, name=ctx.name("rotated"))


def _axial_tables(op: ops.AxialRope2d, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of every rotated pair's angle, `[S, 1, head_dim/2, 1]` (pairs of the first half
    of a head turn with the token's x, those of the second half with its y), in float32."""
    quarter = op.head_dim // 4
    exponents = np.arange(quarter, dtype=np.float32) * np.float32(4) / np.float32(op.head_dim)
    freqs = (np.float32(1) / np.float32(op.theta) ** exponents).astype(np.float32)
    grid = np.arange(tokens) // max(op.repeat_factor, 1)
    along_x = (grid % op.end_x).astype(np.float32)[:, None] * freqs
    along_y = (grid // op.end_x).astype(np.float32)[:, None] * freqs
    angles = np.concatenate([along_x, along_y], axis=1).astype(np.float32)
    view = (tokens, 1, 2 * quarter, 1)
    return np.cos(angles).reshape(view), np.sin(angles).reshape(view)


@lowering(
    notes=(
        "cos/sin tables computed at conversion (float32 angles, token t at grid position"
        " t // repeat_factor) and baked as consts; `reshape` to [B, S, heads, head_dim/2, 2], `split`"
        " into even/odd lanes, `mul`/`sub`/`add` (complex multiply), `concat`, `reshape` back"
    ),
)
def lower_axial_rope2d(op: ops.AxialRope2d, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    require_float(ctx, 0, "x")
    sizes = input_sizes(ctx, 0)
    tokens = op.end_x * op.end_y * max(op.repeat_factor, 1)
    if op.head_dim < 4 or op.head_dim % 4 or not math.isfinite(op.theta) or op.theta <= 0:
        raise ctx.fail(AttributeValueError,
                         f"head_dim {op.head_dim} must be a positive multiple of 4 and theta {op.theta} finite > 0")
    if len(sizes) != 3 or sizes[1] != tokens or sizes[2] != op.num_heads * op.head_dim:
        raise ctx.fail(ShapeError, f"x must be [B, {tokens}, {op.num_heads * op.head_dim}], got {list(sizes)}",
                         "x")
    cos, sin = _axial_tables(op, tokens)
    cos_c, sin_c = ctx.const(cos, "cos"), ctx.const(sin, "sin")
    pairs = mb.reshape(x=ctx.var(0), shape=[sizes[0], tokens, op.num_heads, op.head_dim // 2, 2],
                       name=ctx.name("pairs"))
    even, odd = mb.split(x=pairs, num_splits=2, axis=4, name=ctx.name("lanes"))
    new_even = mb.sub(x=mb.mul(x=even, y=cos_c, name=ctx.name("even_cos")),
                      y=mb.mul(x=odd, y=sin_c, name=ctx.name("odd_sin")), name=ctx.name("even"))
    new_odd = mb.add(x=mb.mul(x=even, y=sin_c, name=ctx.name("even_sin")),
                     y=mb.mul(x=odd, y=cos_c, name=ctx.name("odd_cos")), name=ctx.name("odd"))
    rotated = mb.concat(values=[new_even, new_odd], axis=4, name=ctx.name("rotated"))
    return mb.reshape(x=rotated, shape=list(sizes), name=ctx.name())
