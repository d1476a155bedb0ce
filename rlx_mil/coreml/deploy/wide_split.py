"""No tensor dimension above 16,384: wide const-weight projections split into pieces (the
Neural Engine form, docs/deploying.md).

The Neural Engine caps a tensor dimension at 16,384 (Anemll splits the LM head into pieces of
at most that many rows). `split_wide_projections` finds every `linear`, `matmul` with a constant
`y` and `conv` with a constant weight whose output width (output channels) is above the limit
and computes it as `ceil(N / limit)` pieces, each from a slice of the weight (compressed weights
are sliced in their compressed form, `weight_slices`). The pieces then travel through what
follows as far as the values allow:

* element-wise ops (unary, or binary with an operand that broadcasts along the split axis, is a
  constant sliced the same way, or is split at the same cuts), `reshape` that keeps the axis
  and `transpose` run once per piece;
* a consumer that contracts the split axis (`linear` / `matmul` / `conv` with a constant
  weight: the down projection after a wide up projection) sums the partial products of the
  pieces with the matching slices of its weight, so the wide width never exists;
* a function output that is split becomes one output per piece (`<name>_0`, `<name>_1`, ...;
  `split_outputs=False` concatenates them into the one output instead, and `rlx_mil.preflight`
  then reports its width);
* anything else reads the pieces concatenated back (the program stays correct; preflight reports
  the concatenation's width).

An embedding table read by `gather` is not a projection and is left whole (preflight notes it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from rlx_mil.coreml.deploy.projections import (
    PROJECTIONS,
    contracted_axes,
    out_axis,
    output_pieces,
    partial_sums,
    weight_of,
)
from rlx_mil.coreml.deploy.shared_table import gather_from_pieces, lookup_tables
from rlx_mil.coreml.deploy.weight_slices import granularity, remove_if_unused
from rlx_mil.coreml.output_pieces import OutputPieces
from rlx_mil.coreml.preflight_rules import ANE_MAX_DIM
from rlx_mil.errors import ConversionError


class _Context(Protocol):
    """The part of `rlx_mil.coreml.deploy.RewriteContext` this rewrite reads and fills."""

    @property
    def split_outputs(self) -> bool: ...

    @property
    def split_outputs_made(self) -> dict[str, OutputPieces]: ...

#: Piece widths are multiples of this where the weight allows (16 output channels per Neural
#: Engine core; every LUT group / scale block size rlx_mil writes divides it or is a multiple).
PIECE_ALIGN = 16

_UNARY = frozenset({
    "abs", "acos", "asin", "atan", "atanh", "cast", "ceil", "clip", "cos", "cosh", "elu", "erf", "exp", "exp2",
    "floor", "gelu", "identity", "inverse", "leaky_relu", "linear_activation", "log", "logical_not", "relu", "relu6",
    "round", "rsqrt", "scaled_tanh", "sigmoid", "sigmoid_hard", "sign", "silu", "sin", "sinh", "softplus",
    "softsign", "sqrt", "square", "tan", "tanh", "thresholded_relu", "threshold",
})
_BINARY = frozenset({
    "add", "sub", "mul", "real_div", "floor_div", "mod", "pow", "maximum", "minimum", "equal", "not_equal", "greater",
    "greater_equal", "less", "less_equal", "logical_and", "logical_or", "logical_xor",
})


@dataclass
class SplitReport:
    """What `split_wide_projections` did to one function."""

    #: wide projection op name -> the piece widths it was computed in
    projections: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: original output name -> its pieces (only with split_outputs=True)
    outputs: dict[str, OutputPieces] = field(default_factory=dict)
    #: names of vars read concatenated back (each one is wider than the limit)
    concatenated: list[str] = field(default_factory=list)
    #: `gather`s of a tied embedding rewritten to read the head's pieces (`shared_table`)
    lookups: int = 0


@dataclass
class _Pieces:
    axis: int  # non-negative, in the rank of the value
    vars: list[Any]
    sizes: tuple[int, ...]
    anchor: Any  # the op that produced the whole value (removed when nothing reads it any more)


def piece_sizes(width: int, limit: int, step: int = 1, align: int = PIECE_ALIGN) -> tuple[int, ...]:
    """`width` cut into the fewest pieces of at most `limit`, as even as the cut step allows:
    `ceil(width / limit)` pieces of one size (a multiple of lcm(step, align) where that fits
    the limit, else of `step`) and a last one of the rest."""
    if width <= limit:
        return (width,)
    for unit in dict.fromkeys((np.lcm(step, align), step)):
        unit = int(unit)
        if unit > limit:
            continue
        count = -(-width // limit)
        while True:
            even = -(-width // count)  # ceil(width / count)
            size = -(-even // unit) * unit
            if size > limit:
                count += 1
                continue
            rest = width - size * (count - 1)
            if rest <= 0:
                break
            return (size,) * (count - 1) + (rest,)
    raise ConversionError(f"a width of {width} cannot be cut into pieces of at most {limit} at a step of {step}")


def _static(shape: Sequence[Any]) -> bool:
    return all(isinstance(d, (int, np.integer)) for d in shape)


class _Splitter:
    def __init__(self, function: Any, limit: int, split_outputs: bool) -> None:
        self.block = function
        self.limit = limit
        self.split_outputs = split_outputs
        self.pieces: dict[Any, _Pieces] = {}
        self.report = SplitReport()
        self.replaced: list[Any] = []
        self.names = {v.name for op in function.operations for v in op.outputs} | set(function.inputs)

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.names:
            name, i = f"{base}_{i}", i + 1
        self.names.add(name)
        return name

    def claim(self, name: str) -> str:
        """`name` for a new output: an internal var holding it is renamed out of the way (an
        input's name or an output's is kept, and the output gets a fresh one)."""
        if name not in self.names:
            self.names.add(name)
            return name
        holders = [v for op in self.block.operations for v in op.outputs if v.name == name]
        if name in self.block.inputs or any(v in self.block.outputs for v in holders):
            return self.fresh(name)
        for var in holders:
            var.name = self.fresh(f"{name}_internal")
            if len(var.op.outputs) == 1 and var.op.name == name:
                var.op.name = var.name
        return name

    # -- the pass ---------------------------------------------------------------------------------
    def run(self) -> SplitReport:
        for op in list(self.block.operations):
            if op.enclosing_block is None:
                continue
            split_inputs = [v for v in op.get_flattened_inputs() if v in self.pieces]
            if split_inputs:
                if self._consume(op):
                    continue
            if op.op_type in PROJECTIONS and op.outputs and _static(op.outputs[0].shape):
                width = int(op.outputs[0].shape[out_axis(op)])
                if width > self.limit and weight_of(op) is not None:
                    self._split_projection(op)
        self._finish()
        return self.report

    def _split_projection(self, op: Any) -> None:
        found = weight_of(op)
        assert found is not None
        _, weight, w_axis = found
        sizes = piece_sizes(int(weight.shape[w_axis]), self.limit, granularity(weight, w_axis))
        outs = output_pieces(op, sizes, self.fresh)
        self.pieces[op.outputs[0]] = _Pieces(out_axis(op), outs, sizes, op)
        if w_axis == 0:  # a tied embedding's lookup reads the pieces too
            weights = [piece.op.inputs[found[0]] for piece in outs]
            for table in lookup_tables(self.block, weight):
                self.report.lookups += gather_from_pieces(self.block, table, weights, sizes, self.fresh)
        self.report.projections[op.name] = sizes
        self.replaced.append(op)

    # -- consumers --------------------------------------------------------------------------------
    def _consume(self, op: Any) -> bool:
        """Compute `op` piecewise or as partial sums; False leaves it to read the whole value."""
        kind = op.op_type
        if kind in _UNARY:
            return self._piecewise(op, "x", self.pieces[op.inputs["x"]]) if op.inputs.get("x") in self.pieces else False
        if kind in _BINARY:
            return self._binary(op)
        if kind in ("reshape", "squeeze", "expand_dims"):
            return self._reshape(op)
        if kind == "transpose":
            return self._transpose(op)
        if kind in PROJECTIONS:
            return self._partial_sums(op)
        return False

    def _piecewise(self, op: Any, key: str, src: _Pieces, out_axis: int | None = None,
                   others: dict[str, list[Any]] | None = None, per_piece: Any = None) -> bool:
        from coremltools.converters.mil import Builder as mb

        outs = []
        for i, piece in enumerate(src.vars):
            kwargs = dict(op.inputs)
            kwargs[key] = piece
            for name, values in (others or {}).items():
                kwargs[name] = values[i]
            if per_piece is not None:
                kwargs.update(per_piece(i))
            outs.append(getattr(mb, op.op_type)(**kwargs, name=self.fresh(f"{op.name}_part{i}"), before_op=op))
        axis = src.axis if out_axis is None else out_axis
        for var, size in zip(outs, src.sizes, strict=True):
            if var.shape[axis] != size:
                raise ConversionError(f"op {op.name!r}: its piece has {var.shape[axis]} on axis {axis}, expected {size}")
        self.pieces[op.outputs[0]] = _Pieces(axis, outs, src.sizes, op)
        self.replaced.append(op)
        return True

    def _binary(self, op: Any) -> bool:
        from coremltools.converters.mil import Builder as mb

        x, y = op.inputs.get("x"), op.inputs.get("y")
        out = op.outputs[0]
        if x is None or y is None or not _static(out.shape):
            return False
        rank = len(out.shape)
        lead = x if x in self.pieces else y
        src = self.pieces[lead]
        axis = src.axis + rank - len(lead.shape)
        lead_key, other_key = ("x", "y") if lead is x else ("y", "x")
        other = op.inputs[other_key]
        o_axis = axis - (rank - len(other.shape))
        if other in self.pieces:
            theirs = self.pieces[other]
            if theirs.sizes != src.sizes or theirs.axis != o_axis:
                return False
            return self._piecewise(op, lead_key, src, axis, {other_key: theirs.vars})
        if o_axis < 0 or int(other.shape[o_axis]) == 1:
            return self._piecewise(op, lead_key, src, axis)
        if other.val is None:
            return False
        starts = np.cumsum((0, *src.sizes))
        values = [mb.const(val=np.ascontiguousarray(np.take(other.val, np.arange(starts[i], starts[i + 1]), axis=o_axis)),
                           name=self.fresh(f"{other.name}_part{i}"), before_op=op) for i in range(len(src.sizes))]
        return self._piecewise(op, lead_key, src, axis, {other_key: values})

    def _reshape(self, op: Any) -> bool:
        x = op.inputs["x"]
        src = self.pieces[x]
        new = op.outputs[0].shape
        if not (_static(x.shape) and _static(new)):
            return False
        before = int(np.prod(x.shape[:src.axis], dtype=np.int64))
        for axis in range(len(new)):
            if int(np.prod(new[:axis], dtype=np.int64)) == before and int(new[axis]) == int(x.shape[src.axis]):
                break
        else:
            return False

        def shape(i: int) -> dict[str, Any]:
            sizes = [int(d) for d in new]
            sizes[axis] = src.sizes[i]
            return {"shape": np.asarray(sizes, np.int32)}

        # squeeze / expand_dims name unit axes, which the pieces share
        return self._piecewise(op, "x", src, axis, per_piece=shape if op.op_type == "reshape" else None)

    def _transpose(self, op: Any) -> bool:
        src = self.pieces[op.inputs["x"]]
        perm = [int(p) % len(op.inputs["x"].shape) for p in op.inputs["perm"].val]
        return self._piecewise(op, "x", src, perm.index(src.axis))

    def _partial_sums(self, op: Any) -> bool:
        """`op` contracting the split axis of its input: the sum of each piece's product with
        the matching slice of the weight (the bias added once)."""
        x = op.inputs.get("x")
        axes = contracted_axes(op)
        if x not in self.pieces or axes is None or self.pieces[x].axis != axes[0] % len(x.shape):
            return False
        src = self.pieces[x]
        total = partial_sums(op, src.vars, src.sizes, self.fresh)
        if total is None:
            return False
        self.block.replace_uses_of_var_after_op(anchor_op=total.op, old_var=op.outputs[0], new_var=total)
        self.replaced.append(op)
        self.report.projections.setdefault(op.name, src.sizes)
        return True

    # -- outputs and clean-up ---------------------------------------------------------------------
    def _finish(self) -> None:
        """Split outputs become their pieces; then, latest value first, each whole value that is
        still read is the concatenation of its pieces and the ops the pieces replace go."""
        from coremltools.converters.mil import Builder as mb

        outputs = list(self.block.outputs)
        renames: list[tuple[Any, str]] = []
        if self.split_outputs:
            for var, src in self.pieces.items():
                if var in outputs:
                    names = [self.claim(f"{var.name}_{i}") for i in range(len(src.vars))]
                    at = outputs.index(var)
                    outputs[at:at + 1] = src.vars
                    renames += list(zip(src.vars, names, strict=True))
                    self.report.outputs[var.name] = OutputPieces(src.axis, tuple(names), src.sizes)
            self.block.set_outputs(outputs)
        for op in reversed(self.replaced):
            self._remove_if_dead(op)
        for var, src in reversed(list(self.pieces.items())):
            self._remove_if_dead(src.anchor)
            if src.anchor.enclosing_block is None:
                continue
            joined = mb.concat(values=src.vars, axis=src.axis, name=self.fresh(f"{var.name}_joined"), before_op=src.anchor)
            self.block.replace_uses_of_var_after_op(anchor_op=joined.op, old_var=var, new_var=joined)
            if var in outputs:
                outputs[outputs.index(var)] = joined
                self.block.set_outputs(outputs)
                renames.append((joined, var.name))
            self.report.concatenated.append(var.name)
            self._remove_if_dead(src.anchor)
        for op in reversed(self.replaced):
            self._remove_if_dead(op)
        for var, name in renames:  # the removed ops' names are free now
            var.name = name
            var.op.name = name

    def _remove_if_dead(self, op: Any) -> None:
        if op.enclosing_block is None or any(v.child_ops or v in self.block.outputs for v in op.outputs):
            return
        inputs = list(op.get_flattened_inputs())
        self.block.remove_ops([op])
        for var in inputs:
            remove_if_unused(self.block, var)


def split_wide_projections(program: Any, *, limit: int = ANE_MAX_DIM, split_outputs: bool = True) -> dict[str, SplitReport]:
    """Split every projection of `program` (a coremltools MIL `Program`, changed in place)
    whose output width is above `limit`; see the module docstring. Returns each function's
    `SplitReport` (the functions where nothing was wide are left out)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConversionError(f"the split limit must be an int >= 1, got {limit!r}")
    reports = {}
    for name, function in program.functions.items():
        with function:
            report = _Splitter(function, limit, split_outputs).run()
        if report.projections:
            reports[name] = report
    return reports


