"""Compressed weights decoded a block of rows at a time, never whole (prepared runs).

A `constexpr_blockwise_shift_scale` weight (what int8 / int4 compression writes) is, as the
program declares it, ``fp16(scale * (data - offset))``: the float32 product rounded once to the
op's output dtype. Its `data` may itself be the output of a `constexpr_lut_to_dense` with one
integer table (the LUT-then-scale form of GGUF codes on iOS26): data = lut[indices], looked up
a block of rows at a time too. `ShiftScaleWeight` computes exactly those values for any rows it
is asked for, into a buffer the caller reuses:

* `rows_into(start, stop, out)`: rows ``[start, stop)`` as float32 (`linear` multiplies a
  block of its weight at a time, see `rlx_mil.milexec.kernels.linalg`);
* `take(rows)`: the rows an embedding `gather` reads, and nothing else;
* `dense()`: the whole weight, for any other reader.

The float32 arithmetic is the kernel's own (`rlx_mil.milexec.kernels.quant`), in the same
order, and the rounding to fp16 is bit-exact, so streamed, cached and plain runs see the same
weight values. Where the scales bound every nonzero value inside the fp16 normal range the
rounding is Veltkamp's splitting (`rlx_mil.milexec.fp16.round_split_into`, three float passes;
`split_rounding_holds` has checked it against NumPy's cast on every scale times every integer
the codes can hold) or, for integer ranges too wide to check, the integer form `round_into`;
NumPy's cast otherwise.

4-bit codes (`NibbleCodes`) stay packed two to a byte: a quarter of the fp16 weight's bytes
instead of the half that one byte per code takes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.milexec.fp16 import (
    FP16_MAX,
    FP16_NORMAL_MIN,
    round_exact_into,
    round_into,
    round_split_into,
    split_rounding_holds,
)

#: float32 bytes of rows decoded (and multiplied) at a time: large enough that NumPy's cost
#: per call stays small against the work (256 KB blocks decoded ~8% slower per element here).
BLOCK_BYTES = 1 << 20
#: Rows of a weight one matrix product of a blocked `linear` covers are a multiple of this.
PRODUCT_ALIGN = 64


def product_rows(depth: int) -> int:
    """Rows of a 2-D weight with `depth` columns that one matrix product of a blocked `linear`
    covers: about BLOCK_BYTES of float32, a multiple of PRODUCT_ALIGN. Every form of a weight
    (fp16 widened, compressed decoded, float32 held) is multiplied in these same row blocks
    when more than one row multiplies it: BLAS sums a product in an order that depends on the
    block's size, so the same blocks give the same numbers. A one-row product (a decode
    step's) over a float32 weight held whole gives the blocks' numbers too when the blocks are
    multiples of PRODUCT_ALIGN (tests/milexec/test_milexec_prepared.py checks it)."""
    rows = BLOCK_BYTES // max(1, 4 * depth)
    return max(PRODUCT_ALIGN, rows - rows % PRODUCT_ALIGN)
#: Integer ranges (high - low) up to this wide are checked for `round_split_into`.
SPLIT_CHECK_SPAN = 512


class NibbleCodes:
    """The 4-bit codes of a 2-D weight with an even number of columns, two to a byte, laid out
    for contiguous unpacking: the rows are cut into blocks of `block_rows` (the last may be
    shorter), and byte j of a block's bytes holds code j of the block (its codes in row-major
    order) in its low nibble and code j + n/2 (n: the block's codes) in its high nibble. An
    int4 code k is held as k + 8. Built from a blob's bytes (each byte two consecutive codes,
    the first in the low nibble), a block at a time."""

    def __init__(self, packed: np.ndarray, shape: tuple[int, int], signed: bool, block_rows: int) -> None:
        rows, cols = shape
        self.shape = shape
        self.size = rows * cols
        self.signed = signed
        self.dtype = np.dtype(np.int8 if signed else np.uint8)
        self.block_rows = block_rows
        self.bytes = np.empty(self.size // 2, np.uint8)
        codes = np.empty(block_rows * cols, np.uint8)
        for start in range(0, rows, block_rows):
            stop = min(rows, start + block_rows)
            n = (stop - start) * cols
            source, block = packed[start * cols // 2:stop * cols // 2], codes[:n]
            np.bitwise_and(source, 0x0F, out=block[0::2])
            np.right_shift(source, 4, out=block[1::2])
            if signed:
                np.bitwise_xor(block, 8, out=block)
            target = self.bytes[start * cols // 2:stop * cols // 2]
            np.left_shift(block[n // 2:], 4, out=target)
            np.bitwise_or(target, block[: n // 2], out=target)

    @property
    def nbytes(self) -> int:
        return int(self.bytes.nbytes)

    def block_into(self, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        """Codes of the block of rows [start, stop) (start a multiple of `block_rows`, stop its
        end) into `out` (int8 for int4, uint8 for uint4; shape (stop - start, cols))."""
        cols = self.shape[1]
        n = (stop - start) * cols
        source = self.bytes[start * cols // 2:stop * cols // 2]
        flat = out.reshape(-1).view(np.uint8)
        low, high = flat[: n // 2], flat[n // 2:]
        if n % 4 == 0:  # two bytes at a time
            source, low, high = source.view(np.uint16), low.view(np.uint16), high.view(np.uint16)
            mask: Any = np.uint16(0x0F0F)
        else:
            mask = np.uint8(0x0F)
        np.bitwise_and(source, mask, out=low)
        np.right_shift(source, 4, out=high)
        np.bitwise_and(high, mask, out=high)
        if self.signed:
            np.subtract(flat, np.uint8(8), out=flat)  # k + 8 -> k, two's complement
        return out

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Codes of the rows `rows` (a flat int array)."""
        cols, block = self.shape[1], self.block_rows
        first = (rows // block) * block
        count = np.minimum(self.shape[0] - first, block) * cols  # codes of each row's block
        where = (rows - first)[:, None] * cols + np.arange(cols)[None, :]
        high = where >= (count // 2)[:, None]
        index = first[:, None] * cols // 2 + np.where(high, where - (count // 2)[:, None], where)
        picked = self.bytes[index]
        codes = np.where(high, picked >> 4, picked & 0x0F).astype(np.uint8)
        if self.signed:
            return (codes.view(np.int8) - np.int8(8)).astype(np.int8)
        return codes

    def dense(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        for start in range(0, self.shape[0], self.block_rows):
            stop = min(self.shape[0], start + self.block_rows)
            self.block_into(start, stop, out[start:stop])
        return out


class StreamedWeight:
    """A weight a prepared run decodes on request (see the module doc): `data` holds its codes
    (`NibbleCodes` or an integer array) and `shape` its shape; subclasses decode rows."""

    data: np.ndarray | NibbleCodes
    shape: tuple[int, ...]
    size: int

    @property
    def row_step(self) -> int:
        """Rows decoded at a time by `rows_into`: `product_rows` (the codes' blocks)."""
        if isinstance(self.data, NibbleCodes):
            return self.data.block_rows
        return product_rows(self.size // max(1, self.shape[0]))

    def scratch(self) -> np.ndarray:
        """A float32 buffer for `rows_into` (reused between calls)."""
        return np.empty(self.row_step * (self.size // max(1, self.shape[0])), np.float32)

    def rows_into(self, start: int, stop: int, out: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
        """Rows [start, stop) into float32 `out`, a block of `row_step` rows at a time (a
        block only partly asked for is decoded whole into a buffer first); `scratch` from
        `scratch()`."""
        if scratch is None:
            scratch = self.scratch()
        step, rows = self.row_step, self.shape[0]
        for block in range(start - start % step, stop, step):
            end = min(rows, block + step)
            lo, hi = max(start, block), min(stop, end)
            if lo == block and hi == end:
                self._rows(block, end, out[block - start:end - start], scratch)
            else:
                whole = self._rows(block, end, np.empty((end - block, *self.shape[1:]), np.float32), scratch)
                out[lo - start:hi - start] = whole[lo - block:hi - block]
        return out

    def dense(self) -> np.ndarray:
        """The whole weight, float32 (its values rounded as declared)."""
        out = np.empty(self.shape, np.float32)
        return self.fill(out)

    def fill(self, out: np.ndarray) -> np.ndarray:
        """The whole weight into float32 `out`, a block of rows at a time (no temporary of
        the weight's size)."""
        return self.rows_into(0, self.shape[0], out)

    def _rows(self, start: int, stop: int, out: np.ndarray, scratch: np.ndarray) -> np.ndarray:
        """Rows [start, stop) (one block of `row_step`) into float32 `out`."""
        raise NotImplementedError

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows `rows` (int array, any shape) along axis 0: shape rows.shape + shape[1:]."""
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        raise NotImplementedError


class ShiftScaleWeight(StreamedWeight):
    """The output of one `constexpr_blockwise_shift_scale` op, decoded on request."""

    def __init__(self, data: np.ndarray | NibbleCodes, scale: np.ndarray, offset: np.ndarray | None,
                 round_fp16: bool, lut: np.ndarray | None = None, bias: np.ndarray | None = None) -> None:
        #: the integer codes, or with `lut` the indices into it.
        self.data = data
        #: a table (float32, 1-D: integers, or fp16 values) the codes index; None: the codes
        #: are the values.
        self.lut = None if lut is None else lut.astype(np.float32).reshape(-1)
        self.scale = scale.astype(np.float32)
        self.offset = None if offset is None else offset.astype(np.float32)
        #: added after the scaling (and its rounding), then rounded again: the run-time `add`
        #: of a weight held split (`rlx_mil.milexec.split_weight`); None for a plain one.
        self.bias = None if bias is None else bias.astype(np.float32)
        self.shape: tuple[int, ...] = tuple(data.shape)
        self.size = int(data.size)
        self.round_fp16 = round_fp16
        #: rows per block of the scale along axis 0: row ranges start on a multiple of it.
        self.row_block = self.shape[0] // max(1, self.scale.shape[0]) if self.shape else 1
        spread: tuple[int, int] | None = None
        if self.lut is not None and not (np.isfinite(self.lut).all() and np.array_equal(self.lut, np.round(self.lut))):
            # a table of fractions (lut4-scaled): scale * value, each an fp16 value
            self.fast_rounding = round_fp16 and self.offset is None and self._table_in_normal_range()
        else:
            if self.lut is not None:
                low, high = int(self.lut.min(initial=0)), int(self.lut.max(initial=0))
            elif isinstance(data, NibbleCodes):
                low, high = (-8, 7) if data.signed else (0, 15)
            else:
                low, high = int(data.min(initial=0)), int(data.max(initial=0))
            spread = self._integer_range(low, high)
            self.fast_rounding = round_fp16 and spread is not None and self._in_normal_range(*spread)
        #: the fp16 rounding by `round_split_into` (checked on every value the codes give).
        self.split_rounding = (self.fast_rounding and spread is not None and spread[1] - spread[0] <= SPLIT_CHECK_SPAN
                               and split_rounding_holds(*spread))
        #: the bias's sum rounds by `round_into`: see `_sum_in_range`.
        self.fast_sum = self.fast_rounding and spread is not None and self._sum_in_range(*spread)

    @classmethod
    def of(cls, op: Any, lookup: Any, round_fp16: bool, round_table: bool = False) -> ShiftScaleWeight | None:
        """The streamed form of `op`, or None when its inputs are not the plain blockwise kind
        (integer codes, or indices into one table, see `lut_chain`). 4-bit codes read
        with `load_program(..., packed_4bit=True)` stay packed. `round_table`: the table's
        lookup is fp16 as the program runs it (a float table's values round to fp16)."""
        from rlx_mil.milexec.loader import FourBitCodes, release

        chain = lut_chain(op)
        lut = None
        if chain is not None:
            indices, lut = lookup(chain.inputs["indices"]), lookup(chain.inputs["lut"])
            if not isinstance(indices, np.ndarray) or not isinstance(lut, np.ndarray) or not _one_table(lut, indices):
                return None
            if round_table and lut.dtype.kind == "f":
                lut = lut.astype(np.float16)  # the lookup's values as the program holds them
            data = indices
        elif _produced_by_const(op.inputs["data"]):
            data = lookup(op.inputs["data"])
        else:
            return None
        scale = lookup(op.inputs["scale"])
        offset = lookup(op.inputs["offset"]) if op.inputs.get("offset") is not None else None
        # A 4-bit offset (or table) is small: its codes, unpacked.
        scale, offset, lut = (v.unpacked() if isinstance(v, FourBitCodes) else v for v in (scale, offset, lut))
        params = [p for p in (scale, offset) if p is not None]
        if not isinstance(data, np.ndarray) or data.ndim == 0 or data.dtype.kind not in "iu" \
                or not isinstance(scale, np.ndarray):
            return None
        if any(not isinstance(p, np.ndarray) or p.ndim != data.ndim
               or any(b == 0 or n % b for n, b in zip(data.shape, p.shape, strict=True)) for p in params):
            return None
        weight = cls(codes_of(data) if isinstance(data, FourBitCodes) else data, scale, offset, round_fp16, lut)
        # Held as float32 and repacked now: the file's pages are read once, then dropped.
        for param in (*params, data.packed if isinstance(data, FourBitCodes) else data):
            release(param)
        return weight

    def _integer_range(self, low: int, high: int) -> tuple[int, int] | None:
        """The range of data - offset (an integer when the offset is), or None (a fractional
        offset)."""
        if self.offset is None:
            return low, high
        if not np.isfinite(self.offset).all() or not np.array_equal(self.offset, np.round(self.offset)):
            return None
        return low - int(self.offset.max(initial=0)), high - int(self.offset.min(initial=0))

    def _in_normal_range(self, low: int, high: int) -> bool:
        """Every nonzero value scale * k, k in [low, high] an integer, lies in [2^-14, 65504]
        (the fast forms of the fp16 rounding hold there): nonzero |k| >= 1."""
        scale = np.abs(self.scale)
        if not np.isfinite(scale).all():
            return False
        spread = max(abs(low), abs(high))
        nonzero = scale[scale > 0]
        return (not nonzero.size or float(nonzero.min()) >= FP16_NORMAL_MIN) and float(scale.max(initial=0)) * spread <= FP16_MAX

    def _table_in_normal_range(self) -> bool:
        """Every nonzero product of a table value and a scale lies in [2^-14, 65504], where
        `round_into` is NumPy's cast: the smallest nonzero magnitudes' product and the largest
        ones' bound them."""
        assert self.lut is not None
        table, scale = np.abs(self.lut), np.abs(self.scale)
        if not np.isfinite(scale).all():
            return False
        small = [float(v[v > 0].min(initial=np.inf)) for v in (table, scale)]
        return small[0] * small[1] >= FP16_NORMAL_MIN and float(table.max(initial=0)) * float(scale.max(initial=0)) <= FP16_MAX

    def _sum_in_range(self, low: int, high: int) -> bool:
        """The sum of an fp16 product and an fp16 bias lies in [-FP16_MAX, FP16_MAX] (a finite
        bias, and the largest products plus the largest bias inside it): there `round_into`
        is NumPy's cast. Both terms are multiples of 2^-24, so a sum below the normal range
        is an fp16 subnormal exactly, which `round_into` (and the float32 add) leave as is."""
        if self.bias is None:
            return True
        bias = np.abs(self.bias)
        if not np.isfinite(bias).all():
            return False
        # the product as rounded to fp16 may exceed the exact one by 2^-11 of it
        largest = float(np.abs(self.scale).max(initial=0)) * max(abs(low), abs(high)) * (1 + 2.0**-10)
        return largest + float(bias.max(initial=0)) <= FP16_MAX

    @property
    def nbytes(self) -> int:
        """Bytes the codes and the float32 scales (and offsets) hold."""
        codes = self.data.nbytes
        return int(codes + sum(p.nbytes for p in (self.scale, self.offset, self.bias) if p is not None))

    def _rows(self, start: int, stop: int, out: np.ndarray, scratch: np.ndarray) -> np.ndarray:
        params = [_row_params(p, self.row_block, start, stop) if p is not None else None
                  for p in (self.scale, self.offset, self.bias)]
        if isinstance(self.data, NibbleCodes):
            codes = scratch.view(np.int8 if self.data.signed else np.uint8)[: out.size].reshape(out.shape)
            data = self.data.block_into(start, stop, codes)
        else:
            data = self.data[start:stop]
        return self._decode(data, params, out, scratch)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows `rows` (int array, any shape) along axis 0: shape rows.shape + shape[1:]."""
        flat = rows.reshape(-1).astype(np.int64)
        blocks = flat // self.row_block
        params = [p[blocks] if p is not None else None for p in (self.scale, self.offset, self.bias)]
        out = np.empty((flat.size, *self.shape[1:]), np.float32)
        data = self.data.take(flat) if isinstance(self.data, NibbleCodes) else self.data[flat]
        self._decode(data, params, out, None)
        return out.reshape((*rows.shape, *self.shape[1:]))

    def _decode(self, data: np.ndarray, params: list[np.ndarray | None], out: np.ndarray,
                scratch: np.ndarray | None) -> np.ndarray:
        scale, offset, bias = params
        if self.lut is None:
            np.copyto(out, data)  # integers are exact in float32
        else:  # every index is inside the table (its width's range): "clip" never clips
            np.take(self.lut, data, out=out, mode="clip")
        assert scale is not None
        view, scale_view = _blocked(out, scale)
        if offset is not None:
            np.subtract(view, _blocked(out, offset)[1], out=view)
        np.multiply(view, scale_view, out=view)
        if self.round_fp16:
            if scratch is None or scratch.size < out.size:
                scratch = np.empty(out.size, np.float32)
            if self.split_rounding:
                round_split_into(out, scratch)
            elif self.fast_rounding:
                round_into(out, scratch.view(np.int32))
            else:
                round_exact_into(out, scratch.view(np.int32))
        if bias is not None:  # the split form's run-time add, in float32, then rounded as declared
            np.add(view, _blocked(out, bias)[1], out=view)
            if self.round_fp16:
                assert scratch is not None
                (round_into if self.fast_sum else round_exact_into)(out, scratch.view(np.int32))
        return out


def lut_chain(op: Any) -> Any:
    """The `constexpr_lut_to_dense` op whose output is the `data` of the
    `constexpr_blockwise_shift_scale` `op` and nothing else's (None when there is none)."""
    var = op.inputs.get("data")
    producer = getattr(var, "op", None)
    if producer is None or producer.op_type != "constexpr_lut_to_dense" or len(var.child_ops) != 1:
        return None
    block = producer.enclosing_block
    return None if block is not None and var in block.outputs else producer


def _produced_by_const(var: Any) -> bool:
    producer = getattr(var, "op", None)
    return producer is not None and producer.op_type == "const"


def _one_table(lut: np.ndarray, indices: np.ndarray) -> bool:
    """An iOS18 `lut` [1, ..., 1, 2^n, 1]: one table for every index, no vectors."""
    return (lut.ndim == indices.ndim + 2 and all(d == 1 for d in lut.shape[:-2]) and lut.shape[-1] == 1
            and lut.dtype.kind in "iuf" and indices.ndim > 0 and indices.dtype.kind in "iu")


def codes_of(stand_in: Any) -> np.ndarray | NibbleCodes:
    """The codes of a `FourBitCodes` stand-in: packed for a 2-D weight of even width, else
    unpacked."""
    if stand_in.ndim == 2 and stand_in.shape[1] % 2 == 0:
        shape = (int(stand_in.shape[0]), int(stand_in.shape[1]))
        return NibbleCodes(stand_in.packed, shape, stand_in.signed, product_rows(shape[1]))
    return stand_in.unpacked()


def _row_params(param: np.ndarray, row_block: int, start: int, stop: int) -> np.ndarray:
    """The blocks of `param` (one per `row_block` rows along axis 0) that rows [start, stop)
    read, repeated to one per row where the range does not start and end on block bounds."""
    first, last = start // row_block, -(-stop // row_block)
    blocks = param[first:last]
    if row_block == 1 or (start % row_block == 0 and (stop - start) % row_block == 0):
        return blocks
    return np.repeat(blocks, row_block, axis=0)[start - first * row_block:stop - first * row_block]


def _blocked(values: np.ndarray, param: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`values` viewed as (blocks, block size) per axis and `param` shaped to broadcast over
    each block: the kernel's `np.repeat` of the parameter without its copy."""
    shape: list[int] = []
    param_shape: list[int] = []
    for full, blocks in zip(values.shape, param.shape, strict=True):
        shape += [blocks, full // blocks]
        param_shape += [blocks, 1]
    return values.reshape(shape), param.reshape(param_shape)


def materialize(value: Any) -> Any:
    """A streamed weight as its whole float32 array; anything else unchanged."""
    return value.dense() if isinstance(value, StreamedWeight) else value
