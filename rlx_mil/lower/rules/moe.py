"""Mixture-of-experts matmuls: lowering rules (none yet; conversion raises UnsupportedOpError naming the op
and the reason)."""

from __future__ import annotations

from rlx_mil.ir import ops
from rlx_mil.lower.registry import declare_unsupported

declare_unsupported(ops.GroupedMatMul, "not lowered yet (`gather` of expert weights + batched `matmul`)")
declare_unsupported(ops.DequantGroupedMatMul, "not lowered yet (experts decoded at conversion, then as GroupedMatMul)")
declare_unsupported(ops.DequantMoEWeights, "not lowered yet (decoded and transposed at conversion to a const)")
