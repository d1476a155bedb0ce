"""Recurrences over the sequence axis (part-2 spec section 2).

Each rule moves its sequences to time-major order once, precomputes what does not depend on
the state (gates, scaled queries), and hands one time step to `scan_sequence`, which unrolls
short sequences and emits a `while_loop` for long ones (`UNROLL_MAX_STEPS`). A carried final
state is published with `ctx.publish_state`: an extra output `<state input>_out`, or a Core ML
state write when the conversion keeps that input as state.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlx_mil.ir import ops
from rlx_mil.ir.ops.recurrent import RnnOp
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.rules.sequence_loop import UNROLL_MAX_STEPS, require_steps, scan_sequence

_FORM = (
    f"unrolled for S <= {UNROLL_MAX_STEPS} (`slice_by_index` per step, `stack`), else one MIL `while_loop`"
    " over S (dynamic `slice_by_index` reads, `scatter` writes; op count independent of S)"
)


def time_major(ctx: LowerContext, x: Any, shape: list[int], tag: str) -> Any:
    """`[B, S, ...]` -> `[S, B, ...]` reshaped to `shape`."""
    from coremltools.converters.mil import Builder as mb

    rank = len(x.shape)
    swapped = mb.transpose(x=x, perm=[1, 0, *range(2, rank)], name=ctx.name(f"{tag}_time_major"))
    return mb.reshape(x=swapped, shape=shape, name=ctx.name(f"{tag}_steps"))


def batch_major(ctx: LowerContext, x: Any, shape: list[int]) -> Any:
    """Time-major step outputs `[S, B, ...]` as the node's `shape` `[B, S, ...]`."""
    from coremltools.converters.mil import Builder as mb

    folded = mb.reshape(x=x, shape=[shape[1], shape[0], *shape[2:]], name=ctx.name("out_rows"))
    return mb.transpose(x=folded, perm=[1, 0, *range(2, len(shape))], name=ctx.name())


