"""The Neural Engine layout: channels-first `[B, C, 1, S]` activations and every const-weight
projection a 1x1 `conv` (apple/ml-ane-transformers), as a rewrite of any lowered program.

The rewrite walks each function's ops in order and gives an activation `v` of shape
`[B, S, C]` (or `[N, C]`) a channels-first twin `v'` of shape `[B, C, 1, S]` (`[1, C, 1, N]`)
wherever the op computing `v` can compute `v'` instead:

* `linear` (and `matmul` by a const `[C, O]`) with a const or constexpr weight becomes `conv`
  on the twin of its input (`conv_weights` rebuilds the weight with the conv's rank);
* element-wise ops (unary, binary, `select`, `cast`) run on the twins, a const or another
  operand put into the same layout (broadcast dims stay broadcast dims);
* ops along an axis (reductions with kept dims, `softmax`, `layer_norm`, `concat`, `split`,
  constant `pad`, `slice_by_size`, `slice_by_index`) run on the twins with the axis mapped
  (the channel axis -1 becomes 1).

The rows an embedding table's `gather` reads start a twin right there (so the first norm is
channels-first too). An input without a twin gets one from `reshape` + `transpose`; every other
consumer of a twinned activation (a reshape into heads, a gather, a function output) gets the
activation back from `transpose` + `reshape` of the twin (a `reshape` alone where there is one
position, as in decode), made once per activation. The old ops are then dead and removed, so
consecutive layers stay channels-first and the layout changes only where the network changes
shape (attention heads, the outputs); Core ML's `reduce_transposes` finds nothing left to
cancel. Function outputs keep their names and shapes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.coreml.deploy.conv_weights import conv_weight, transposed_const
from rlx_mil.coreml.deploy.forms import RewriteContext

#: Element-wise ops of one tensor `x` (the other operands are scalars / attributes).
UNARY = frozenset({
    "abs", "acos", "asin", "atan", "atanh", "cast", "ceil", "clip", "cos", "cosh", "elu", "erf", "exp", "exp2", "floor",
    "gelu", "inverse", "leaky_relu", "log", "logical_not", "relu", "relu6", "round", "rsqrt", "scaled_tanh", "sigmoid",
    "sigmoid_hard", "sign", "silu", "sin", "sinh", "softplus", "softsign", "sqrt", "square", "tan", "tanh", "threshold",
})
#: Element-wise ops of several broadcast tensors, by operand name.
BROADCAST = {
    **{name: ("x", "y") for name in (
        "add", "sub", "mul", "real_div", "maximum", "minimum", "pow", "floor_div", "mod", "equal", "not_equal",
        "greater", "greater_equal", "less", "less_equal", "logical_and", "logical_or", "logical_xor",
    )},
    "select": ("cond", "a", "b"),
}
REDUCE = frozenset({
    "reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod", "reduce_l1_norm", "reduce_l2_norm",
    "reduce_sum_square", "reduce_log_sum", "reduce_log_sum_exp",
})
#: Axis of a rank-3 activation -> axis of its twin ([B, S, C] -> [B, C, 1, S]).
AXIS = (0, 3, 1)
TO_TWIN = [0, 3, 1, 2]  # [B, 1, S, C] -> [B, C, 1, S]
FROM_TWIN = [0, 2, 3, 1]  # [B, C, 1, S] -> [B, 1, S, C]


def _static(var: Any) -> tuple[int, ...] | None:
    shape = getattr(var, "shape", None)
    if shape is None or not all(isinstance(d, (int, np.integer)) for d in shape):
        return None
    return tuple(int(d) for d in shape)


def _rows(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(B, S, C) of a rank-3 shape, (1, N, C) of a rank-2 one."""
    return (1, shape[0], shape[1]) if len(shape) == 2 else (shape[0], shape[1], shape[2])


def _const_twin(value: np.ndarray) -> np.ndarray:
    """A broadcastable const of rank <= 3 in the twin layout ([b, s, c] -> [b, c, 1, s])."""
    arr = np.asarray(value)
    arr = arr.reshape((1,) * (3 - arr.ndim) + arr.shape)
    return np.ascontiguousarray(arr.transpose(0, 2, 1))[:, :, None, :]


