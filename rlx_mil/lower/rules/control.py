"""Control flow and regions: lowering rules (none yet; conversion raises UnsupportedOpError naming the op
and the reason)."""

from __future__ import annotations

from rlx_mil.ir import ops
from rlx_mil.lower.registry import declare_unsupported

declare_unsupported(ops.If, "not lowered yet (both branches inlined + `select`, or MIL `cond`)")
declare_unsupported(ops.While, "not lowered yet (MIL `while_loop` with an iteration counter)")
declare_unsupported(ops.Scan, "not lowered yet (MIL `while_loop` over the xs rows)")
declare_unsupported(ops.ElementwiseRegion, "not lowered yet (expanded back into its element-wise steps)")
