"""Catalogue cases of the scaled low-precision family (MXFP4 / NVFP4 / FP8 codes + scales)."""

from __future__ import annotations

from collections.abc import Callable

from catalogue import Row
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Precision
from rlx_mil.testing import DEFAULT_TOLERANCES


def _scaled_dequantize(g: Graph) -> list[int]:
    fp8 = g.scaled_dequantize(g.input("codes8", [2, 40], "u8"), g.input("t", [1]), "F8E4M3", "PerTensor", name="dq_fp8")
    mx = g.scaled_dequantize(g.input("mx", [2, 40], "u8"), g.input("e8m0", [2, 2], "u8"), "F4E2M1", "BlockMxE8M0", 32,
                             name="dq_mxfp4")
    nv = g.scaled_dequantize(g.param("nv", [3, 32], "u8"), g.param("e4m3", [3, 2], "u8"), "F4E2M1", "Nvfp4", 16,
                             name="dq_nvfp4")
    return [fp8, mx, nv]


def _scaled_codes() -> Graph:
    g = Graph("scaled_codes")
    x = g.input("x", [3, 64], "u8")
    mx = g.scaled_matmul(x, g.param("w", [8, 64], "u8"), g.input("x_scale", [3, 2], "u8"),
                         g.param("w_scale", [8, 2], "u8"), "F8E5M2", "F4E2M1", "BlockMxE8M0", 32,
                         bias=g.param("bias", [8]), name="mxfp4")
    fp8 = g.scaled_matmul(x, g.param("w8", [5, 64], "u8"), g.input("x_t", [1]), g.param("w_t", [1]), "F8E4M3",
                          "F8E4M3", "PerTensor", name="fp8")
    g.set_outputs([mx, fp8, *_scaled_dequantize(g), _scaled_grouped_matmul(g)])
    return g


def _scaled_grouped_matmul(g: Graph) -> int:
    return g.scaled_grouped_matmul(g.input("gx", [5, 32], "u8"), g.param("gw", [3, 4, 32], "u8"),
                                   g.input("gx_scale", [5, 2], "u8"), g.param("gw_scale", [3, 4, 2], "u8"),
                                   g.input("experts", [5]), "F4E2M1", "F4E2M1", "Nvfp4", 16,
                                   bias=g.param("gbias", [3, 4]), name="grouped")


#: Sums of up to 64 products of values up to 8 x scales up to 2^2: fp16 keeps ~3 digits of results in the hundreds.
_LOOSE_FP16 = {**DEFAULT_TOLERANCES, Precision.FP16: DEFAULT_TOLERANCES[Precision.FP16].scaled(2.0)}

CASES: dict[str, Callable[[], Graph] | Row] = {
    "scaled_codes": Row(_scaled_codes, tolerances=_LOOSE_FP16),
}
