"""A projection's `[O, C]` weight as the `[O, C, 1, 1]` weight of a 1x1 `conv`, built at
conversion time: a const becomes a const of the conv's rank (a view of the same array, no
copy), a compressed weight's constexpr op is rebuilt with tensors of that rank (its codes,
palettes and scales reshaped, never decoded), so nothing reshapes the weight at run time.

`conv_weight` answers None for a weight it cannot rebuild; the projection then stays a
`linear` (and preflight reports it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The constexpr ops whose every tensor operand has the weight's rank (a block-wise scale
#: or offset, an int8/uint4 data tensor, a sparse mask) or is rank-free (a nonzero list).
_TRAILING = {
    "constexpr_blockwise_shift_scale": ("data", "scale", "offset"),
    "constexpr_sparse_to_dense": ("mask",),
}


def _unit_dims(value: np.ndarray, at: int | None = None) -> np.ndarray:
    """`value` with two unit dims after its first two (`at`: after its first `at` dims)."""
    arr = np.asarray(value) if not isinstance(value, np.ndarray) else value
    cut = 2 if at is None else at
    return arr.reshape(*arr.shape[:cut], 1, 1, *arr.shape[cut:])


def _const(var: Any, value: np.ndarray, before_op: Any) -> Any:
    from coremltools.converters.mil import Builder as mb

    return mb.const(val=value, name=f"{var.name}_conv", before_op=before_op)


def transposed_const(var: Any, before_op: Any) -> Any | None:
    """A const `[C, O]` (the right operand of a matmul) as the conv weight `[O, C, 1, 1]`."""
    if var.op is None or var.op.op_type != "const" or var.rank != 2:
        return None
    return _const(var, np.ascontiguousarray(np.asarray(var.val).T)[:, :, None, None], before_op)


def conv_weight(var: Any, before_op: Any) -> Any | None:
    """The `[O, C, 1, 1]` conv weight of the `[O, C]` weight `var` (a const or a constexpr
    chain), inserted before `before_op`; None where `var` is neither."""
    from coremltools.converters.mil import Builder as mb

    op = var.op
    if op is None or var.rank != 2:
        return None
    kind = op.op_type
    if kind == "const":
        return _const(var, _unit_dims(var.val), before_op)
    if kind in _TRAILING:
        args: dict[str, Any] = {}
        for name, value in op.inputs.items():
            if name in _TRAILING[kind] and value.rank == 2:
                rebuilt = conv_weight(value, before_op)
                if rebuilt is None:
                    return None
                args[name] = rebuilt
            else:
                args[name] = value
        return getattr(mb, kind)(**args, name=f"{op.name}_conv", before_op=before_op)
    if kind == "constexpr_lut_to_dense":
        inputs = op.inputs
        if "shape" in inputs:  # iOS16: packed indices and the dense shape
            shape = np.asarray(inputs["shape"].val)
            return mb.constexpr_lut_to_dense(
                lut=inputs["lut"], indices=inputs["indices"], shape=np.concatenate([shape, np.ones(2, shape.dtype)]),
                name=f"{op.name}_conv", before_op=before_op,
            )
        indices = conv_weight(inputs["indices"], before_op)
        if indices is None:
            return None
        args = {"indices": indices, "lut": _const(inputs["lut"], _unit_dims(inputs["lut"].val), before_op)}
        if "vector_axis" in inputs and inputs["vector_axis"] is not None:
            args["vector_axis"] = inputs["vector_axis"]
        return mb.constexpr_lut_to_dense(**args, name=f"{op.name}_conv", before_op=before_op)
    if kind == "constexpr_affine_dequantize":  # iOS16/17: scale and zero point along `axis`
        inputs = op.inputs
        data = conv_weight(inputs["quantized_data"], before_op)
        if data is None:
            return None
        return mb.constexpr_affine_dequantize(
            quantized_data=data, zero_point=inputs["zero_point"], scale=inputs["scale"], axis=inputs["axis"],
            name=f"{op.name}_conv", before_op=before_op,
        )
    return None


__all__ = ["conv_weight", "transposed_const"]
