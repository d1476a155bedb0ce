"""Reference kernels of the recurrences (part-2 spec section 2): gated delta rule, selective
scan, Mamba-2, and PyTorch-style LSTM / GRU / Elman RNN stacks.

Every recurrence runs sequentially over S in float32 with its state in float32. Ops that carry
state (`GatedDeltaNet.carry_state`, the RNNs' `carry`) also return their final states through
`state_kernel`, which `reference.evaluate` publishes as `<state input>_out`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from rlx_mil.ir.ops import GatedDeltaNet, Gru, Lstm, Mamba2, Rnn, SelectiveScan
from rlx_mil.ir.ops.recurrent import RnnOp
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import finish, reference_kernel, state_kernel

F32 = np.float32


def _f32(*arrays: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(a, dtype=F32) for a in arrays]


# ------------------------------------------------------------------------------ gated delta rule


def gated_delta_net(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
    state: np.ndarray | None = None, *, gate_per_channel: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Output `[B, S, H, n]` and final state `[B, H, n, n]` (`state[b, h, i, j]`: i the key
    index, j the value index). q is scaled by 1/sqrt(n) before the contraction, as upstream."""
    q, k, v, g, beta = _f32(q, k, v, g, beta)
    batch, seq, heads, n = q.shape
    st = np.zeros((batch, heads, n, n), F32) if state is None else np.array(state, dtype=F32)
    out = np.empty((batch, seq, heads, n), F32)
    scale = F32(1.0 / np.sqrt(n))
    for t in range(seq):
        decay = np.exp(g[:, t])
        st *= decay[..., :, None] if gate_per_channel else decay[..., None, None]
        kt = k[:, t]
        u = (v[:, t] - np.einsum("bhij,bhi->bhj", st, kt)) * beta[:, t][..., None]
        st += kt[..., :, None] * u[..., None, :]
        out[:, t] = np.einsum("bhij,bhi->bhj", st, q[:, t] * scale)
    return out, st


