"""Nothing of rank > 4 in a Neural Engine program: rank-5 views that only re-index a rank <= 4
tensor are taken out (the Neural Engine works on 4-D tensors; pytorch/executorch#15833: 5-D
attention mis-computes on iOS 26).

A rank-5 tensor made by `reshape` / `expand_dims` of a smaller tensor, or by `stack` of rank-4
tensors along axis 0, holds the same elements in the same order as what it was made from. So:

* a `reshape` of such a tensor reshapes its source instead;
* a `slice_by_index` taking one index of the leading axis (squeezed) of a `reshape` that keeps
  the leading axis slices the source at that index and reshapes the slice (an unrolled scan's
  per-step view);
* a `reshape` of a `stack` along axis 0 that keeps the leading axis is a `concat` of the stacked
  tensors, each reshaped to one row of the result.

The rank-5 tensors are then dead and removed. What still has rank > 4 afterwards is left as it
is (preflight's `rank-over-4` rule reports it).
"""

from __future__ import annotations

from typing import Any

from rlx_mil.coreml.deploy.forms import RewriteContext

_VIEWS = frozenset({"reshape", "expand_dims", "squeeze"})


def _static(var: Any) -> tuple[int, ...] | None:
    shape = getattr(var, "shape", None)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(shape)


def _one_step(op: Any, source: tuple[int, ...]) -> int | None:
    """The leading-axis index `op` (a slice_by_index of a rank-5 view) takes, squeezed, with
    every other axis whole; None otherwise."""
    inputs = op.inputs
    begin, end, squeeze = inputs["begin"].val, inputs["end"].val, inputs.get("squeeze_mask")
    stride = inputs.get("stride")
    view = _static(inputs["x"])
    if begin is None or end is None or squeeze is None or squeeze.val is None or view is None:
        return None
    if list(squeeze.val) != [True] + [False] * (len(view) - 1):
        return None
    if stride is not None and (stride.val is None or any(int(s) != 1 for s in stride.val)):
        return None
    masks = [inputs.get(n) for n in ("begin_mask", "end_mask")]
    if any(m is not None and (m.val is None or any(m.val)) for m in masks):
        return None
    step = int(begin[0])
    if int(end[0]) != step + 1 or not 0 <= step < source[0]:
        return None
    if any(int(b) != 0 for b in begin[1:]) or [int(e) for e in end[1:]] != list(view[1:]):
        return None
    return step


def _rewrite_consumer(op: Any, child: Any) -> Any | None:
    """The rank <= 4 replacement of `child`, a consumer of the rank-5 output of `op`."""
    from coremltools.converters.mil import Builder as mb

    out = _static(child.outputs[0])
    if out is None or len(out) > 4:
        return None
    if op.op_type in _VIEWS and child.op_type == "reshape":
        return mb.reshape(x=op.inputs["x"], shape=list(out), name=f"{child.name}_r4", before_op=child)
    if op.op_type == "reshape" and child.op_type == "slice_by_index":
        source = _static(op.inputs["x"])
        view = _static(op.outputs[0])
        if source is None or view is None or not source or source[0] != view[0]:
            return None
        step = _one_step(child, source)
        if step is None:
            return None
        row = mb.slice_by_index(
            x=op.inputs["x"], begin=[step] + [0] * (len(source) - 1), end=[step + 1, *source[1:]],
            squeeze_mask=[True] + [False] * (len(source) - 1), name=f"{child.name}_step", before_op=child,
        )
        return mb.reshape(x=row, shape=list(out), name=f"{child.name}_r4", before_op=child)
    if op.op_type == "stack" and child.op_type == "reshape" and int(op.inputs["axis"].val) == 0:
        values = list(op.inputs["values"])
        if not out or out[0] != len(values):
            return None
        rows = [mb.reshape(x=v, shape=[1, *out[1:]], name=f"{child.name}_row{i}", before_op=child)
                for i, v in enumerate(values)]
        return mb.concat(values=rows, axis=0, name=f"{child.name}_r4", before_op=child)
    return None


def _reduce_block(block: Any) -> None:
    outputs = {id(v) for v in block.outputs}
    with block:
        for op in list(block.operations):
            if op.blocks or len(op.outputs) != 1 or (op.outputs[0].rank or 0) <= 4:
                continue
            if op.op_type not in _VIEWS and op.op_type != "stack":
                continue
            if any(v.rank is not None and v.rank > 4 for v in _operands(op)):
                continue
            for child in list(op.outputs[0].child_ops):
                if any(id(out) in outputs for out in child.outputs):
                    continue
                replacement = _rewrite_consumer(op, child)
                if replacement is not None:
                    block.replace_uses_of_var_after_op(  # anchored at `child`: only its consumers are visited
                        anchor_op=child, old_var=child.outputs[0], new_var=replacement, force_replace=True,
                    )


def _operands(op: Any) -> list[Any]:
    found: list[Any] = []
    for value in op.inputs.values():
        found.extend(value if isinstance(value, (list, tuple)) else [value])
    return found


def rank_at_most_4(program: Any, context: RewriteContext) -> None:
    """Take the rank-5 views out of every function of `program` (module docstring)."""
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

    del context
    for func in program.functions.values():
        _reduce_block(func)
    PASS_REGISTRY["common::dead_code_elimination"](program)


__all__ = ["rank_at_most_4"]
