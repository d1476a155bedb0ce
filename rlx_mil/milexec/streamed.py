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
order, and the rounding to fp16 is bit-exact (`rlx_mil.milexec.fp16.round_into`; its fast
integer form is used when the scales bound every nonzero value inside the fp16 normal range,
NumPy's cast otherwise), so streamed, cached and plain runs see the same weight values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.milexec.fp16 import FP16_MAX, FP16_NORMAL_MIN, round_exact_into, round_into

#: float32 bytes of one block of rows decoded at a time: fits the L2 cache with its scratch.
BLOCK_BYTES = 1 << 20


class ShiftScaleWeight:
    """The output of one `constexpr_blockwise_shift_scale` op, decoded on request."""

    def __init__(self, data: np.ndarray, scale: np.ndarray, offset: np.ndarray | None, round_fp16: bool,
                 lut: np.ndarray | None = None) -> None:
        #: the integer codes, or with `lut` the indices into it.
        self.data = data
        #: a table of integers (float32, 1-D) the codes index; None: the codes are the values.
        self.lut = None if lut is None else lut.astype(np.float32).reshape(-1)
        self.scale = scale.astype(np.float32)
        self.offset = None if offset is None else offset.astype(np.float32)
        self.shape: tuple[int, ...] = tuple(data.shape)
        self.size = int(data.size)
        self.round_fp16 = round_fp16
        #: rows per block of the scale along axis 0: row ranges start on a multiple of it.
        self.row_block = self.shape[0] // max(1, self.scale.shape[0]) if self.shape else 1
        self.fast_rounding = round_fp16 and self._in_normal_range()

    @classmethod
    def of(cls, op: Any, lookup: Any, round_fp16: bool) -> ShiftScaleWeight | None:
        """The streamed form of `op`, or None when its inputs are not the plain blockwise kind
        (integer codes, or indices into one integer table, see `lut_chain`)."""
        chain = lut_chain(op)
        lut = None
        if chain is not None:
            indices, lut = lookup(chain.inputs["indices"]), lookup(chain.inputs["lut"])
            if not isinstance(indices, np.ndarray) or not isinstance(lut, np.ndarray) or not _one_table(lut, indices):
                return None
            data = indices
        elif _produced_by_const(op.inputs["data"]):
            data = lookup(op.inputs["data"])
        else:
            return None
        scale = lookup(op.inputs["scale"])
        offset = lookup(op.inputs["offset"]) if op.inputs.get("offset") is not None else None
        params = [p for p in (scale, offset) if p is not None]
        if not isinstance(data, np.ndarray) or data.ndim == 0 or data.dtype.kind not in "iu":
            return None
        if any(not isinstance(p, np.ndarray) or p.ndim != data.ndim
               or any(b == 0 or n % b for n, b in zip(data.shape, p.shape, strict=True)) for p in params):
            return None
        return cls(data, scale, offset, round_fp16, lut)

    def _in_normal_range(self) -> bool:
        """Every nonzero value scale * (data - offset) lies in [2^-14, 65504] (the bit form of
        the fp16 rounding holds there): an integer offset keeps nonzero |data - offset| >= 1."""
        scale = np.abs(self.scale)
        if not np.isfinite(scale).all():
            return False
        values = self.data if self.lut is None else self.lut
        low, high = int(values.min(initial=0)), int(values.max(initial=0))
        if self.offset is not None:
            if not np.array_equal(self.offset, np.round(self.offset)):
                return False
            spread = max(abs(high - float(self.offset.min())), abs(low - float(self.offset.max())))
        else:
            spread = max(abs(high), abs(low))
        nonzero = scale[scale > 0]
        return (not nonzero.size or float(nonzero.min()) >= FP16_NORMAL_MIN) and float(scale.max(initial=0)) * spread <= FP16_MAX

    @property
    def row_step(self) -> int:
        """Rows per block for `rows_into` loops: about BLOCK_BYTES of float32, a multiple of
        `row_block`."""
        row_bytes = 4 * (self.size // max(1, self.shape[0]))
        rows = max(1, BLOCK_BYTES // max(1, row_bytes))
        return max(self.row_block, rows - rows % self.row_block)

    def rows_into(self, start: int, stop: int, out: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
        """Rows [start, stop) (start a multiple of `row_block`) into float32 `out`."""
        first, last = start // self.row_block, -(-stop // self.row_block)
        return self._decode(self.data[start:stop], [p[first:last] if p is not None else None for p in (self.scale, self.offset)],
                            out, scratch)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows `rows` (int array, any shape) along axis 0: shape rows.shape + shape[1:]."""
        flat = rows.reshape(-1).astype(np.int64)
        blocks = flat // self.row_block
        params = [p[blocks] if p is not None else None for p in (self.scale, self.offset)]
        out = np.empty((flat.size, *self.shape[1:]), np.float32)
        self._decode(self.data[flat], params, out, None)
        return out.reshape((*rows.shape, *self.shape[1:]))

    def dense(self) -> np.ndarray:
        """The whole weight, float32 (its values rounded as declared)."""
        out = np.empty(self.shape, np.float32)
        return self.fill(out)

    def fill(self, out: np.ndarray) -> np.ndarray:
        """The whole weight into float32 `out`, a block of rows at a time (no temporary of
        the weight's size)."""
        step = self.row_step
        scratch = np.empty(step * (self.size // max(1, self.shape[0])), np.int32)
        for start in range(0, self.shape[0], step):
            stop = min(self.shape[0], start + step)
            self.rows_into(start, stop, out[start:stop], scratch)
        return out

    def _decode(self, data: np.ndarray, params: list[np.ndarray | None], out: np.ndarray,
                scratch: np.ndarray | None) -> np.ndarray:
        scale, offset = params
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
            if self.fast_rounding:
                round_into(out, scratch)
            else:
                round_exact_into(out, scratch)
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
    """An iOS18 `lut` [1, ..., 1, 2^n, 1] of integers: one table for every index, no vectors."""
    return (lut.ndim == indices.ndim + 2 and all(d == 1 for d in lut.shape[:-2]) and lut.shape[-1] == 1
            and lut.dtype.kind in "iu" and indices.ndim > 0 and indices.dtype.kind in "iu")


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
    return value.dense() if isinstance(value, ShiftScaleWeight) else value
