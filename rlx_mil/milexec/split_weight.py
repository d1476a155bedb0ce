"""Weights held split (`rlx_mil.compress.prequantized.split_op`: a GGUF code as an index of its
own width into a table of its integer values — a 5-bit one as a 4-bit and a 1-bit table summed —
then scaled at run time) as one streamed weight.

The package computes such a weight with ordinary ops every prediction: one
`constexpr_lut_to_dense` (integer values in a float table) or two and their `add`, a `reshape`
into blocks, a `mul` by the block scales, an optional `add` of the block biases, a `reshape`
back. `split_chain` finds those ops; `split_weight` turns them into a `ShiftScaleWeight` whose
codes are the table's values (the two tables' sums; one int8 a weight, computed once) and whose
scale and bias are the consts: a prepared run then decodes it a block of rows at a time inside `linear` (or row by row
in `gather`), or once into the cache of ``"fast"``, instead of running the six ops on the whole
weight each call. The arithmetic is the ops' own: the sum of two small integers is exact, the
product is computed in float32 and rounded as the `mul` declares, the bias added in float32
and rounded as the `add` declares, so the values are the op-by-op run's bit for bit
(tests/milexec/test_milexec_split_weight.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.milexec.streamed import ShiftScaleWeight

#: Codes summed a block of this many at a time (bounds the index temporaries).
_SUM_BLOCK = 1 << 20


def split_chain(op: Any) -> list[Any] | None:
    """The ops of a weight held split ending in the `reshape` `op`, in program order: one
    `constexpr_lut_to_dense` (or two and their `add`), `reshape` into blocks, `mul` by the const scale,
    `add` of the const bias (optional), `reshape`; None when `op` ends no such chain (or a
    part of it has another reader)."""
    chain = [op]
    current = _other_input(op, "x")
    for kind, optional in (("add", True), ("mul", False)):
        if current is not None and current.op_type == kind and _const_operand(current) is not None:
            chain.append(current)
            current = _const_operand(current)
        elif not optional:
            return None
    if current is None or current.op_type != "reshape":
        return None
    chain.append(current)
    summed = _other_input(current, "x")
    if summed is not None and summed.op_type == "constexpr_lut_to_dense":
        chain.append(summed)
    else:
        if summed is None or summed.op_type != "add":
            return None
        tables = [_other_input(summed, key) for key in ("x", "y")]
        if not all(t is not None and t.op_type == "constexpr_lut_to_dense" for t in tables):
            return None
        chain += [summed, *tables]
    inside = {id(part) for part in chain}
    if any(len(part.outputs[0].child_ops) != 1 or id(part.outputs[0].child_ops[0]) not in inside for part in chain[1:]):
        return None
    return chain[::-1]


def split_weight(chain: list[Any], lookup: Any, round_fp16: bool) -> ShiftScaleWeight | None:
    """The streamed form of the split weight `chain` (from `split_chain`), or None when its
    parts are not the plain kind (2-D indices into one table each whose values (sums) are
    integers an int8 holds, a scale and bias of one value per block of each row). `lookup` gives a var's
    value (4-bit indices may be `FourBitCodes` stand-ins); `round_fp16`: the program rounds
    the product and the sum to fp16 (declared fp16, the declared precision model)."""
    from rlx_mil.milexec.loader import FourBitCodes

    one = chain[1].op_type == "reshape"  # one table, no sum
    tables, (blocks, scaled, *rest) = (chain[:1], chain[1:]) if one else (chain[:2], chain[3:])
    biased = rest[0] if len(rest) == 2 else None
    final = rest[-1]
    parts = []
    for table_op in tables:
        indices, lut = lookup(table_op.inputs["indices"]), lookup(table_op.inputs["lut"])
        if isinstance(indices, FourBitCodes):
            indices = indices.unpacked()
        if not isinstance(indices, np.ndarray) or not isinstance(lut, np.ndarray) or indices.ndim != 2 \
                or indices.dtype.kind not in "iu" or lut.ndim != 4 or lut.shape[:2] != (1, 1) or lut.shape[3] != 1:
            return None
        parts.append((indices, lut.reshape(-1).astype(np.float32)))
    low, low_table = parts[0]
    high, high_table = (None, np.zeros(1, np.float32)) if one else parts[1]
    sums = low_table[:, None] + high_table[None, :]  # float32: what the `add` computes (+ 0: the table)
    if (high is not None and low.shape != high.shape) or not np.isfinite(sums).all() \
            or not np.array_equal(sums, np.round(sums)) or sums.min() < -128 or sums.max() > 127:
        return None
    rows, cols = low.shape
    shape = tuple(int(d) for d in blocks.outputs[0].shape)
    if len(shape) != 3 or shape[0] != rows or shape[1] * shape[2] != cols \
            or tuple(int(d) for d in final.outputs[0].shape) != (rows, cols):
        return None
    consts = [_block_const(op, lookup, shape) for op in (scaled, biased) if op is not None]
    if any(c is None for c in consts):
        return None
    return ShiftScaleWeight(_summed_codes(low, high, sums), consts[0], None, round_fp16,  # type: ignore[arg-type]
                            bias=consts[1] if biased is not None else None)


def _summed_codes(low: np.ndarray, high: np.ndarray | None, sums: np.ndarray) -> np.ndarray:
    """int8 codes: sums[low, high] (one table: sums[low, 0]) for every element, a block at a
    time."""
    if low.max(initial=0) >= sums.shape[0] or (high is not None and high.max(initial=0) >= sums.shape[1]):
        raise ValueError("a split weight's index is outside its table")
    table = sums.astype(np.int8).reshape(-1)
    width = sums.shape[1]
    codes = np.empty(low.shape, np.int8)
    flat_low, flat = low.reshape(-1), codes.reshape(-1)
    flat_high = None if high is None else high.reshape(-1)
    for start in range(0, flat.size, _SUM_BLOCK):
        stop = min(flat.size, start + _SUM_BLOCK)
        index = flat_low[start:stop].astype(np.intp) * width
        if flat_high is not None:
            index += flat_high[start:stop]
        np.take(table, index, out=flat[start:stop], mode="clip")
    return codes


def _block_const(op: Any, lookup: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    """The const operand of the elementwise `op` as [rows, groups] when it is one value per
    block of `shape` = [rows, groups, block]."""
    x, y = op.inputs.get("x"), op.inputs.get("y")
    var = y if getattr(getattr(y, "op", None), "op_type", None) == "const" else x
    value = lookup(var)
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f" or value.shape != (shape[0], shape[1], 1):
        return None
    return value.reshape(shape[0], shape[1])


def _other_input(op: Any, key: str) -> Any:
    var = op.inputs.get(key)
    return None if var is None or isinstance(var, (list, tuple)) else var.op


def _const_operand(op: Any) -> Any:
    """The producer of `op`'s non-const operand when the other one is a const, else None."""
    x, y = _other_input(op, "x"), _other_input(op, "y")
    if y is not None and y.op_type == "const" and x is not None:
        return x
    if x is not None and x.op_type == "const" and y is not None:
        return y
    return None
