"""Catalogue cases of the moe op family."""

from __future__ import annotations

from collections.abc import Callable

from catalogue import Row
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import QuantKind, QuantScheme
from rlx_mil.lowering.target import Precision


def _experts() -> Graph:
    g = Graph("experts")
    x, ids = g.input("x", [3, 32]), g.input("ids", [3])
    w = g.dequant_moe_weights(g.param("packed", [2 * 4 * 34], "u8"), QuantScheme(QuantKind.GGUF_Q8_0), 2, 32, 4)
    y = g.grouped_matmul(x, w, ids)
    z = g.dequant_grouped_matmul(x, g.param("packed2", [2 * 4 * 34], "u8"), ids, QuantScheme(QuantKind.GGUF_Q8_0), 4)
    g.set_outputs([g.add(y, z, name="y")])
    return g


_INVALID_LEAVES = (
        "random bytes are no valid GGUF Q8_0 blocks (their fp16 scales may be inf/NaN) and random ids fall past the"
        " experts, which the reference refuses; tests/e2e/test_moe_e2e.py compares with encoded weights"
)


def _mlx_experts() -> Graph:
    g = Graph("mlx_experts")
    x, ids = g.input("x", [3, 64]), g.input("experts", [3])
    outs = []
    for bits in (4, 3, 5):
        words = g.param(f"w{bits}", [2 * 5 * 64 * bits // 8], "u8")
        outs.append(g.dequant_grouped_matmul_mlx(x, words, g.param(f"s{bits}", [2, 5, 2]), g.param(f"b{bits}", [2, 5, 2]),
                                                 ids, bits, 32, name=f"y{bits}"))
    g.set_outputs(outs)
    return g


CASES: dict[str, Callable[[], Graph] | Row] = {
    "experts": Row(_experts, differs={Precision.FP32: _INVALID_LEAVES, Precision.FP16: _INVALID_LEAVES}),
    "mlx_experts": _mlx_experts,
}
