"""What the runs of one MIL function share: a `Plan` made once per function.

* Consts resolved once, in their stored form (a weight read by `load_program` is a read-only
  view of the package's weight file; see `rlx_mil.milexec.loader`).
* Liveness: after each top-level op, the values whose last use it was are dropped, so a run
  holds only what later ops still read (uses inside nested blocks count for their op).
* In-place writes: a kernel may write into an input's buffer (`OpContext.donatable`) when the
  op is that input's last use and nothing else alive shares the buffer. `slice_update` of a
  KV cache then writes its rows into the cache instead of copying it.
* `shared_states`: the states `read_state` may hand out without copying: each is read once by
  the function and only at its top level, before any `coreml_update_state` of it, and is
  written back by the function. Writing such a value in place only changes what the function
  writes into the state anyway.
* `release_after`: in lean runs, the mapped weights whose resident pages are dropped once the
  op that read them ran (the page cache keeps them, so the next run reads them from memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from coremltools.converters.mil.mil import Block, Operation, Var


@dataclass
class Plan:
    consts: dict[int, Any] = field(default_factory=dict)
    #: root keys (see `root_key`) of buffers that are never written in place.
    pinned: set[int] = field(default_factory=set)
    #: id(op) -> vars whose last use that top-level op is.
    free_after: dict[int, list[Var]] = field(default_factory=dict)
    #: id(var) -> id of the top-level op that uses it last.
    last_user: dict[int, int] = field(default_factory=dict)
    release_after: dict[int, list[np.ndarray]] = field(default_factory=dict)
    shared_states: frozenset[str] = frozenset()
    #: id(op) of ops whose outputs were computed once when preparing (their values in consts).
    precomputed: set[int] = field(default_factory=set)
    #: memo of each var's declared (dtype, shape).
    meta: dict[int, tuple[Any, tuple[Any, ...]]] = field(default_factory=dict)
    #: memo of each op's inputs by name.
    inputs: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: the function's kernels and tensor sizes were checked once (runs skip the checks).
    checked: bool = False


def root_key(value: Any) -> int:
    """Identity of the memory `value` lives in: the end of its chain of bases."""
    base = value
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview) and base.obj is not None:
        base = base.obj
    return id(base)


def _uses(op: Operation) -> list[Var]:
    """Every var `op` reads, including those read inside its nested blocks (from outside them)."""
    found: list[Var] = []
    for value in op.inputs.values():
        found.extend(value if isinstance(value, (list, tuple)) else [value])
    for block in op.blocks:
        found.extend(_block_uses(block))
    return found


def _block_uses(block: Block) -> list[Var]:
    found: list[Var] = list(block.outputs)
    for inner in block.operations:
        found.extend(_uses(inner))
    return found


def build_plan(function: Any, *, lean: bool = False) -> Plan:
    """The liveness, const and state facts of `function` (see the module doc)."""
    from rlx_mil.mil_walk import iter_ops
    from rlx_mil.milexec.loader import mapped_file

    plan = Plan()
    for op in iter_ops(function):
        if op.op_type == "const":
            var = op.outputs[0]
            value = var.val
            if isinstance(value, np.ndarray):
                plan.consts[id(var)] = value
                plan.pinned.add(root_key(value))
    outputs = {id(v) for v in function.outputs}
    reads: dict[str, list[int]] = {}
    writes: dict[str, list[int]] = {}
    for index, op in enumerate(function.operations):
        if op.op_type == "const":
            continue
        for var in _uses(op):
            if id(var) not in outputs:
                plan.last_user[id(var)] = id(op)
        if op.op_type == "read_state":
            reads.setdefault(op.inputs["input"].name, []).append(index)
        elif op.op_type == "coreml_update_state":
            writes.setdefault(op.inputs["state"].name, []).append(index)
        if lean:
            mapped = [v.val for v in op.inputs.values() if not isinstance(v, (list, tuple)) and v.op is not None
                      and v.op.op_type == "const" and isinstance(v.val, np.ndarray) and v.val.nbytes >= 1 << 20
                      and mapped_file(v.val) is not None]
            if mapped:
                plan.release_after[id(op)] = mapped
    by_id = {id(op): op for op in function.operations}
    for var_id, op_id in plan.last_user.items():
        plan.free_after.setdefault(op_id, []).append(_var_of(by_id[op_id], var_id))
    nested_reads = {op.inputs["input"].name for op in iter_ops(function) if op.op_type == "read_state"
                    and op.enclosing_block is not function}
    nested_writes = {op.inputs["state"].name for op in iter_ops(function) if op.op_type == "coreml_update_state"
                     and op.enclosing_block is not function}
    plan.shared_states = frozenset(
        name for name, at in reads.items()
        if len(at) == 1 and name in writes and min(writes[name]) > at[0]
        and name not in nested_reads and name not in nested_writes
    )
    return plan


def _var_of(op: Operation, var_id: int) -> Var:
    for var in _uses(op):
        if id(var) == var_id:
            return var
    raise AssertionError("a last use not among the op's uses")
