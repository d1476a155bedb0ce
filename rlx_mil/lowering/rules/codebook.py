"""SynthMatMul and SynthReconstruct. With the indices and codebook known at conversion, iOS18+
holds them as Core ML vector palettization: one `constexpr_lut_to_dense` (the codebook padded
to a power-of-two number of entries, `vector_axis=1`, indices at 1, 2, 3, 4, 6 or 8 bits)
rebuilding the `[n, k]` weight, fed to `linear` - the package keeps the codes, not the weight.
A code that needs 5 or 7 bits (17-32 or 65-128 entries) has no index type of its own; rounding
it up to 6 or 8 bits would store 1.2x / 1.14x the codes' bytes, so it is held split instead
(`_split_vector_lut`): the low 4 / 6 bits index a table whose entry j is the pair (codebook[j],
codebook[j + 2^low]) and a 1-bit index picks one half of the pair with a `select` at run time.
iOS16-17 have no vector LUT: the indices are held at their own width as integer codes and
`gather` the codebook's rows at run time; iOS15 (no constexpr ops) gets the decoded weight.
Run-time indices or codebooks `gather` the rows at run time."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.errors import AttributeValueError
from rlx_mil.ir import ops
from rlx_mil.ir.ops.codebook import SynthKind
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.rules.quant_support import finish, integer_codes, linear
from rlx_mil.lowering.rules.shape import gather_indices
from rlx_mil.lowering.target import Target

#: Index widths `constexpr_lut_to_dense` takes (uint1..uint8 without 5 and 7).
LUT_BITS = (1, 2, 3, 4, 6, 8)


def lut_bits(num_entries: int) -> int:
    """The narrowest LUT index width holding `num_entries` entries."""
    return next(bits for bits in LUT_BITS if 2**bits >= num_entries)


def code_bits(num_entries: int) -> int:
    """The bits a code of `num_entries` entries needs (at least 1): what the package stores,
    as one index (a width in `LUT_BITS`) or split into `code_bits - 1` low bits and 1 high bit."""
    return max(1, (num_entries - 1).bit_length())


def _known_indices(ctx: LowerContext, kind: SynthKind, i: int) -> np.ndarray | None:
    value = ctx.known_value(i)
    if value is None:
        return None
    arr = np.asarray(value)
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise ctx.fail(AttributeValueError, "constant indices must be finite", "indices")
    idx = np.trunc(arr.astype(np.float64)).astype(np.int64) if arr.dtype.kind == "f" else arr.astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= kind.num_entries):
        raise ctx.fail(AttributeValueError, f"constant indices must lie in [0, {kind.num_entries})", "indices")
    return idx


def _index_dtype(bits: int) -> Any:
    from coremltools.converters.mil.mil import types

    return np.uint8 if bits == 8 else getattr(types, f"np_uint{bits}_dtype")


def _vector_lut(ctx: LowerContext, kind: SynthKind, idx: np.ndarray, codebook: np.ndarray) -> Any:
    """`[n, k]` weight as one iOS18 `constexpr_lut_to_dense` (vector palettization), or held
    split where the code needs 5 or 7 bits."""
    from coremltools.converters.mil import Builder as mb

    bits = code_bits(kind.num_entries)
    if bits not in LUT_BITS:
        return _split_vector_lut(ctx, kind, idx, codebook, bits)
    lut = np.zeros((2**bits, kind.entry_dim), ctx.float_dtype)
    lut[: kind.num_entries] = codebook.astype(ctx.float_dtype)
    return mb.constexpr_lut_to_dense(indices=idx.astype(_index_dtype(bits)), lut=lut.reshape(1, 1, 2**bits, kind.entry_dim),
                                     vector_axis=1, name=ctx.name("weight"))


def _split_vector_lut(ctx: LowerContext, kind: SynthKind, idx: np.ndarray, codebook: np.ndarray, bits: int) -> Any:
    """A `bits`-wide code (5 or 7) as `bits - 1` low bits and 1 high bit, each an index type
    Core ML has. The low bits index a vector LUT whose entry j is codebook rows j and
    j + 2^(bits-1) side by side (`[n, blocks * 2d]`); the high bit, decoded to 0 / 1 and cast
    to bool, `select`s the second half of each pair. A select moves values, so the weight is
    the codebook's entries exactly (in fp16 as in fp32, whatever they hold); the package stores
    `bits` bits a code plus the codebook (GGUF's split, `compress.prequantized.split_op`, adds
    its two tables instead, which only integer codes allow)."""
    from coremltools.converters.mil import Builder as mb

    d = kind.entry_dim
    half = 1 << (bits - 1)
    n, blocks = idx.shape
    table = np.zeros((2 * half, d), ctx.float_dtype)
    table[: kind.num_entries] = codebook.astype(ctx.float_dtype)
    pairs = np.concatenate([table[:half], table[half:]], axis=1)  # entry j: (row j, row j + half)
    low = mb.constexpr_lut_to_dense(indices=(idx & (half - 1)).astype(_index_dtype(bits - 1)),
                                    lut=pairs.reshape(1, 1, half, 2 * d), vector_axis=1, name=ctx.name("weight_pairs"))
    high = mb.constexpr_lut_to_dense(indices=(idx >> (bits - 1)).astype(_index_dtype(1)),
                                     lut=np.asarray([0, 1], ctx.float_dtype).reshape(1, 1, 2, 1),
                                     name=ctx.name("weight_high"))
    pick = mb.cast(x=mb.reshape(x=high, shape=np.asarray([n, blocks, 1], np.int32), name=ctx.name("weight_high_3d")),
                   dtype="bool", name=ctx.name("weight_pick"))
    pairs_3d = mb.reshape(x=low, shape=np.asarray([n, blocks, 2 * d], np.int32), name=ctx.name("weight_pairs_3d"))
    first = mb.slice_by_size(x=pairs_3d, begin=np.asarray([0, 0, 0], np.int32), size=np.asarray([n, blocks, d], np.int32),
                             name=ctx.name("weight_first"))
    second = mb.slice_by_size(x=pairs_3d, begin=np.asarray([0, 0, d], np.int32), size=np.asarray([n, blocks, d], np.int32),
                              name=ctx.name("weight_second"))
    picked = mb.select(cond=pick, a=second, b=first, name=ctx.name("weight_picked"))
    return mb.reshape(x=picked, shape=np.asarray([n, blocks * d], np.int32), name=ctx.name("weight"))


def _held_indices(ctx: LowerContext, kind: SynthKind, idx: np.ndarray, codebook: Any) -> Any:
    """The indices held at their own width as integer codes (`integer_codes`: an identity-table
    `constexpr_lut_to_dense`, or two summed for 3, 5 and 7 bits), cast to int32, `gather` of the
    codebook's rows (a const, or a run-time var) at run time: iOS16-17 (no vector LUT), and any
    iOS16+ target whose codebook is known only at run time."""
    from coremltools.converters.mil import Builder as mb

    n, blocks = idx.shape
    codes = integer_codes(ctx, idx, code_bits(kind.num_entries), "weight_codes")
    flat = mb.reshape(x=codes, shape=np.asarray([n * blocks], np.int32), name=ctx.name("weight_codes_flat"))
    flat = mb.cast(x=flat, dtype="int32", name=ctx.name("weight_indices"))
    table = ctx.const(codebook, "codebook") if isinstance(codebook, np.ndarray) else codebook
    rows = mb.gather(x=table, indices=flat, axis=0, name=ctx.name("weight_rows"))
    return mb.reshape(x=rows, shape=np.asarray([n, blocks * kind.entry_dim], np.int32), name=ctx.name("weight"))


def synth_weight_var(ctx: LowerContext, kind: SynthKind) -> tuple[Any, bool]:
    """The `[n, k]` weight of a node with inputs (.., indices, codebook) as the last two, and
    whether it is a const (compressed or decoded) `linear` can take (a split code is not: its
    `select` runs at run time)."""
    from coremltools.converters.mil import Builder as mb

    i_idx, i_cb = ctx.num_inputs - 2, ctx.num_inputs - 1
    n, blocks = ctx.input_shape(i_idx).sizes()
    idx = _known_indices(ctx, kind, i_idx)
    codebook = ctx.known_value(i_cb)
    if idx is not None and codebook is not None:
        cb = np.asarray(codebook, np.float32)
        if ctx.target >= Target.IOS18:
            weight = _vector_lut(ctx, kind, idx, cb)
            return weight, weight.op.op_type == "constexpr_lut_to_dense"
        if ctx.target >= Target.IOS16:
            return _held_indices(ctx, kind, idx, cb), False
        weight = cb[idx].reshape(n, blocks * kind.entry_dim)
        return ctx.const(weight, "weight"), True
    if idx is not None and ctx.target >= Target.IOS16:  # a run-time codebook: the indices stay codes
        return _held_indices(ctx, kind, idx, ctx.var(i_cb)), False
    flat = gather_indices(ctx, kind.num_entries, i_idx, "indices")
    flat = mb.reshape(x=flat, shape=np.asarray([n * blocks], np.int32), name=ctx.name("flat_indices"))
    rows = mb.gather(x=ctx.var(i_cb), indices=flat, axis=0, name=ctx.name("rows"))
    weight = mb.reshape(x=rows, shape=np.asarray([n, blocks * kind.entry_dim], np.int32), name=ctx.name("weight"))
    return weight, False


@lowering(
    notes=(
        "indices and codebook known: iOS18+ one `constexpr_lut_to_dense` (vector palettization: the"
        " codebook padded to 2^b entries, b in 1,2,3,4,6,8, `vector_axis=1`) rebuilding W [n, k], then"
        " `linear` (the package holds the b-bit codes and the codebook); a 5- or 7-bit code (17-32 or"
        " 65-128 entries) is held split: a 4- / 6-bit `constexpr_lut_to_dense` of codebook row pairs and"
        " a 1-bit one cast to bool that `select`s each pair's half, then `matmul`; iOS16-17 the indices"
        " at their own width as identity-table `constexpr_lut_to_dense` codes (3/5/7 bits as two summed),"
        " `cast` to int32, `gather` of codebook rows, `matmul`; iOS15 the decoded W as a `linear` const."
        " Run-time codebook with known indices: iOS16+ the indices as those integer codes, `gather` of the"
        " codebook's rows; run-time indices: `gather`, `reshape`, `matmul` with transpose_y."
    ),
)
def lower_synth_matmul(op: ops.SynthMatMul, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    weight, is_const = synth_weight_var(ctx, op.kind)
    x = ctx.var(0)
    if is_const:
        return linear(ctx, x, weight)
    return finish(ctx, mb.matmul(x=x, y=weight, transpose_y=True, name=ctx.name("matmul")))


@lowering(
    notes=(
        "W [n, k] (upstream's shape inference). Known indices and codebook: held as for SynthMatMul"
        " (iOS18+ vector LUT, 5 / 7 bits split; iOS16-17 integer codes + `gather`; iOS15 the decoded"
        " const); a run-time codebook `gather`s by the held indices (iOS16+) or by run-time indices."
    ),
)
def lower_synth_reconstruct(op: ops.SynthReconstruct, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    weight, _ = synth_weight_var(ctx, op.kind)
    return mb.identity(x=weight, name=ctx.name()) if weight.op.op_type == "constexpr_lut_to_dense" else weight
