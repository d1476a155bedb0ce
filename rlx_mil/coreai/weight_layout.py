"""Weights read as `x @ W^T` (MIL's `linear`, `matmul` with `transpose_y`) stored transposed:
the transpose is done once, at translation time, on the stored form (a constant, or the codes
and scales / lookup tables of a compressed weight), so the runtime multiplies activations by
a [in, out] weight as stored. Apple's Linux CPU runtime runs `x @ W` with W [in, out] about
6x faster than `W @ x^T` (and 10x faster than a transpose of W per call): at SmolLM2-135M's
shapes that was most of a decode step.

A weight also read by `gather` along its first axis (a tied embedding) is gathered by columns
from the transposed form, so the asset still holds one copy of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.coreai.registry import RULES, RuleContext

#: Compression ops whose transposed weight is their rule run on transposed inputs.
_TRANSPOSABLE = ("constexpr_blockwise_shift_scale", "constexpr_lut_to_dense", "constexpr_cast")
#: Op input names read as a weight [out, in] by `x @ W^T`.
LINEAR_WEIGHT_INPUTS = {"linear": "weight"}


class _SwappedConsts(RuleContext):
    """A compression op's context whose array inputs have their first two axes swapped (the
    weight's [out, in] axes; a lookup table's [out groups, in groups]) and whose output is the
    transposed weight."""

    def const(self, name: str, default: Any = None) -> Any:
        value = super().const(name, default)
        if isinstance(value, np.ndarray) and value.ndim >= 2:
            return np.ascontiguousarray(np.swapaxes(value, 0, 1))
        return value

    def out_shape(self, index: int = 0) -> tuple[int, ...]:
        shape = super().out_shape(index)
        return (shape[1], shape[0], *shape[2:])


def weight_vars(function: Any) -> set[int]:
    """ids of the vars `function` reads as `x @ W^T` weights (`linear`'s, `matmul`'s `y` with
    `transpose_y`)."""
    from rlx_mil.mil_walk import iter_ops

    found: set[int] = set()
    for op in iter_ops(function):
        if op.op_type == "linear" and op.inputs.get("weight") is not None:
            found.add(id(op.inputs["weight"]))
        elif op.op_type == "matmul" and op.inputs.get("y") is not None:
            flag = op.inputs.get("transpose_y")
            if flag is not None and getattr(flag, "val", None) is not None and bool(np.asarray(flag.val)):
                found.add(id(op.inputs["y"]))
    return found


def transposed(translator: Any, var: Any) -> Any | None:
    """W^T as a Core AI value for a 2-D weight var stored in the program (a const or a
    compression op of consts); None when `var` is computed at run time or its form does not
    transpose (a vector lookup table, an affine dequantize)."""
    shape = getattr(var, "shape", ())
    if len(shape) != 2 or not all(isinstance(d, (int, np.integer)) for d in shape):
        return None
    op = getattr(var, "op", None)
    if op is None:
        return None
    if op.op_type == "const":
        value = translator.const_value(var)
        if value is None or isinstance(value, str) or np.asarray(value).ndim != 2:
            return None
        array = np.asarray(value)
        return translator.stored_constant(np.ascontiguousarray(array.T), translator.held_dtype(var))
    if op.op_type not in _TRANSPOSABLE:
        return None
    if op.op_type == "constexpr_lut_to_dense":
        lut = translator.const_value(op.inputs["lut"])
        if lut is None or np.asarray(lut).shape[-1] != 1:  # a vector table's axis would move
            return None
    return RULES[op.op_type](_SwappedConsts(translator, op))
