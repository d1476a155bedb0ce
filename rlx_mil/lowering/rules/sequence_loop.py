"""One recurrence step applied over a sequence axis, unrolled or as a MIL `while_loop`.

A recurrence rule describes one time step as a function emitting MIL ops on vars: it takes
the step's slices of the time-major sequences and the current states and returns the step's
outputs and the next states. `scan_sequence` applies it to all S steps:

* S <= `UNROLL_MAX_STEPS`: unrolled, `slice_by_index` per step and one `stack` per output
  (no loop overhead for decode steps and short prompts; the program grows with S);
* longer: one `while_loop` whose loop variables are an int32 step counter, the states and one
  `[S, ...]` accumulator per output; the body reads step t with a dynamic `slice_by_index` and
  writes row t with `scatter` (`slice_update` exists only from iOS18), so the program has the
  same ops for any S, on every target.

Steps are read with `slice_by_index`, not `gather`: coremltools' `add_int16_cast` pass (in its
default fp16 pipeline) narrows a `gather`'s int32 index to int16, which would wrap past 32767
steps under a caller's own pass pipeline.
States keep the program's float precision (in fp16 programs Core ML's fp16 pass would narrow
an fp32 loop body anyway); `recurrence_forms_markdown` (in docs/op-coverage.md) says what each
target gets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlx_mil.lowering.context import LowerContext

#: Longest sequence a recurrence unrolls; longer ones become a `while_loop`.
UNROLL_MAX_STEPS = 16

#: (step inputs, states) -> (step outputs, next states).
StepFn = Callable[[list[Any], list[Any]], tuple[list[Any], list[Any]]]


def scan_sequence(
    ctx: LowerContext,
    *,
    steps: int,
    sequences: Sequence[Any],
    states: Sequence[Any],
    step: StepFn,
    output_shapes: Sequence[tuple[int, ...]],
    reverse: bool = False,
    tag: str = "seq",
) -> tuple[list[Any], list[Any]]:
    """Run `step` over axis 0 of the time-major `sequences` (`[S, ...]`), from the end when
    `reverse`; returns one `[S, *shape]` var per entry of `output_shapes` (row t = the output
    of step t, wherever the scan started) and the final states."""
    require_steps(ctx, steps)
    if steps <= UNROLL_MAX_STEPS:
        return _unrolled(ctx, steps, sequences, states, step, len(output_shapes), reverse, tag)
    return _looped(ctx, steps, sequences, states, step, output_shapes, reverse, tag)


def require_steps(ctx: LowerContext, steps: int) -> None:
    """Refuse an empty sequence before a rule emits anything (Core ML has no zero-sized tensors)."""
    if steps < 1:
        raise ctx.unsupported("a recurrence over an empty sequence (S = 0) has no Core ML form")


def _sizes(var: Any) -> list[int]:
    return [int(d) for d in var.shape]


def _unrolled(
    ctx: LowerContext, steps: int, sequences: Sequence[Any], states: Sequence[Any], step: StepFn,
    outputs: int, reverse: bool, tag: str,
) -> tuple[list[Any], list[Any]]:
    from coremltools.converters.mil import Builder as mb

    current = list(states)
    rows: list[dict[int, Any]] = [{} for _ in range(outputs)]
    for t in range(steps - 1, -1, -1) if reverse else range(steps):
        xs = []
        for seq in sequences:
            sizes = _sizes(seq)
            xs.append(mb.slice_by_index(
                x=seq, begin=[t] + [0] * (len(sizes) - 1), end=[t + 1, *sizes[1:]],
                squeeze_mask=[True] + [False] * (len(sizes) - 1), name=ctx.name(f"{tag}_in_t{t}"),
            ))
        ys, current = step(xs, current)
        for k, y in enumerate(ys):
            rows[k][t] = y
    stacked = []
    for k, by_step in enumerate(rows):
        ordered = [by_step[t] for t in range(steps)]
        if steps == 1:
            stacked.append(mb.expand_dims(x=ordered[0], axes=[0], name=ctx.name(f"{tag}_out{k}")))
        else:
            stacked.append(mb.stack(values=ordered, axis=0, name=ctx.name(f"{tag}_out{k}")))
    return stacked, current


def _looped(
    ctx: LowerContext, steps: int, sequences: Sequence[Any], states: Sequence[Any], step: StepFn,
    output_shapes: Sequence[tuple[int, ...]], reverse: bool, tag: str,
) -> tuple[list[Any], list[Any]]:
    from coremltools.converters.mil import Builder as mb

    n_states = len(states)
    accumulators = [
        mb.fill(shape=[steps, *shape], value=ctx.scalar(0.0), name=ctx.name(f"{tag}_acc{k}"))
        for k, shape in enumerate(output_shapes)
    ]

    def condition(counter: Any, *carried: Any) -> Any:
        return mb.less(x=counter, y=np.int32(steps), name=ctx.name(f"{tag}_more"))

    def body(counter: Any, *carried: Any) -> tuple[Any, ...]:
        index = mb.sub(x=np.int32(steps - 1), y=counter, name=ctx.name(f"{tag}_t")) if reverse else counter
        row = mb.expand_dims(x=index, axes=[0], name=ctx.name(f"{tag}_row"))
        next_row = mb.add(x=row, y=np.int32(1), name=ctx.name(f"{tag}_row_end"))
        windows: dict[tuple[int, ...], tuple[Any, Any]] = {}

        def window(rest: tuple[int, ...]) -> tuple[Any, Any]:
            if rest not in windows:
                begin = mb.concat(values=[row, np.zeros(len(rest), np.int32)], axis=0, name=ctx.name(f"{tag}_begin"))
                end = mb.concat(values=[next_row, np.array(rest, np.int32)], axis=0, name=ctx.name(f"{tag}_end"))
                windows[rest] = (begin, end)
            return windows[rest]

        xs = []
        for seq in sequences:
            rest = tuple(_sizes(seq)[1:])
            begin, end = window(rest)
            xs.append(mb.slice_by_index(
                x=seq, begin=begin, end=end, squeeze_mask=[True] + [False] * len(rest), name=ctx.name(f"{tag}_in"),
            ))
        ys, next_states = step(xs, list(carried[:n_states]))
        written = []
        for acc, y in zip(carried[n_states:], ys, strict=True):
            update = mb.expand_dims(x=y, axes=[0], name=ctx.name(f"{tag}_out_row"))
            written.append(mb.scatter(data=acc, indices=row, updates=update, axis=0, mode="update", name=ctx.name(f"{tag}_write")))
        advanced = mb.add(x=counter, y=np.int32(1), name=ctx.name(f"{tag}_next"))
        return (advanced, *next_states, *written)

    results = mb.while_loop(
        _cond=condition, _body=body, loop_vars=(np.int32(0), *states, *accumulators), name=ctx.name(f"{tag}_loop"),
    )
    final_states = list(results[1:1 + n_states])
    return list(results[1 + n_states:]), final_states


def recurrence_forms_markdown() -> str:
    """The section of docs/op-coverage.md on how recurrences become Core ML programs."""
    return f"""
