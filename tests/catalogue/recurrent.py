"""Catalogue cases of the recurrent op family."""

from __future__ import annotations

from collections.abc import Callable

from catalogue import Row
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.rules.sequence_loop import UNROLL_MAX_STEPS
from rlx_mil.lowering.target import Precision


def _gated_delta_net() -> Graph:
    """Unrolled (S = 3) and looped (S past the unroll limit) forms, with and without carried
    state and per-channel gates."""
    g = Graph("gated_delta_net")
    outs = []
    for steps, per_channel, carry in ((3, False, False), (UNROLL_MAX_STEPS + 2, True, True)):
        q, k, v = (g.input(f"{n}{steps}", [1, steps, 2, 4]) for n in ("q", "k", "v"))
        gate = g.input(f"g{steps}", [1, steps, 2, 4] if per_channel else [1, steps, 2])
        state = g.input(f"state{steps}", [1, 2, 4, 4]) if carry else None
        outs.append(g.gated_delta_net(q, k, v, gate, g.input(f"beta{steps}", [1, steps, 2]), 4, state=state,
                                      gate_per_channel=per_channel))
    g.set_outputs(outs)
    return g


def _state_space_scans() -> Graph:
    """SelectiveScan and Mamba2, unrolled and looped."""
    g = Graph("state_space_scans")
    outs = []
    for steps in (3, UNROLL_MAX_STEPS + 2):
        x = g.input(f"x{steps}", [1, steps, 2])
        outs.append(g.selective_scan(x, g.input(f"delta{steps}", [1, steps, 2]), g.param(f"a{steps}", [2, 4]),
                                     g.input(f"b{steps}", [1, steps, 4]), g.input(f"c{steps}", [1, steps, 4]), 4))
        outs.append(g.mamba2(g.input(f"xm{steps}", [1, steps, 2, 4]), g.input(f"dt{steps}", [1, steps, 2]),
                             g.param(f"am{steps}", [2]), g.input(f"bm{steps}", [1, steps, 2, 5]),
                             g.input(f"cm{steps}", [1, steps, 2, 5]), 4, 5))
    g.set_outputs(outs)
    return g


def _recurrences() -> Graph:
    """Lstm, Gru and Rnn: plain, and carried / two-layer bidirectional / looped."""
    g = Graph("recurrences")
    seq = g.input("seq", [1, 3, 4])
    lstm = g.lstm(seq, g.param("l_ih", [16, 4]), g.param("l_hh", [16, 4]), g.param("l_b", [16]), 4)
    gru = g.gru(seq, g.param("g_ih", [12, 4]), g.param("g_hh", [12, 4]), g.param("g_bi", [12]), g.param("g_bh", [12]), 4)
    rnn = g.rnn(seq, g.param("r_ih", [4, 4]), g.param("r_hh", [4, 4]), g.param("r_b", [4]), 4, relu=True)
    steps = UNROLL_MAX_STEPS + 2
    long_seq = g.input("long_seq", [1, steps, 3])
    # Two bidirectional layers of hidden 2: w_ih = 2 directions x (4*2*3 + 4*2*4).
    lstm2 = g.lstm(long_seq, g.input("l2_ih", [112]), g.param("l2_hh", [64]), g.param("l2_b", [32]), 2, 2, True,
                   h0=g.input("h0", [4, 1, 2]), c0=g.input("c0", [4, 1, 2]))
    gru2 = g.gru(long_seq, g.param("g2_ih", [18]), g.param("g2_hh", [12]), g.param("g2_bi", [6]), g.param("g2_bh", [6]),
                 2, h0=g.input("gh0", [1, 1, 2]))
    g.set_outputs([lstm, gru, rnn, lstm2, gru2])
    return g


CASES: dict[str, Callable[[], Graph] | Row] = {
    "gated_delta_net": Row(_gated_delta_net, differs={Precision.FP16: (
        "unnormalised random q/k/v over the looped steps grow the state past fp16's range (the reference reaches"
        " 5.6e7); tests/e2e/test_gated_delta_net_e2e.py checks fp16 with L2-normalised q/k as the model uses"
    )}),
    "state_space_scans": _state_space_scans,
    "recurrences": _recurrences,
}