def _gdn_run(op: GatedDeltaNet, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    state = inputs[5] if op.carry_state else None
    q, k, v, g, beta = inputs[:5]
    return gated_delta_net(q, k, v, g, beta, state, gate_per_channel=op.gate_per_channel)


@reference_kernel(GatedDeltaNet)
def _gated_delta_net(op: GatedDeltaNet, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(_gdn_run(op, inputs)[0], out)


@state_kernel(GatedDeltaNet)
def _gated_delta_net_state(
    op: GatedDeltaNet, inputs: Sequence[np.ndarray], out: Shape
) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    y, final = _gdn_run(op, inputs)
    return finish(y, out), (final,)


# ------------------------------------------------------------------------------ state-space scans


def selective_scan(x: np.ndarray, delta: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Mamba-1: `h <- exp(delta*A) h + delta*B*x`, `y = sum_n C h`, h `[B, H, N]` from zeros."""
    x, delta, a, b, c = _f32(x, delta, a, b, c)
    batch, seq, heads = x.shape
    h = np.zeros((batch, heads, a.shape[1]), F32)
    y = np.empty((batch, seq, heads), F32)
    for t in range(seq):
        d = delta[:, t][..., None]
        h = np.exp(d * a[None]) * h + d * b[:, t][:, None, :] * x[:, t][..., None]
        y[:, t] = np.einsum("bhn,bn->bh", h, c[:, t])
    return y


@reference_kernel(SelectiveScan)
def _selective_scan(op: SelectiveScan, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(selective_scan(*inputs), out)


def mamba2(x: np.ndarray, dt: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Mamba-2 SSD, sequential form: per head `St[P, N] <- exp(dt a) St + (dt x) (x) b`, `y = St c`."""
    x, dt, a, b, c = _f32(x, dt, a, b, c)
    batch, seq, heads, p = x.shape
    st = np.zeros((batch, heads, p, b.shape[-1]), F32)
    y = np.empty((batch, seq, heads, p), F32)
    for t in range(seq):
        decay = np.exp(dt[:, t] * a[None, :])
        st = decay[..., None, None] * st + (dt[:, t][..., None] * x[:, t])[..., :, None] * b[:, t][..., None, :]
        y[:, t] = np.einsum("bhpn,bhn->bhp", st, c[:, t])
    return y


@reference_kernel(Mamba2)
def _mamba2(op: Mamba2, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(mamba2(*inputs), out)


# ------------------------------------------------------------------------------ RNN stacks

Block = list[np.ndarray]
Cell = Callable[[np.ndarray, np.ndarray, np.ndarray | None, Block], tuple[np.ndarray, np.ndarray | None]]


def unpack_rnn_weights(
    weights: Sequence[np.ndarray], layers: int, directions: int, gates: int, hidden: int, features: int
) -> dict[tuple[int, int], Block]:
    """Split flat packed `[w_ih, w_hh, biases...]` into per-(layer, direction) blocks: `w_ih`
    `[G*H, in_l]` (in_l = I for layer 0, else D*H), `w_hh` `[G*H, H]`, each bias `[G*H]`."""
    flat = [np.asarray(w, dtype=F32).reshape(-1) for w in weights]
    offsets = [0] * len(flat)
    blocks: dict[tuple[int, int], Block] = {}
    rows = gates * hidden
    for layer in range(layers):
        width = features if layer == 0 else directions * hidden
        sizes = [rows * width, rows * hidden] + [rows] * (len(flat) - 2)
        for direction in range(directions):
            block = []
            for i, (w, size) in enumerate(zip(flat, sizes, strict=True)):
                block.append(w[offsets[i]:offsets[i] + size])
                offsets[i] += size
            block[0] = block[0].reshape(rows, width)
            block[1] = block[1].reshape(rows, hidden)
            blocks[layer, direction] = block
    return blocks


def _sigmoid(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return F32(1) / (F32(1) + np.exp(-z))


def lstm_cell(x: np.ndarray, h: np.ndarray, c: np.ndarray | None, block: Block) -> tuple[np.ndarray, np.ndarray | None]:
    """Gates i, f, g, o (PyTorch order), merged bias."""
    w_ih, w_hh, bias = block
    assert c is not None
    i, f, g, o = np.split(x @ w_ih.T + h @ w_hh.T + bias, 4, axis=-1)
    c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    return _sigmoid(o) * np.tanh(c), c


def gru_cell(x: np.ndarray, h: np.ndarray, c: np.ndarray | None, block: Block) -> tuple[np.ndarray, np.ndarray | None]:
    """Gates r, z, n; the reset gate scales the hidden side including its bias."""
    w_ih, w_hh, b_ih, b_hh = block
    ir, iz, i_n = np.split(x @ w_ih.T + b_ih, 3, axis=-1)
    hr, hz, h_n = np.split(h @ w_hh.T + b_hh, 3, axis=-1)
    r, z = _sigmoid(ir + hr), _sigmoid(iz + hz)
    n = np.tanh(i_n + r * h_n)
    return (F32(1) - z) * n + z * h, None


def elman_cell(relu: bool) -> Cell:
    def cell(x: np.ndarray, h: np.ndarray, c: np.ndarray | None, block: Block) -> tuple[np.ndarray, np.ndarray | None]:
        w_ih, w_hh, bias = block
        z = x @ w_ih.T + h @ w_hh.T + bias
        return (np.maximum(z, F32(0)) if relu else np.tanh(z)), None

    return cell


def rnn_stack(
    x: np.ndarray, weights: Sequence[np.ndarray], h0: np.ndarray | None, c0: np.ndarray | None, *,
    hidden: int, layers: int, directions: int, gates: int, cell: Cell, has_cell_state: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Output `[B, S, D*H]` (forward half first) and final `h_n` (and `c_n`) `[L*D, B, H]`."""
    (x,) = _f32(x)
    batch, seq, features = x.shape
    blocks = unpack_rnn_weights(weights, layers, directions, gates, hidden, features)
    hn = np.zeros((layers * directions, batch, hidden), F32) if h0 is None else np.array(h0, dtype=F32)
    cn: np.ndarray | None = None
    if has_cell_state:
        cn = np.zeros_like(hn) if c0 is None else np.array(c0, dtype=F32)
    layer_in = x
    for layer in range(layers):
        halves = []
        for direction in range(directions):
            row = layer * directions + direction
            h = hn[row].copy()
            c = None if cn is None else cn[row].copy()
            y = np.empty((batch, seq, hidden), F32)
            for t in range(seq) if direction == 0 else range(seq - 1, -1, -1):
                h, c = cell(layer_in[:, t], h, c, blocks[layer, direction])
                y[:, t] = h
            halves.append(y)
            hn[row] = h
            if cn is not None and c is not None:
                cn[row] = c
        layer_in = np.concatenate(halves, axis=-1)
    return layer_in, hn, cn


def _cell_of(op: RnnOp) -> Cell:
    if isinstance(op, Lstm):
        return lstm_cell
    if isinstance(op, Gru):
        return gru_cell
    assert isinstance(op, Rnn)
    return elman_cell(op.relu)


def _rnn_run(op: RnnOp, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    count = 2 + len(op.BIASES)
    weights = inputs[1:1 + count]
    states = list(inputs[1 + count:]) if op.carry else []
    h0 = states[0] if states else None
    c0 = states[1] if len(states) > 1 else None
    y, hn, cn = rnn_stack(
        inputs[0], weights, h0, c0, hidden=op.hidden_size, layers=op.num_layers,
        directions=2 if op.bidirectional else 1, gates=op.GATES, cell=_cell_of(op), has_cell_state=isinstance(op, Lstm),
    )
    finals = (hn,) if cn is None else (hn, cn)
    return y, finals


def _rnn_kernel(op: RnnOp, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(_rnn_run(op, inputs)[0], out)


def _rnn_state_kernel(op: RnnOp, inputs: Sequence[np.ndarray], out: Shape) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    y, finals = _rnn_run(op, inputs)
    return finish(y, out), finals


for _op_type in (Lstm, Gru, Rnn):
    reference_kernel(_op_type)(_rnn_kernel)
    state_kernel(_op_type)(_rnn_state_kernel)