## Recurrences (GatedDeltaNet, SelectiveScan, Mamba2, Lstm, Gru, Rnn)

* **Form, every target (iOS15-iOS26).** Sequences of S <= {UNROLL_MAX_STEPS} steps
  (`rlx_mil.lowering.rules.sequence_loop.UNROLL_MAX_STEPS`) are unrolled: one `slice_by_index` per
  step and sequence, the step's ops, one `stack` per output. Longer sequences become one MIL
  `while_loop` (int32 counter, the states, one `[S, ...]` accumulator per output; step t read
  with a dynamic `slice_by_index`, written with `scatter`), so the program's op count does not
  depend on S (a GatedDeltaNet layer has the same op count at S = 64 and S = 2048). Upstream's
  own Core ML backend unrolls every S (or runs the op on the host); rlx_mil keeps one program.
  S = 0 has no Core ML form (zero-sized tensors) and is refused with `UnsupportedOpError`;
  the reference returns an empty output and the state unchanged.
* **Carried state.** An op that writes its final state back into an input (GatedDeltaNet
  `carry_state`, Lstm/Gru/Rnn `carry`) publishes it as an extra output named after that
  input, `<state input>_out` (`state` -> `state_out`, `h0` -> `h0_out`, `c0` -> `c0_out`;
  `rlx_mil.ir.naming.state_outputs`); `reference.evaluate` returns the same keys, so feeding
  `state_out` back as `state` continues the sequence. On iOS18, `kv_cache="auto"` (or a
  mapping naming `{{input: "<input>_out"}}`) keeps such a state in a Core ML state instead, the
  same mechanism as the KV caches (`read_state` / `coreml_update_state`, fp16; docs/llm.md).
* **Decisions where the spec leaves room.** The extra output is named `<input>_out` because a
  Core ML model cannot use one name for an input and an output (upstream names it "like the
  state input"). MIL's own `lstm`/`gru`/`rnn` ops are not used (different gate order and
  weight layout, single layer); every cell is spelled with `matmul`/`split`/activations.
  Mamba2 lowers in the sequential form, not the chunked SSD form (the spec allows either).
  GatedDeltaNet takes any `state_size` (upstream's CPU asserts n <= 128; Core ML needs no
  such limit) and honours `gate_per_channel` in fp16 too (upstream's f16 host path ignores it).
* **Precision.** States are held in the program's precision: under fp16 the recurrence runs
  and carries its state in fp16 (coremltools' fp16 pass would narrow an fp32 loop body
  anyway). Measured on a GatedDeltaNet over S = 2048 (H = 2, n = 8, q and k unit vectors,
  log-gates in [-1, 0), outputs up to ~1) through the executor against the float64
  recurrence: fp16 max error 8e-4 in the output and 5e-4 in the final state, fp32 1e-7 (the
  test allows 2e-2). Program size (non-const ops, fp16): 35 at S = 1 and 215 at S = 16
  (unrolled), 44 at S = 17, 64 and 2048 (while_loop).
"""
