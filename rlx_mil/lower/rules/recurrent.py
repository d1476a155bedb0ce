"""Recurrences over the sequence axis: lowering rules (none yet; conversion raises UnsupportedOpError naming the op
and the reason)."""

from __future__ import annotations

from rlx_mil.ir import ops
from rlx_mil.lower.registry import declare_unsupported

declare_unsupported(ops.GatedDeltaNet, "not lowered yet (needs a MIL `while_loop` or unrolling over S, state as an extra output)")
declare_unsupported(ops.SelectiveScan, "not lowered yet (needs a MIL `while_loop` over S)")
declare_unsupported(ops.Mamba2, "not lowered yet (needs a MIL `while_loop` over S)")
declare_unsupported(ops.Lstm, "not lowered yet (needs unrolling or a MIL `while_loop`)")
declare_unsupported(ops.Gru, "not lowered yet (needs unrolling or a MIL `while_loop`)")
declare_unsupported(ops.Rnn, "not lowered yet (needs unrolling or a MIL `while_loop`)")
