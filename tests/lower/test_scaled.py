"""Scaled low-precision codes: the decoders against bit-level ones written from the OCP MX /
NVFP4 definitions, every format and layout through the executor, and the package holding codes
and scale bytes rather than decoded weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.errors import RlxMilError, ShapeError
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.json_io import graph_from_json
from rlx_mil.ir.ops import ScaledFormat
from rlx_mil.reference.scaled import E4M3_TABLE, E8M0_TABLE, code_table
from rlx_mil.testing import Tolerance, compare

from .conftest import convert_and_cleanup, emitted_ops


def _minifloat(code: int, exp_bits: int, mant_bits: int, *, finite_only: bool, e4m3fn: bool = False) -> float:
    """IEEE-style sign/exponent/mantissa decode with bias 2^(e-1)-1 (OCP FP8/FP6/FP4)."""
    sign = -1.0 if code >> (exp_bits + mant_bits) & 1 else 1.0
    exp = code >> mant_bits & ((1 << exp_bits) - 1)
    mant = code & ((1 << mant_bits) - 1)
    bias = (1 << (exp_bits - 1)) - 1
    top = (1 << exp_bits) - 1
    if e4m3fn and exp == top and mant == (1 << mant_bits) - 1:
        return float("nan")
    if not finite_only and not e4m3fn and exp == top:
        return sign * float("inf") if mant == 0 else float("nan")
    if exp == 0:
        return sign * mant / (1 << mant_bits) * 2.0 ** (1 - bias)
    return sign * (1 + mant / (1 << mant_bits)) * 2.0 ** (exp - bias)


@pytest.mark.parametrize(("fmt", "exp", "mant", "kind"), [
    (ScaledFormat.F8E4M3, 4, 3, "e4m3fn"), (ScaledFormat.F8E5M2, 5, 2, "ieee"),
    (ScaledFormat.F6E2M3, 2, 3, "finite"), (ScaledFormat.F6E3M2, 3, 2, "finite"), (ScaledFormat.F4E2M1, 2, 1, "finite"),
])
def test_code_tables_follow_the_ocp_definitions(fmt: ScaledFormat, exp: int, mant: int, kind: str) -> None:
    want = [_minifloat(c, exp, mant, finite_only=kind == "finite", e4m3fn=kind == "e4m3fn") for c in range(2**fmt.bits)]
    np.testing.assert_array_equal(code_table(fmt), np.asarray(want, np.float32))


def test_scale_tables_follow_e8m0_and_e4m3() -> None:
    want = [2.0 ** (b - 127) if b != 255 else float("nan") for b in range(256)]
    np.testing.assert_array_equal(E8M0_TABLE, np.asarray(want, np.float32))
    np.testing.assert_array_equal(E4M3_TABLE, code_table(ScaledFormat.F8E4M3))
    assert code_table(ScaledFormat.F4E2M1)[[1, 7, 9, 15]].tolist() == [0.5, 6.0, -0.5, -6.0]


@settings(max_examples=5, deadline=None)
@given(fmt=st.sampled_from(list(ScaledFormat)), layout=st.sampled_from(["PerTensor", "BlockMxE8M0", "Nvfp4"]),
       k=st.integers(1, 40), block=st.sampled_from([8, 16, 32]), seed=st.integers(0, 2**16))
def test_run_time_codes_decode_like_the_reference(fmt: ScaledFormat, layout: str, k: int, block: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    table = code_table(fmt)
    codes = rng.integers(0, 256, size=(2, k)).astype(np.uint8)  # high bits of sub-byte codes are ignored
    groups = -(-k // block)
    if layout == "PerTensor":
        scale_shape, dtype, scale = [1], "f32", np.array([0.75], np.float32)
    else:
        low, high = (120, 135) if layout == "BlockMxE8M0" else (0x28, 0x48)
        scale_shape, dtype, scale = [2, groups], "u8", rng.integers(low, high, size=(2, groups)).astype(np.uint8)
    g = Graph("dq")
    g.set_outputs([g.scaled_dequantize(g.input("c", [2, k], "u8"), g.input("s", scale_shape, dtype), fmt, layout, block,
                                       name="y")])
    feeds = {"c": codes, "s": scale}
    want = reference.evaluate(g, feeds)["y"]
    per = np.repeat(scale.astype(np.float64) if layout == "PerTensor" else (
        (2.0 ** (scale.astype(np.float64) - 127)) if layout == "BlockMxE8M0" else E4M3_TABLE[scale]), 1 if layout == "PerTensor" else block, axis=-1)
    expect = table[codes & (2**fmt.bits - 1)] * (per[..., :k] if layout != "PerTensor" else per[0])
    np.testing.assert_array_equal(want, expect.astype(np.float32))
    got = milexec.run(convert_and_cleanup(g, {}, target="iOS18", precision="fp32"), feeds)["y"]
    ok, _, detail = compare(got, want, Tolerance(0, 1e-6))
    assert ok, detail


@pytest.mark.parametrize(("fmt", "layout", "block", "code_bits", "scale_bytes_per"), [
    ("F4E2M1", "BlockMxE8M0", 32, 4, 1 / 32), ("F4E2M1", "Nvfp4", 16, 4, 1 / 16), ("F8E4M3", "PerTensor", 1, 8, 0),
])
def test_known_weights_stay_codes_and_scale_bytes(tmp_path: Path, fmt: str, layout: str, block: int, code_bits: int,
                                                   scale_bytes_per: float) -> None:
    n, k = 256, 512
    g = Graph("scaled_size")
    scale_shape, scale_dtype = ([1], "f32") if layout == "PerTensor" else ([n, k // block], "u8")
    x_scale = [1] if layout == "PerTensor" else [1, k // block]
    g.set_outputs([g.scaled_matmul(g.input("x", [1, k], "u8"), g.param("w", [n, k], "u8"), g.input("xs", x_scale, scale_dtype),
                                   g.param("ws", scale_shape, scale_dtype), fmt, fmt, layout, block, name="y")])
    rng = np.random.default_rng(1)
    params = {"w": rng.integers(0, 2**code_bits, size=(n, k)).astype(np.uint8),
              "ws": (rng.uniform(0.5, 2, 1).astype(np.float32) if layout == "PerTensor"
                     else rng.integers(0x30, 0x40, size=(n, k // block)).astype(np.uint8))}
    model = convert_and_cleanup(g, params, target="iOS18", precision="fp16")
    assert "constexpr_lut_to_dense" in emitted_ops(model)
    size = (rlx_mil.save(model, tmp_path / "s.mlpackage") / "Data" / "com.apple.CoreML" / "weights" / "weight.bin").stat().st_size
    codes = n * k * code_bits // 8 + int(n * k * scale_bytes_per)
    assert size <= 1.1 * codes, (size, codes)


def test_json_forms_and_refusals() -> None:
    g = Graph("j")
    y = g.scaled_matmul(g.input("a", [2, 32], "u8"), g.input("b", [3, 32], "u8"), g.input("sa", [2, 2], "u8"),
                        g.input("sb", [3, 2], "u8"), "F4E2M1", "F8E5M2", "Nvfp4", 16, name="y")
    g.set_outputs([y])
    text = g.to_json()
    assert '"scale_layout":{"Nvfp4":{"group":16}}' in text and '"lhs_format":"F4E2M1"' in text
    assert graph_from_json(text).to_json() == text
    custom = text.replace('"lhs_format":"F4E2M1"', '"lhs_format":{"Custom":{"exp_bits":3,"mant_bits":0,"bias":3}}')
    with pytest.raises(RlxMilError, match="Custom"):
        graph_from_json(custom)
    with pytest.raises(ShapeError, match="rhs_scale"):
        g2 = Graph("bad")
        g2.scaled_matmul(g2.input("a", [2, 32], "u8"), g2.input("b", [3, 32], "u8"), g2.input("sa", [2, 2], "u8"),
                         g2.input("sb", [3, 3], "u8"), "F4E2M1", "F4E2M1", "Nvfp4", 16)