class ChannelsFirst:
    """The rewrite of one block (see the module docstring)."""

    def __init__(self, block: Any) -> None:
        self.block = block
        self.twins: dict[int, tuple[Any, Any]] = {}  # id(var) -> (var, twin)
        self.made: dict[int, Any] = {}  # id(var) -> its twin made by reshape + transpose
        self.converted = 0
        self.replaced: list[tuple[Any, Any]] = []  # (var, the var computing it another way)

    # -- layout changes ---------------------------------------------------------------------
    def twin_of(self, var: Any, before_op: Any) -> Any | None:
        """The channels-first form of a rank-2/3 activation (made before `before_op` when it
        has none yet); None for other vars."""
        from coremltools.converters.mil import Builder as mb

        if id(var) in self.twins:
            return self.twins[id(var)][1]
        if id(var) in self.made:
            return self.made[id(var)]
        shape = _static(var)
        if shape is None or len(shape) not in (2, 3):
            return None
        b, s, c = _rows(shape)
        if var.val is not None and var.op is not None and var.op.op_type == "const":
            twin = mb.const(val=_const_twin(var.val), name=f"{var.name}_cf", before_op=before_op)
        elif s == 1:  # one row: the layouts hold the elements in the same order
            twin = mb.reshape(x=var, shape=[b, c, 1, 1], name=f"{var.name}_cf", before_op=before_op)
        else:
            rows = mb.reshape(x=var, shape=[b, 1, s, c], name=f"{var.name}_rows4", before_op=before_op)
            twin = mb.transpose(x=rows, perm=TO_TWIN, name=f"{var.name}_cf", before_op=before_op)
        self.made[id(var)] = twin
        return twin

    def _laid_out(self, var: Any) -> bool:
        """Whether `var` is (or starts) a channels-first activation: it has a twin, or it is a
        rank-3 float row of an embedding table (`gather`), which the network computes on next."""
        if id(var) in self.twins or id(var) in self.made:
            return True
        from coremltools.converters.mil.mil import types

        op = var.op
        return (op is not None and op.op_type == "gather" and var.rank == 3 and _static(var) is not None
                and op.inputs["x"].op is not None and op.inputs["x"].op.op_type.startswith("const")
                and types.is_float(var.dtype))

    def _operand(self, var: Any, before_op: Any) -> Any | None:
        """An operand of an element-wise op in the twin layout: scalars as they are, consts
        and rank <= 3 tensors re-laid (broadcast dims stay 1)."""
        from coremltools.converters.mil import Builder as mb

        if id(var) in self.twins:
            return self.twins[id(var)][1]
        shape = _static(var)
        if shape is None or len(shape) > 3:
            return None
        if len(shape) == 0:
            return var
        if var.op is not None and var.op.op_type == "const":
            return mb.const(val=_const_twin(var.val), name=f"{var.name}_cf", before_op=before_op)
        if all(d == 1 for d in shape):
            return mb.reshape(x=var, shape=[1, 1, 1, 1], name=f"{var.name}_cf1", before_op=before_op)
        if len(shape) < 3:
            var = mb.reshape(x=var, shape=[*(1,) * (3 - len(shape)), *shape], name=f"{var.name}_r3", before_op=before_op)
        return self.twin_of(var, before_op)

    # -- ops ---------------------------------------------------------------------------------
    def _projection(self, op: Any) -> Any | None:
        from coremltools.converters.mil import Builder as mb

        x = op.inputs["x"]
        shape = _static(x)
        if shape is None or len(shape) not in (2, 3):
            return None
        if op.op_type == "matmul" and op.inputs["y"].rank == 3 and len(shape) == 2 and not any(
            op.inputs[flag].val for flag in ("transpose_x", "transpose_y")
        ):
            self._experts(op)
            return None
        if op.outputs[0].rank != len(shape):
            return None
        if op.op_type == "linear":
            weight = conv_weight(op.inputs["weight"], op)
            bias = op.inputs.get("bias")
        else:
            y = op.inputs["y"]
            if op.inputs["transpose_x"].val:
                return None
            weight = conv_weight(y, op) if op.inputs["transpose_y"].val else transposed_const(y, op)
            bias = None
        if weight is None:
            return None
        twin = self.twin_of(x, op)
        if twin is None:
            return None
        kwargs: dict[str, Any] = {}
        if bias is not None and (bias.val is None or np.any(np.asarray(bias.val) != 0)):
            kwargs["bias"] = bias
        self.converted += 1
        return mb.conv(x=twin, weight=weight, strides=[1, 1], pad_type="valid", dilations=[1, 1], groups=1,
                       name=f"{op.name}_conv", before_op=op, **kwargs)

    def _experts(self, op: Any) -> None:
        """`matmul` of rows `[N, C]` by a const stack `[E, C, O]` (every expert of a mixture
        at once) as one conv of E*O output channels; its `[E, N, O]` result is read back."""
        from coremltools.converters.mil import Builder as mb

        y = op.inputs["y"]
        if y.op is None or y.op.op_type != "const":
            return
        experts, channels, width = (int(d) for d in y.shape)
        stacked = np.ascontiguousarray(np.asarray(y.val).transpose(0, 2, 1)).reshape(experts * width, channels, 1, 1)
        twin = self.twin_of(op.inputs["x"], op)
        if twin is None:
            return
        weight = mb.const(val=stacked, name=f"{y.name}_conv", before_op=op)
        conv = mb.conv(x=twin, weight=weight, strides=[1, 1], pad_type="valid", dilations=[1, 1], groups=1,
                       name=f"{op.name}_conv", before_op=op)
        rows = int(op.inputs["x"].shape[0])
        grouped = mb.reshape(x=conv, shape=[experts, width, rows], name=f"{op.name}_experts", before_op=op)
        back = mb.transpose(x=grouped, perm=[0, 2, 1], name=f"{op.name}_back", before_op=op)
        self.converted += 1
        self.replaced.append((op.outputs[0], back))

    def _elementwise(self, op: Any) -> Any | None:
        from coremltools.converters.mil import Builder as mb

        names = ("x",) if op.op_type in UNARY else BROADCAST[op.op_type]
        out = _static(op.outputs[0])
        if out is None or len(out) != 3 or not any(self._laid_out(op.inputs[n]) for n in names):
            return None
        args = dict(op.inputs)
        for name in names:
            operand = self._operand(op.inputs[name], op)
            if operand is None:
                return None
            args[name] = operand
        return getattr(mb, op.op_type)(**args, name=f"{op.name}_cf", before_op=op)

    def _along_axis(self, op: Any) -> Any | list[Any] | None:
        from coremltools.converters.mil import Builder as mb

        kind, inputs = op.op_type, op.inputs
        x = inputs["values"][0] if kind == "concat" else inputs["x"]
        shape = _static(x)
        if shape is None or len(shape) != 3:
            return None
        if kind == "concat":
            return self._concat(op)
        twin = self.twin_of(x, op) if self._laid_out(x) else None
        if twin is None:
            return None
        args = dict(inputs)
        args["x"] = twin
        if kind in REDUCE:
            if inputs.get("axes") is None or not inputs["keep_dims"].val:
                return None
            args["axes"] = [AXIS[int(a) % 3] for a in inputs["axes"].val]
        elif kind in ("softmax", "split"):
            args["axis"] = AXIS[int(inputs["axis"].val) % 3]
        elif kind == "layer_norm":
            axes = [int(a) % 3 for a in inputs["axes"].val]
            if axes != [2]:
                return None
            args["axes"] = [1]
        elif kind == "pad":
            pads = inputs["pad"].val
            if pads is None or inputs["mode"].val != "constant":
                return None
            full = np.concatenate([np.zeros(6 - len(pads), np.int64), np.asarray(pads, np.int64)]).reshape(3, 2)
            args["pad"] = np.concatenate([full[0], full[2], [0, 0], full[1]]).astype(np.int32)
        elif kind == "slice_by_size":
            begin, size = inputs["begin"].val, inputs["size"].val
            if begin is None or size is None:
                return None
            args["begin"] = np.array([begin[0], begin[2], 0, begin[1]], np.int32)
            args["size"] = np.array([size[0], size[2], 1, size[1]], np.int32)
        elif kind == "slice_by_index":
            remapped = self._slice_by_index(inputs)
            if remapped is None:
                return None
            args.update(remapped)
        results = getattr(mb, kind)(**args, name=f"{op.name}_cf", before_op=op)
        return list(results) if isinstance(results, (list, tuple)) else results

    def _slice_by_index(self, inputs: Any) -> dict[str, Any] | None:
        fills = {"begin": 0, "end": 1, "stride": 1, "begin_mask": False, "end_mask": False, "squeeze_mask": False}
        out: dict[str, Any] = {}
        for name, fill in fills.items():
            var = inputs.get(name)
            if var is None:
                continue
            value = var.val
            if value is None or len(value) != 3:
                return None
            if name == "squeeze_mask" and any(value):
                return None
            dtype = bool if isinstance(fill, bool) else np.int32
            out[name] = np.array([value[0], value[2], fill, value[1]], dtype)
        return out

    def _concat(self, op: Any) -> Any | None:
        from coremltools.converters.mil import Builder as mb

        values = list(op.inputs["values"])
        if op.inputs["interleave"].val or not any(self._laid_out(v) for v in values):
            return None
        twins = [self.twin_of(v, op) if _static(v) is not None and len(_static(v) or ()) == 3 else None for v in values]
        if any(t is None for t in twins):
            return None
        return mb.concat(values=twins, axis=AXIS[int(op.inputs["axis"].val) % 3], interleave=False,
                         name=f"{op.name}_cf", before_op=op)

    def _rewrite(self, op: Any) -> Any | list[Any] | None:
        kind = op.op_type
        if kind == "linear" or kind == "matmul":
            return self._projection(op)
        if kind in UNARY or kind in BROADCAST:
            return self._elementwise(op)
        if kind in REDUCE or kind in ("softmax", "layer_norm", "concat", "split", "pad", "slice_by_size", "slice_by_index"):
            return self._along_axis(op)
        return None

    # -- driver ------------------------------------------------------------------------------
    def run(self) -> int:
        """Rewrite the block; returns the number of projections made convs."""
        from coremltools.converters.mil import Builder as mb

        with self.block:
            for op in list(self.block.operations):
                if op.blocks:
                    continue
                made = self._rewrite(op)
                if made is None:
                    continue
                for out, twin in zip(op.outputs, made if isinstance(made, list) else [made], strict=True):
                    self.twins[id(out)] = (out, twin)
            outputs = {id(v) for v in self.block.outputs}
            for var, other in self.replaced:
                _replace(self.block, var, other)
            for var, twin in self.twins.values():
                if not var.child_ops and id(var) not in outputs:
                    continue
                anchor = var.op
                rows = twin
                if _rows(_static(var) or ())[1] != 1:  # one row: a reshape alone reorders nothing
                    rows = mb.transpose(x=twin, perm=FROM_TWIN, name=f"{var.name}_rows", before_op=anchor)
                back = mb.reshape(x=rows, shape=list(var.shape), name=f"{var.name}_back", before_op=anchor)
                _replace(self.block, var, back)
                if id(var) in outputs:
                    name = var.name
                    var.set_name(f"{name}_plain")
                    var.op.name = f"{name}_plain"
                    back.set_name(name)
                    back.op.name = name
        return self.converted


def _replace(block: Any, var: Any, new: Any) -> None:
    """Every use of `var` reads `new` (computed before `var`'s op). Anchored at `var`'s own op,
    coremltools visits only `var`'s consumers, not every later op of the block."""
    block.replace_uses_of_var_after_op(anchor_op=var.op, old_var=var, new_var=new, force_replace=True)


def channels_first(program: Any, context: RewriteContext) -> None:
    """Rewrite every function of `program` into the channels-first layout (module docstring)."""
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

    del context
    for func in program.functions.values():
        ChannelsFirst(func).run()
    PASS_REGISTRY["common::dead_code_elimination"](program)


__all__ = ["channels_first"]
