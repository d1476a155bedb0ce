"""DequantGroupedMatMulMlx: MLX-affine words decoded against a packer written from MLX's
format (uint32 words, codes LSB-first), every word width through the executor, clamped expert
ids, and 4-bit experts kept as codes plus group tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.errors import AttributeValueError, UnsupportedOpError
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Precision
from rlx_mil.reference.moe import clamped_experts, mlx_codes
from rlx_mil.testing import DEFAULT_TOLERANCES, Tolerance, compare

from .conftest import convert_and_cleanup, emitted_ops


def _mlx_pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Rows of codes as MLX packs them: one little-endian bit stream per row, code i at bit
    i * bits (in uint32 words of 32 / bits codes for 2/4/8 bits)."""
    out = []
    for row in codes:
        acc = 0
        for i, c in enumerate(row):
            acc |= int(c) << (i * bits)
        out.append(np.frombuffer(acc.to_bytes(len(row) * bits // 8, "little"), np.uint8))
    return np.concatenate(out)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_words_decode_like_mlx_packs_them(bits: int) -> None:
    codes = np.random.default_rng(bits).integers(0, 2**bits, size=(3, 64))
    np.testing.assert_array_equal(mlx_codes(_mlx_pack(codes, bits), 3, 64, bits), codes)
    if bits in (2, 4, 8):  # MLX's uint32 words: 32 / bits codes per word, the first in the low bits
        per = 32 // bits
        words = [sum(int(c) << (bits * j) for j, c in enumerate(codes[0][i:i + per])) for i in range(0, 64, per)]
        assert _mlx_pack(codes[:1], bits).tobytes() == np.asarray(words, "<u4").tobytes()


def test_expert_ids_are_clamped_as_upstream_reads_them() -> None:
    assert clamped_experts(np.array([7.5, -3.0, 1.9, np.nan], np.float32), 2).tolist() == [1, 0, 1, 0]


@settings(max_examples=4, deadline=None)
@given(bits=st.sampled_from([2, 3, 4, 5, 6, 8]), group=st.sampled_from([16, 32]), target=st.sampled_from(["iOS16", "iOS18"]),
       seed=st.integers(0, 2**16))
@example(bits=5, group=16, target="iOS16", seed=1).via("the split 4 + 1-bit tables")
@example(bits=3, group=32, target="iOS16", seed=2).via("the split 2 + 1-bit tables")
def test_every_width_converts_and_matches(bits: int, group: int, target: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    e, n, k, m = 3, 4, 64, 5
    codes = rng.integers(0, 2**bits, size=(e * n, k))
    scales = rng.uniform(-0.1, 0.1, size=(e, n, k // group)).astype(np.float32)
    biases = rng.uniform(-0.5, 0.5, size=(e, n, k // group)).astype(np.float32)
    g = Graph("mlx")
    y = g.dequant_grouped_matmul_mlx(g.input("x", [m, k]), g.param("w", [e * n * k * bits // 8], "u8"),
                                     g.param("s", [e, n, k // group]), g.param("b", [e, n, k // group]),
                                     g.input("ids", [m]), bits, group, name="y")
    g.set_outputs([y])
    params = {"w": _mlx_pack(codes, bits), "s": scales, "b": biases}
    feeds = {"x": rng.standard_normal((m, k)).astype(np.float32), "ids": np.array([0, 2, 1, 9, -1], np.float32)}
    want = reference.evaluate(g, feeds, params)["y"]
    dense = codes.reshape(e, n, k // group, group) * scales[..., None] + biases[..., None]
    expect = np.einsum("mk,mnk->mn", feeds["x"].astype(np.float64), dense.reshape(e, n, k)[[0, 2, 1, 2, 0]])
    np.testing.assert_allclose(want, expect, rtol=1e-5, atol=1e-5)
    got = milexec.run(convert_and_cleanup(g, params, target=target, precision="fp32"), feeds)["y"]
    ok, _, detail = compare(got, want, Tolerance(1e-5, 1e-5))
    assert ok, detail


@pytest.mark.parametrize(("bits", "target", "op"), [
    (4, "iOS18", "constexpr_blockwise_shift_scale"),
    (5, "iOS18", "constexpr_lut_to_dense"),  # a 4-bit and a 1-bit table: no 5-bit index type
    (5, "iOS16", "constexpr_lut_to_dense"),
    (3, "iOS16", "constexpr_lut_to_dense"),  # 2 + 1 bits: iOS16 has no 3-bit table
])
def test_experts_stay_codes_and_group_tables(tmp_path: Path, bits: int, target: str, op: str) -> None:
    e, n, k, group = 4, 64, 256, 64
    rng = np.random.default_rng(0)
    g = Graph("mlx_size")
    g.set_outputs([g.dequant_grouped_matmul_mlx(
        g.input("x", [2, k]), g.param("w", [e * n * k * bits // 8], "u8"), g.param("s", [e, n, k // group]),
        g.param("b", [e, n, k // group]), g.input("ids", [2]), bits, group, name="y")])
    params = {"w": rng.integers(0, 256, size=e * n * k * bits // 8).astype(np.uint8),
              "s": rng.uniform(0.01, 0.1, size=(e, n, k // group)).astype(np.float32),
              "b": rng.uniform(-1, 1, size=(e, n, k // group)).astype(np.float32)}
    model = convert_and_cleanup(g, params, target=target, precision="fp16")
    assert op in emitted_ops(model)
    size = (rlx_mil.save(model, tmp_path / "m.mlpackage") / "Data" / "com.apple.CoreML" / "weights" / "weight.bin").stat().st_size
    codes = e * n * k * bits // 8 + 2 * (e * n * k // group) * 2  # the words + fp16 scales and biases
    assert size <= 1.1 * codes, (size, codes)
    feeds = {"x": rng.standard_normal((2, k)).astype(np.float32), "ids": np.array([3, 1], np.float32)}
    got, want = milexec.run(model, feeds)["y"], reference.evaluate(g, feeds, params)["y"]
    ok, _, detail = compare(got, want, DEFAULT_TOLERANCES[Precision.FP16])
    assert ok, detail


def test_run_time_words_and_bad_schemes_are_refused() -> None:
    g = Graph("mlx_bad")
    x, ids = g.input("x", [2, 64]), g.input("ids", [2])
    with pytest.raises(AttributeValueError, match="bits"):
        g.dequant_grouped_matmul_mlx(x, g.input("w", [2 * 3 * 64 * 7 // 8], "u8"), g.input("s", [2, 3, 2]),
                                     g.input("b", [2, 3, 2]), ids, 7, 32)
    y = g.dequant_grouped_matmul_mlx(x, g.input("w4", [2 * 3 * 64 // 2], "u8"), g.input("s4", [2, 3, 2]),
                                     g.input("b4", [2, 3, 2]), ids, 4, 32, name="y")
    g.set_outputs([y])
    with pytest.raises(UnsupportedOpError, match="Params or Constants"):
        rlx_mil.convert(g, {}, target="iOS18")
