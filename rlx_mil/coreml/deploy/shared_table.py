"""A tied embedding read from the LM head's pieces (the Neural Engine form).

With tied embeddings the token table `[V, D]` is both what `gather` reads and the LM head's
weight. Once `wide_split` has cut the head into pieces of at most 16,384 rows, the whole table
would stay in the package for the lookup alone: a second copy of the largest weight (131 MB of
4-bit codes, 525 MB of fp16 for Llama-3.2-1B). `gather_from_pieces` has every `gather` of the
table read the pieces instead: each piece looks up the ids that fall in its rows (the others
clamped into range) and a `select` keeps, per id, the row of the piece that holds it; the
values are the table's own, exactly. The table then goes, and no tensor of the program is
wider than the pieces. Whether the head's weight is the table is read from the program: the
same arrays (the conv weight is a view of the table's codes), never by comparing values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlx_mil.coreml.deploy.weight_slices import is_constant, remove_if_unused


def _pointer(value: Any) -> tuple[int, int] | None:
    array = value if isinstance(value, np.ndarray) else None
    if array is None or array.size == 0:
        return None
    return int(array.__array_interface__["data"][0]), int(array.nbytes)


def same_storage(a: Any, b: Any) -> bool:
    """`a` and `b` (constants) decode the same arrays: the same op types over the same buffers
    (shapes may differ by unit dims, as a conv weight's `[O, C, 1, 1]` from a `[O, C]` table)."""
    if not (is_constant(a) and is_constant(b)) or a.op.op_type != b.op.op_type:
        return False
    if a.op.op_type == "const":
        pa, pb = _pointer(a.val), _pointer(b.val)
        return pa is not None and pa == pb
    if set(a.op.inputs) != set(b.op.inputs):
        return False
    for name, va in a.op.inputs.items():
        vb = b.op.inputs[name]
        if is_constant(va) and (va.op.op_type != "const" or np.size(va.val) > 1):
            if not same_storage(va, vb):
                return False
        elif not np.array_equal(np.asarray(va.val), np.asarray(vb.val)):
            return False
    return True


def _row_lookup(op: Any, table: Any) -> bool:
    """`op` is a `gather` of rows (axis 0, no batch dims) of `table`."""
    if op.op_type != "gather" or op.inputs.get("x") is not table:
        return False
    axis, batch = op.inputs.get("axis"), op.inputs.get("batch_dims")
    return (axis is None or int(axis.val) == 0) and (batch is None or int(batch.val) == 0)


def lookup_tables(block: Any, weight: Any) -> list[Any]:
    """The constant tables of `block` read by a row `gather` that hold `weight`'s arrays."""
    found = []
    for op in block.operations:
        table = op.inputs.get("x") if op.op_type == "gather" else None
        if (table is not None and table not in found and is_constant(table) and _row_lookup(op, table)
                and int(table.shape[0]) == int(weight.shape[0]) and same_storage(table, weight)):
            found.append(table)
    return found


def gather_from_pieces(block: Any, table: Any, pieces: Sequence[Any], sizes: Sequence[int],
                       fresh: Callable[[str], str]) -> int:
    """Rewrite every `gather(table, ids, axis=0)` of `block` to read the row pieces `pieces`
    (constants `[size, D, ...]` holding the table's rows in order); returns how many."""
    from coremltools.converters.mil import Builder as mb

    gathers = [op for op in table.child_ops if _row_lookup(op, table)]
    width = int(table.shape[1]) if len(table.shape) == 2 else None
    if width is None or not gathers or any(not all(isinstance(d, int) for d in g.outputs[0].shape) for g in gathers):
        return 0
    starts = np.cumsum((0, *sizes))
    for op in gathers:
        ids = op.inputs["indices"]
        out = op.outputs[0]
        count = int(np.prod(ids.shape, dtype=np.int64)) if len(ids.shape) else 1
        flat = mb.reshape(x=ids, shape=np.asarray([count], np.int32), name=fresh(f"{op.name}_ids"), before_op=op)
        rows: Any = None
        for i, piece in enumerate(pieces):
            lo, n = int(starts[i]), int(sizes[i])
            local = mb.sub(x=flat, y=np.int32(lo), name=fresh(f"{op.name}_local{i}"), before_op=op)
            local = mb.minimum(x=mb.maximum(x=local, y=np.int32(0), name=fresh(f"{op.name}_low{i}"), before_op=op),
                               y=np.int32(n - 1), name=fresh(f"{op.name}_high{i}"), before_op=op)
            got = mb.gather(x=piece, indices=local, axis=0, name=fresh(f"{op.name}_part{i}"), before_op=op)
            if len(got.shape) != 2:
                got = mb.reshape(x=got, shape=np.asarray([count, width], np.int32), name=fresh(f"{op.name}_rows{i}"),
                                 before_op=op)
            if rows is None:
                rows = got
                continue
            inside = mb.logical_and(
                x=mb.greater_equal(x=flat, y=np.int32(lo), name=fresh(f"{op.name}_from{i}"), before_op=op),
                y=mb.less(x=flat, y=np.int32(lo + n), name=fresh(f"{op.name}_to{i}"), before_op=op),
                name=fresh(f"{op.name}_in{i}"), before_op=op)
            inside = mb.expand_dims(x=inside, axes=[1], name=fresh(f"{op.name}_in{i}_col"), before_op=op)
            rows = mb.select(cond=inside, a=got, b=rows, name=fresh(f"{op.name}_pick{i}"), before_op=op)
        result = mb.reshape(x=rows, shape=np.asarray([int(d) for d in out.shape], np.int32),
                            name=fresh(f"{op.name}_rows"), before_op=op)
        # The whole table goes with the gather: that is the point, so its constexpr output
        # (which coremltools marks nonreplaceable) does not hold the replacement back.
        block.replace_uses_of_var_after_op(anchor_op=result.op, old_var=out, new_var=result, force_replace=True)
        name = out.name
        block.remove_ops([op])
        result.name = name
        result.op.name = name
    remove_if_unused(block, table)
    return len(gathers)
