"""Catalogue cases of the recurrent op family."""

from __future__ import annotations

from collections.abc import Callable

from rlx_mil.ir.graph import Graph


def _recurrences() -> Graph:
    g = Graph("recurrences")
    q, k, v = (g.input(n, [1, 3, 2, 4]) for n in ("q", "k", "v"))
    gdn = g.gated_delta_net(q, k, v, g.input("g", [1, 3, 2]), g.input("beta", [1, 3, 2]), 4)
    x = g.input("x", [1, 3, 2])
    ss = g.selective_scan(x, g.input("delta", [1, 3, 2]), g.param("a", [2, 4]), g.input("b", [1, 3, 4]),
                          g.input("c", [1, 3, 4]), 4)
    m2 = g.mamba2(g.input("xm", [1, 3, 2, 4]), g.input("dt", [1, 3, 2]), g.param("am", [2]),
                  g.input("bm", [1, 3, 2, 5]), g.input("cm", [1, 3, 2, 5]), 4, 5)
    seq = g.input("seq", [1, 3, 4])
    lstm = g.lstm(seq, g.param("l_ih", [16, 4]), g.param("l_hh", [16, 4]), g.param("l_b", [16]), 4)
    gru = g.gru(seq, g.param("g_ih", [12, 4]), g.param("g_hh", [12, 4]), g.param("g_bi", [12]), g.param("g_bh", [12]), 4)
    rnn = g.rnn(seq, g.param("r_ih", [4, 4]), g.param("r_hh", [4, 4]), g.param("r_b", [4]), 4, relu=True)
    g.set_outputs([gdn, ss, m2, lstm, gru, rnn])
    return g


CASES: dict[str, Callable[[], Graph]] = {
    "recurrences": _recurrences,
}
