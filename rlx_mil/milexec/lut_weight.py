"""A palettized weight (an iOS18 `constexpr_lut_to_dense` read by a `linear` or a `gather`, not
feeding a scale) decoded a block of rows at a time, never whole (prepared runs).

The op's value is ``lut[row group, column group, indices]``: one table of 2^n entries per group
of rows and columns (per tensor: one group). `LutWeight` looks the rows it is asked for up in
the tables flattened into one float32 array, at ``index + its group's table offset``, so a
decode is one add (two for tables grouped along the columns too) and one `np.take` per block
of rows: the same values the op gives (the tables' own, as declared), bit for bit. 4-bit
indices stay packed two to a byte (`NibbleCodes`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.milexec.streamed import NibbleCodes, StreamedWeight, codes_of, materialize


class LutWeight(StreamedWeight):
    """The output of one iOS18 `constexpr_lut_to_dense` with scalar table entries."""

    def __init__(self, data: np.ndarray | NibbleCodes, lut: np.ndarray) -> None:
        rows, cols = data.shape
        groups_r, groups_c, entries = lut.shape[0], lut.shape[1], lut.shape[2]
        self.data = data
        self.shape = (int(rows), int(cols))
        self.size = int(rows * cols)
        #: every table, flattened: group (r, c)'s entries start at (r * groups_c + c) * entries.
        self.table = np.ascontiguousarray(lut.reshape(-1), dtype=np.float32)
        #: each row's and each column's share of its table's offset (None: one group).
        self.row_base = None if groups_r == 1 else (
            (np.arange(rows) // (rows // groups_r)) * (groups_c * entries)).astype(np.int32)
        self.col_base = None if groups_c == 1 else ((np.arange(cols) // (cols // groups_c)) * entries).astype(np.int32)

    @classmethod
    def of(cls, op: Any, lookup: Any, round_fp16: bool) -> LutWeight | None:
        """The streamed form of `op`, or None when it is not the plain kind: 2-D integer
        indices, a table [row groups, column groups, 2^n, 1] of floats dividing them evenly (a
        const, or the output of a constexpr op prepared before: `lookup` gives it)
        (the iOS16 form and vector tables are left to the kernel). `round_fp16`: the op's
        output is fp16 as the program runs it (its values are the tables' rounded to fp16)."""
        from rlx_mil.errors import MilExecError
        from rlx_mil.milexec.loader import FourBitCodes

        if op.inputs.get("indices") is None or op.inputs.get("lut") is None:
            return None
        try:  # a table computed by another constexpr op (coremltools scales a table so) is its value
            indices, lut = (materialize(lookup(op.inputs[k])) for k in ("indices", "lut"))
        except MilExecError:  # not computed before this op: left to the kernel
            return None
        if not isinstance(indices, np.ndarray) or not isinstance(lut, np.ndarray) or indices.ndim != 2 \
                or indices.dtype.kind not in "iu" or lut.ndim != 4 or lut.shape[3] != 1 or lut.dtype.kind != "f" \
                or any(g == 0 or n % g for n, g in zip(indices.shape, lut.shape[:2], strict=True)):
            return None
        if op.inputs.get("vector_axis") is not None or lut.shape[2] > 256:
            return None
        data = codes_of(indices) if isinstance(indices, FourBitCodes) else indices
        return cls(data, lut.astype(np.float16) if round_fp16 else lut)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + self.table.nbytes)

    def _rows(self, start: int, stop: int, out: np.ndarray, scratch: np.ndarray) -> np.ndarray:
        grouped = self.row_base is not None or self.col_base is not None
        if isinstance(self.data, NibbleCodes):  # unpacked where the lookup will not write
            held = (out if grouped else scratch).reshape(-1).view(np.uint8)[: out.size].reshape(out.shape)
            codes = self.data.block_into(start, stop, held)
        else:
            codes = self.data[start:stop]
        if not grouped:
            np.take(self.table, codes, out=out)
            return out
        index = scratch.view(np.int32)[: out.size].reshape(out.shape)
        if self.row_base is not None:
            np.add(codes, self.row_base[start:stop, None], out=index)
        else:
            np.copyto(index, codes)
        if self.col_base is not None:
            np.add(index, self.col_base[None, :], out=index)
        np.take(self.table, index, out=out)
        return out

    def take(self, rows: np.ndarray) -> np.ndarray:
        flat = rows.reshape(-1).astype(np.int64)
        codes = self.data.take(flat) if isinstance(self.data, NibbleCodes) else self.data[flat]
        index = codes.astype(np.int64)
        if self.row_base is not None:
            index += self.row_base[flat][:, None]
        if self.col_base is not None:
            index += self.col_base[None, :]
        return self.table[index].reshape((*rows.shape, self.shape[1]))

