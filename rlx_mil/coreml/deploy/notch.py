"""Weight slices off the Neural Engine's 1 MiB notch (the Neural Engine form).

A Neural Engine core streams `ceil(N / 16)` of a projection's `N` output channels; when that
slice, `ceil(N / 16) * D * k * 2` bytes of fp16 weight, is within 16 KiB of a multiple of
1 MiB, weight streaming drops from 45-60 to 17-19 GB/s (kasper0406/stablehlo-coreml#110; a
plain 2048 x 4096 fp16 projection hits it, and so do Llama-3.2-1B's MLP projections).
`avoid_notch` computes every such projection with a dense (`const`) weight as two pieces whose
slices are both off the notch: split along its output channels (the pieces' outputs
concatenated) where a cut at a multiple of 16 channels does it, else along the axis it
contracts (the partial products summed; a projection of 16 channels or fewer streams its whole
weight from each core, so only that changes its slice). The outputs are the same. Compressed
weights stream in their compressed form and are left alone (preflight does not check them
either).
"""

from __future__ import annotations

from typing import Any

from rlx_mil.coreml.deploy.projections import (
    PROJECTIONS,
    contracted_axes,
    out_axis,
    output_pieces,
    partial_sums,
    weight_of,
)
from rlx_mil.coreml.deploy.weight_slices import remove_if_unused
from rlx_mil.coreml.preflight_rules import ANE_CORES, core_payload, on_notch


def _geometry(op: Any) -> tuple[int, int, int, int] | None:
    """(output channels N, contracted width D, kernel size k, the weight's N axis) of a
    projection with a dense const weight; None for anything else."""
    found = weight_of(op)
    if found is None or found[1].op.op_type != "const":
        return None
    _, weight, n_axis = found
    dims = [int(d) for d in weight.shape]
    kernel = 1
    for k in dims[2:]:
        kernel *= k
    return dims[n_axis], dims[1 - n_axis] if len(dims) == 2 else dims[1], kernel, n_axis


def _cut(total: int, step: int, fits: Any) -> tuple[int, int] | None:
    """Two sizes summing to `total`, the first a multiple of `step`, nearest an even split,
    with `fits(size)` for both; None if there are none."""
    middle = total // 2 // step * step
    for delta in range(0, total, step):
        for first in (middle - delta, middle + delta):
            if 0 < first < total and fits(first) and fits(total - first):
                return first, total - first
    return None


def notch_pieces(rows: int, width: int, kernel: int) -> tuple[str, tuple[int, int]] | None:
    """How to take a `[rows, width, kernel]` weight off the notch: ("rows", sizes) or
    ("columns", sizes); None when it is not on it (or no cut helps)."""
    if not on_notch(core_payload(rows, width, kernel)):
        return None
    by_rows = _cut(rows, ANE_CORES, lambda n: not on_notch(core_payload(n, width, kernel)))
    if by_rows is not None:
        return "rows", by_rows
    by_columns = _cut(width, 1, lambda d: not on_notch(core_payload(rows, d, kernel)))
    return ("columns", by_columns) if by_columns is not None else None


def _slice_input(x: Any, axis: int, sizes: tuple[int, int], fresh: Any, before_op: Any) -> list[Any]:
    from coremltools.converters.mil import Builder as mb

    rank = len(x.shape)
    pieces, start = [], 0
    for i, size in enumerate(sizes):
        begin = [0] * rank
        end = [int(d) for d in x.shape]
        begin[axis], end[axis] = start, start + size
        pieces.append(mb.slice_by_index(x=x, begin=begin, end=end, name=fresh(f"{x.name}_cols{i}"), before_op=before_op))
        start += size
    return pieces


def notch_rewrite(program: Any, context: Any) -> None:
    """The Neural Engine form's rewrite: `avoid_notch`."""
    avoid_notch(program)


def avoid_notch(program: Any) -> list[str]:
    """Split every projection of `program` (in place) whose dense weight sits on the notch
    (see the module docstring); returns their names."""
    from coremltools.converters.mil import Builder as mb

    done = []
    for function in program.functions.values():
        names = {v.name for op in function.operations for v in op.outputs}

        def fresh(base: str, names: set[str] = names) -> str:
            name, i = base, 1
            while name in names:
                name, i = f"{base}_{i}", i + 1
            names.add(name)
            return name

        with function:
            for op in list(function.operations):
                if op.op_type not in PROJECTIONS or not all(isinstance(d, int) for d in op.outputs[0].shape):
                    continue
                geometry = _geometry(op)
                plan = notch_pieces(*geometry[:3]) if geometry is not None else None
                if plan is None:
                    continue
                how, sizes = plan
                out = op.outputs[0]
                if how == "rows":
                    result = mb.concat(values=output_pieces(op, sizes, fresh), axis=out_axis(op),
                                       name=fresh(f"{op.name}_joined"), before_op=op)
                else:
                    axes = contracted_axes(op)
                    if axes is None:
                        continue
                    x_pieces = _slice_input(op.inputs["x"], axes[0], sizes, fresh, op)
                    result = partial_sums(op, x_pieces, sizes, fresh)
                    if result is None:
                        continue
                function.replace_uses_of_var_after_op(anchor_op=result.op, old_var=out, new_var=result)
                weight = weight_of(op)[1]  # type: ignore[index]
                name = out.name
                function.remove_ops([op])
                remove_if_unused(function, weight)
                result.name = name  # the projection's own name, for its readers (and outputs)
                result.op.name = name
                done.append(name)
    return done