_LIMIT: ContextVar[int] = ContextVar("rlx_mil_split_limit", default=ANE_MAX_DIM)


@contextmanager
def dimension_limit(limit: int) -> Iterator[None]:
    """While active, the Neural Engine form splits at `limit` instead of 16,384 (to exercise
    the split on small models: the tests' tiny vocabularies)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConversionError(f"the split limit must be an int >= 1, got {limit!r}")
    token = _LIMIT.set(limit)
    try:
        yield
    finally:
        _LIMIT.reset(token)


def split_wide(program: Any, context: _Context) -> None:
    """The Neural Engine form's rewrite: `split_wide_projections` at 16,384 (or the active
    `dimension_limit`), split outputs kept apart unless `context.split_outputs` is False; the
    outputs it split are recorded in `context.split_outputs_made`."""
    for report in split_wide_projections(program, limit=_LIMIT.get(), split_outputs=context.split_outputs).values():
        context.split_outputs_made.update(report.outputs)


def name_split_outputs(outputs: dict[str, str], made: dict[str, OutputPieces]) -> dict[str, OutputPieces]:
    """Update the interface -> IR output-name table `outputs` (in place) for the outputs the
    rewrite split (`made`, by interface name): each piece is an output under its own name.
    Returns the split outputs by IR name (`metadata.SplitOutputs`)."""
    by_ir: dict[str, OutputPieces] = {}
    for interface, entry in made.items():
        ir = outputs.pop(interface, interface)
        taken = set(outputs.values())
        for piece in entry.pieces:
            if piece in taken:
                raise ConversionError(f"output {ir!r}: its piece {piece!r} has the name of another output")
            outputs[piece] = piece
        by_ir[ir] = entry
    return by_ir