@lowering(
    notes=(
        "state `[B, H, n, n]` in the program's precision; per step `mul` by exp(g) (per head, or per key row"
        " with gate_per_channel), `matmul` k^T S, `sub`/`mul` beta, rank-1 `matmul` (transpose_x) update, `matmul`"
        f" q^T S with q pre-scaled by 1/sqrt(n); {_FORM}; carry_state: the final state is the extra output"
        " `<state input>_out`, or an iOS18 state with `kv_cache=`"
    ),
)
def lower_gated_delta_net(op: ops.GatedDeltaNet, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    batch, steps, heads, n = ctx.out_shape.sizes()
    require_steps(ctx, steps)
    row = [steps, batch, heads, 1, n]
    scaled_q = mb.mul(x=ctx.var(0), y=ctx.scalar(1.0 / math.sqrt(n)), name=ctx.name("q_scaled"))
    q = time_major(ctx, scaled_q, row, "q")
    k = time_major(ctx, ctx.var(1), row, "k")
    v = time_major(ctx, ctx.var(2), row, "v")
    decay = mb.exp(x=ctx.var(3), name=ctx.name("decay"))
    # Per channel the decay scales state row i (the key index): a column [n, 1] per head.
    decay = time_major(ctx, decay, [steps, batch, heads, n, 1] if op.gate_per_channel else [steps, batch, heads, 1, 1], "decay")
    beta = time_major(ctx, ctx.var(4), [steps, batch, heads, 1, 1], "beta")
    if op.carry_state:
        initial = ctx.var(5)
    else:
        initial = mb.fill(shape=[batch, heads, n, n], value=ctx.scalar(0.0), name=ctx.name("state_zero"))

    def step(xs: list[Any], states: list[Any]) -> tuple[list[Any], list[Any]]:
        q_t, k_t, v_t, decay_t, beta_t = xs
        state = mb.mul(x=states[0], y=decay_t, name=ctx.name("decayed"))
        recalled = mb.matmul(x=k_t, y=state, name=ctx.name("recalled"))
        delta = mb.mul(x=mb.sub(x=v_t, y=recalled, name=ctx.name("error")), y=beta_t, name=ctx.name("delta"))
        update = mb.matmul(x=k_t, y=delta, transpose_x=True, name=ctx.name("update"))
        state = mb.add(x=state, y=update, name=ctx.name("state"))
        return [mb.matmul(x=q_t, y=state, name=ctx.name("read"))], [state]

    (out,), (final,) = scan_sequence(
        ctx, steps=steps, sequences=[q, k, v, decay, beta], states=[initial], step=step,
        output_shapes=[(batch, heads, 1, n)], tag="gdn",
    )
    if op.carry_state:
        ctx.publish_state(5, final)
    return batch_major(ctx, out, [batch, steps, heads, n])


@lowering(
    notes=(
        "state `[B, H, N]` from zeros; delta*x precomputed over S; per step `exp`(delta*A), `mul`/`add` update,"
        f" `mul` by C and `reduce_sum` over N; {_FORM}"
    ),
)
def lower_selective_scan(op: ops.SelectiveScan, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    batch, steps, heads = ctx.out_shape.sizes()
    require_steps(ctx, steps)
    n = int(ctx.input_shape(2).sizes()[1])
    x, delta, a = ctx.var(0), ctx.var(1), ctx.var(2)
    delta_x = time_major(ctx, mb.mul(x=delta, y=x, name=ctx.name("delta_x")), [steps, batch, heads, 1], "delta_x")
    delta = time_major(ctx, delta, [steps, batch, heads, 1], "delta")
    b = time_major(ctx, ctx.var(3), [steps, batch, 1, n], "b")
    c = time_major(ctx, ctx.var(4), [steps, batch, 1, n], "c")
    initial = mb.fill(shape=[batch, heads, n], value=ctx.scalar(0.0), name=ctx.name("state_zero"))

    def step(xs: list[Any], states: list[Any]) -> tuple[list[Any], list[Any]]:
        delta_t, delta_x_t, b_t, c_t = xs
        decay = mb.exp(x=mb.mul(x=delta_t, y=a, name=ctx.name("delta_a")), name=ctx.name("decay"))
        state = mb.add(x=mb.mul(x=decay, y=states[0], name=ctx.name("decayed")),
                       y=mb.mul(x=delta_x_t, y=b_t, name=ctx.name("input")), name=ctx.name("state"))
        read = mb.reduce_sum(x=mb.mul(x=state, y=c_t, name=ctx.name("weighted")), axes=[-1], keep_dims=False,
                             name=ctx.name("read"))
        return [read], [state]

    (out,), _ = scan_sequence(
        ctx, steps=steps, sequences=[delta, delta_x, b, c], states=[initial], step=step,
        output_shapes=[(batch, heads)], tag="scan",
    )
    return batch_major(ctx, out, [batch, steps, heads])


@lowering(
    notes=(
        "sequential SSD: state `[B, H, P, N]` from zeros; exp(dt*a) and dt*x precomputed over S; per step"
        f" `mul`/`add` with the rank-1 `matmul` (dt x) b^T, `matmul` by c; {_FORM}"
    ),
)
def lower_mamba2(op: ops.Mamba2, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    batch, steps, heads, p = ctx.out_shape.sizes()
    require_steps(ctx, steps)
    n = int(ctx.input_shape(3).sizes()[3])
    x, dt, a = ctx.var(0), ctx.var(1), ctx.var(2)
    decay = mb.exp(x=mb.mul(x=dt, y=a, name=ctx.name("dt_a")), name=ctx.name("decay"))
    decay = time_major(ctx, decay, [steps, batch, heads, 1, 1], "decay")
    dt_col = mb.expand_dims(x=dt, axes=[-1], name=ctx.name("dt_col"))
    dt_x = time_major(ctx, mb.mul(x=dt_col, y=x, name=ctx.name("dt_x")), [steps, batch, heads, p, 1], "dt_x")
    b = time_major(ctx, ctx.var(3), [steps, batch, heads, 1, n], "b")
    c = time_major(ctx, ctx.var(4), [steps, batch, heads, n, 1], "c")
    initial = mb.fill(shape=[batch, heads, p, n], value=ctx.scalar(0.0), name=ctx.name("state_zero"))

    def step(xs: list[Any], states: list[Any]) -> tuple[list[Any], list[Any]]:
        decay_t, dt_x_t, b_t, c_t = xs
        state = mb.add(x=mb.mul(x=decay_t, y=states[0], name=ctx.name("decayed")),
                       y=mb.matmul(x=dt_x_t, y=b_t, name=ctx.name("input")), name=ctx.name("state"))
        return [mb.matmul(x=state, y=c_t, name=ctx.name("read"))], [state]

    (out,), _ = scan_sequence(
        ctx, steps=steps, sequences=[decay, dt_x, b, c], states=[initial], step=step,
        output_shapes=[(batch, heads, p, 1)], tag="ssd",
    )
    return batch_major(ctx, out, [batch, steps, heads, p])


class _PackedWeights:
    """Per-(layer, direction) blocks of a flat packed weight input: consts cut at conversion
    when the weight is known (a Param / Constant), else `slice_by_index` of the run-time tensor."""

    def __init__(self, ctx: LowerContext, index: int) -> None:
        from coremltools.converters.mil import Builder as mb

        self.ctx = ctx
        self.index = index
        value = ctx.value(index)
        self.known = None if value is None else np.asarray(value, dtype=np.float32).reshape(-1)
        self.flat = None if value is not None else mb.reshape(x=ctx.var(index), shape=[-1], name=ctx.name(f"packed{index}"))
        self.offset = 0

    def take(self, shape: tuple[int, ...], transposed: bool = False) -> tuple[Any, bool]:
        """The next block, as `shape` (transposed when possible); returns (var, is_transposed)."""
        from coremltools.converters.mil import Builder as mb

        size = math.prod(shape)
        start, self.offset = self.offset, self.offset + size
        if self.known is not None:
            block = self.known[start:start + size].reshape(shape)
            return self.ctx.const(block.T.copy() if transposed else block, f"block{self.index}"), transposed
        assert self.flat is not None
        piece = mb.slice_by_index(x=self.flat, begin=[start], end=[start + size], name=self.ctx.name(f"block{self.index}"))
        return mb.reshape(x=piece, shape=list(shape), name=self.ctx.name(f"block{self.index}_rows")), False


def _project(ctx: LowerContext, x: Any, weight: tuple[Any, bool], tag: str) -> Any:
    """`x @ W^T` for a block `W [rows, cols]` held as given or already transposed."""
    from coremltools.converters.mil import Builder as mb

    var, is_transposed = weight
    return mb.matmul(x=x, y=var, transpose_y=not is_transposed, name=ctx.name(tag))


def _rnn_step(op: RnnOp, ctx: LowerContext, w_hh: tuple[Any, bool], b_hh: Any) -> Any:
    """The cell of `op` as a `scan_sequence` step over the precomputed input projection."""
    from coremltools.converters.mil import Builder as mb

    def sigmoid(x: Any, tag: str) -> Any:
        return mb.sigmoid(x=x, name=ctx.name(tag))

    def step(xs: list[Any], states: list[Any]) -> tuple[list[Any], list[Any]]:
        (projected,) = xs
        h = states[0]
        recurrent = _project(ctx, h, w_hh, "hidden_proj")
        if isinstance(op, ops.Lstm):
            z = mb.add(x=projected, y=recurrent, name=ctx.name("gates"))
            i, f, g, o = mb.split(x=z, num_splits=4, axis=-1, name=ctx.name("gate_split"))
            c = mb.add(x=mb.mul(x=sigmoid(f, "forget"), y=states[1], name=ctx.name("kept")),
                       y=mb.mul(x=sigmoid(i, "input_gate"), y=mb.tanh(x=g, name=ctx.name("candidate")), name=ctx.name("added")),
                       name=ctx.name("cell"))
            h = mb.mul(x=sigmoid(o, "output_gate"), y=mb.tanh(x=c, name=ctx.name("cell_tanh")), name=ctx.name("hidden"))
            return [h], [h, c]
        if isinstance(op, ops.Gru):
            hidden_side = mb.add(x=recurrent, y=b_hh, name=ctx.name("hidden_gates"))
            ir, iz, i_n = mb.split(x=projected, num_splits=3, axis=-1, name=ctx.name("input_split"))
            hr, hz, h_n = mb.split(x=hidden_side, num_splits=3, axis=-1, name=ctx.name("hidden_split"))
            r = sigmoid(mb.add(x=ir, y=hr, name=ctx.name("reset_in")), "reset")
            z = sigmoid(mb.add(x=iz, y=hz, name=ctx.name("update_in")), "update")
            n = mb.tanh(x=mb.add(x=i_n, y=mb.mul(x=r, y=h_n, name=ctx.name("reset_hidden")), name=ctx.name("new_in")),
                        name=ctx.name("new"))
            # (1 - z) n + z h = n + z (h - n)
            h = mb.add(x=n, y=mb.mul(x=z, y=mb.sub(x=h, y=n, name=ctx.name("from_new")), name=ctx.name("kept")),
                       name=ctx.name("hidden"))
            return [h], [h]
        assert isinstance(op, ops.Rnn)
        z = mb.add(x=projected, y=recurrent, name=ctx.name("pre"))
        h = mb.relu(x=z, name=ctx.name("hidden")) if op.relu else mb.tanh(x=z, name=ctx.name("hidden"))
        return [h], [h]

    return step


def _initial_row(ctx: LowerContext, operand: int, row: int, batch: int, hidden: int) -> Any:
    from coremltools.converters.mil import Builder as mb

    return mb.slice_by_index(x=ctx.var(operand), begin=[row, 0, 0], end=[row + 1, batch, hidden],
                             squeeze_mask=[True, False, False], name=ctx.name(f"initial{operand}_{row}"))


def _stack_rows(ctx: LowerContext, rows: list[Any], tag: str) -> Any:
    from coremltools.converters.mil import Builder as mb

    if len(rows) == 1:
        return mb.expand_dims(x=rows[0], axes=[0], name=ctx.name(tag))
    return mb.stack(values=rows, axis=0, name=ctx.name(tag))


def lower_rnn_stack(op: RnnOp, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    batch, steps, features = (int(d) for d in ctx.input_shape(0).sizes())
    require_steps(ctx, steps)
    hidden, layers, directions = op.hidden_size, op.num_layers, 2 if op.bidirectional else 1
    rows = op.GATES * hidden
    packed = [_PackedWeights(ctx, i) for i in range(1, 3 + len(op.BIASES))]
    w_ih, w_hh, *biases = packed
    carried = op.carried_operands()
    layer_in = mb.transpose(x=ctx.var(0), perm=[1, 0, 2], name=ctx.name("x_time_major"))
    finals: list[list[Any]] = [[] for _ in carried]
    for layer in range(layers):
        width = features if layer == 0 else directions * hidden
        halves = []
        for direction in range(directions):
            block_ih = w_ih.take((rows, width), transposed=True)
            block_hh = w_hh.take((rows, hidden), transposed=True)
            bias_vars = [b.take((rows,))[0] for b in biases]
            projected = mb.add(x=_project(ctx, layer_in, block_ih, "input_proj"), y=bias_vars[0], name=ctx.name("input_gates"))
            row = layer * directions + direction
            if op.carry:
                initial = [_initial_row(ctx, operand, row, batch, hidden) for operand in carried]
            else:
                initial = [mb.fill(shape=[batch, hidden], value=ctx.scalar(0.0), name=ctx.name("state_zero"))
                           for _ in op.STATES]
            (out,), last = scan_sequence(
                ctx, steps=steps, sequences=[projected], states=initial,
                step=_rnn_step(op, ctx, block_hh, bias_vars[1] if len(bias_vars) > 1 else None),
                output_shapes=[(batch, hidden)], reverse=direction == 1, tag=f"l{layer}d{direction}",
            )
            halves.append(out)
            for k in range(len(carried)):
                finals[k].append(last[k])
        layer_in = halves[0] if directions == 1 else mb.concat(values=halves, axis=-1, name=ctx.name(f"layer{layer}_out"))
    for operand, rows_of_state in zip(carried, finals, strict=True):
        ctx.publish_state(operand, _stack_rows(ctx, rows_of_state, f"final{operand}"))
    return mb.transpose(x=layer_in, perm=[1, 0, 2], name=ctx.name())


_RNN_NOTES = (
    "batch-first `[B, S, I]` moved to time-major once; per (layer, direction) the input projection `matmul` over"
    " all S at once (weights cut from the packed buffers at conversion, transposed, or `slice_by_index` of run-time"
    f" weights), then per step `matmul` by W_hh and the cell; the reverse direction runs t = S-1 ... 0; {_FORM};"
    " carry: final states `[L*D, B, H]` as the extra outputs `<h0>_out`{extra}, or iOS18 states with `kv_cache=`"
)


@lowering(notes="gates i, f, g, o (`split`, `sigmoid`/`tanh`), merged bias; " + _RNN_NOTES.format(extra=" and `<c0>_out`"))
def lower_lstm(op: ops.Lstm, ctx: LowerContext) -> Any:
    return lower_rnn_stack(op, ctx)


@lowering(notes="gates r, z, n with the hidden-side bias inside the reset product; " + _RNN_NOTES.format(extra=""))
def lower_gru(op: ops.Gru, ctx: LowerContext) -> Any:
    return lower_rnn_stack(op, ctx)


@lowering(notes="`tanh` or `relu` (relu=true), merged bias; " + _RNN_NOTES.format(extra=""))
def lower_rnn(op: ops.Rnn, ctx: LowerContext) -> Any:
    return lower_rnn_stack(op, ctx)
