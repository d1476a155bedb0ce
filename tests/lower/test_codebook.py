"""SynthMatMul / SynthReconstruct: the reference against a loop written from upstream's
definition, the iOS18 vector-palettized form at every index width, and the package holding
the codes rather than the weight."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.errors import AttributeValueError, EvaluationError, ShapeError
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.rules.codebook import LUT_BITS, code_bits, lut_bits
from rlx_mil.lowering.target import Precision
from rlx_mil.testing import DEFAULT_TOLERANCES, Tolerance, compare

from .conftest import convert_and_cleanup, emitted_ops


def _loop_weight(indices: np.ndarray, codebook: np.ndarray) -> np.ndarray:
    """`W[j, b*d + t] = codebook[indices[j, b], t]`, element by element (upstream's doc)."""
    n, blocks = indices.shape
    d = codebook.shape[1]
    w = np.zeros((n, blocks * d), np.float64)
    for j in range(n):
        for b in range(blocks):
            for t in range(d):
                w[j, b * d + t] = codebook[indices[j, b], t]
    return w


def _graph(indices: np.ndarray, entries: int, d: int, m: int) -> Graph:
    g = Graph("synth")
    blocks = indices.shape[1]
    y = g.synth_matmul(g.input("x", [m, blocks * d]), g.constant(indices.astype(np.uint8), "u8"),
                       g.param("codebook", [entries, d]), d, entries, name="y")
    g.set_outputs([y, g.synth_reconstruct(g.constant(indices.astype(np.uint8), "u8"), g.param("codebook2", [entries, d]),
                                          d, entries, name="w")])
    return g


@settings(max_examples=5, deadline=None)
@given(entries=st.sampled_from([2, 3, 5, 16, 29, 64, 100, 256]), d=st.integers(1, 5), n=st.integers(1, 6),
       blocks=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_vector_palettization_matches_the_loop_at_every_index_width(
    entries: int, d: int, n: int, blocks: int, seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, entries, size=(n, blocks))
    codebook = rng.standard_normal((entries, d)).astype(np.float32)
    x = rng.standard_normal((2, blocks * d)).astype(np.float32)
    g = _graph(indices, entries, d, 2)
    params = {"codebook": codebook, "codebook2": codebook}
    want = reference.evaluate(g, {"x": x}, params)
    np.testing.assert_allclose(want["w"], _loop_weight(indices, codebook), rtol=0, atol=0)
    np.testing.assert_allclose(want["y"], x.astype(np.float64) @ _loop_weight(indices, codebook).T, rtol=1e-5, atol=1e-5)
    model = convert_and_cleanup(g, params, target="iOS18", precision="fp32")
    assert "constexpr_lut_to_dense" in emitted_ops(model)
    got = milexec.run(model, {"x": x})
    for name in ("y", "w"):
        ok, _, detail = compare(got[name], want[name], Tolerance(1e-6, 1e-5))
        assert ok, f"{name} ({entries} entries, {lut_bits(entries)}-bit indices): {detail}"


@pytest.mark.parametrize(("entries", "target"), [(16, "iOS18"), (29, "iOS18"), (100, "iOS18"), (5, "iOS16"), (29, "iOS16"),
                                                (100, "iOS17")])
def test_package_holds_the_codes_not_the_weight(tmp_path: Path, entries: int, target: str) -> None:
    """16 entries are 4-bit indices; 29 and 100 need 5 and 7 bits, which no index type has: held
    split, they still cost their own width, not the 6 / 8 bits the next index type would. iOS16-17
    (no vector LUT, no 3-bit index) hold the indices as integer codes at their own width too."""
    n, k, d = 256, 512, 4
    rng = np.random.default_rng(0)
    indices = rng.integers(0, entries, size=(n, k // d))
    g = Graph("synth_size")
    g.set_outputs([g.synth_matmul(g.input("x", [1, k]), g.constant(indices.astype(np.uint8), "u8"),
                                  g.param("codebook", [entries, d]), d, entries, name="y")])
    model = convert_and_cleanup(g, {"codebook": rng.standard_normal((entries, d)).astype(np.float32)},
                                target=target, precision="fp16")
    assert "constexpr_lut_to_dense" in emitted_ops(model)
    path = rlx_mil.save(model, tmp_path / "synth.mlpackage")
    size = (path / "Data" / "com.apple.CoreML" / "weights" / "weight.bin").stat().st_size
    codes = n * (k // d) * code_bits(entries) // 8 + entries * d * 2  # tightly packed codes + fp16 codebook
    assert size <= 1.1 * codes, (size, codes)
    if lut_bits(entries) != code_bits(entries):  # what rounding up to the next index type would store
        assert size < n * (k // d) * lut_bits(entries) // 8
    assert size < n * k * 2 / 4  # the fp16 weight: 16 bits an element against <= 7 / 4 here


@pytest.mark.parametrize("target", ["iOS16", "iOS18"])
def test_known_indices_stay_codes_with_a_run_time_codebook(tmp_path: Path, target: str) -> None:
    """A codebook fed at run time leaves no const weight, but the known indices are still held at
    their 5 bits, not as int32."""
    n, blocks, d, entries = 128, 64, 2, 29
    rng = np.random.default_rng(3)
    indices = rng.integers(0, entries, size=(n, blocks))
    g = Graph("synth_live")
    g.set_outputs([g.synth_matmul(g.input("x", [2, blocks * d]), g.constant(indices.astype(np.uint8), "u8"),
                                  g.input("codebook", [entries, d]), d, entries, name="y")])
    model = convert_and_cleanup(g, {}, target=target, precision="fp32")
    assert "constexpr_lut_to_dense" in emitted_ops(model)
    size = (rlx_mil.save(model, tmp_path / "s.mlpackage") / "Data" / "com.apple.CoreML" / "weights" / "weight.bin").stat().st_size
    assert size <= 1.1 * n * blocks * 5 // 8, size
    feeds = {"x": rng.standard_normal((2, blocks * d)).astype(np.float32),
             "codebook": rng.standard_normal((entries, d)).astype(np.float32)}
    ok, _, detail = compare(milexec.run(model, feeds)["y"], reference.evaluate(g, feeds)["y"], Tolerance(1e-6, 1e-5))
    assert ok, detail


@settings(max_examples=8, deadline=None)
@given(entries=st.sampled_from([5, 8, 17, 18, 31, 32, 65, 97, 128, 256]), d=st.integers(1, 4), n=st.integers(1, 5),
       blocks=st.integers(1, 4), precision=st.sampled_from(["fp16", "fp32"]),
       target=st.sampled_from(["iOS16", "iOS17", "iOS18"]), seed=st.integers(0, 2**16))
def test_held_codes_rebuild_the_codebook_entries_exactly(
    entries: int, d: int, n: int, blocks: int, precision: str, target: str, seed: int,
) -> None:
    """The held forms select or gather codebook entries, never compute them: the weight is the
    codebook's rows bit for bit (rounded to fp16 under fp16, as any const is), every index
    reachable - iOS18's split vector LUT (5 / 7 bits) and iOS16-17's integer codes + gather."""
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, entries, size=(n, blocks))
    indices.flat[: 2] = [entries - 1, 0][: indices.size]  # the last entry (high bit set) and the first
    codebook = (rng.standard_normal((entries, d)) * 10.0 ** rng.integers(-3, 4, size=(entries, 1))).astype(np.float32)
    x = rng.standard_normal((2, blocks * d)).astype(np.float32)
    g = _graph(indices, entries, d, 2)
    params = {"codebook": codebook, "codebook2": codebook}
    model = convert_and_cleanup(g, params, target=target, precision=precision)
    ops = emitted_ops(model)
    assert "constexpr_lut_to_dense" in ops
    if target == "iOS18" and code_bits(entries) not in LUT_BITS:
        assert "select" in ops
    elif target != "iOS18":
        assert "gather" in ops
    got = milexec.run(model, {"x": x})
    stored = codebook.astype(np.float16 if precision == "fp16" else np.float32)
    np.testing.assert_array_equal(got["w"].astype(np.float32), _loop_weight(indices, stored).astype(np.float32))
    want = reference.evaluate(g, {"x": x}, params)
    tol = Tolerance(1e-6, 1e-5) if precision == "fp32" else DEFAULT_TOLERANCES[Precision.FP16]
    ok, _, detail = compare(got["y"], want["y"], tol)
    assert ok, f"{entries} entries {target} {precision}: {detail}"


def test_bad_codebooks_and_indices_are_typed_errors() -> None:
    g = Graph("bad")
    x, idx = g.input("x", [2, 8]), g.input("idx", [3, 4], "u8")
    with pytest.raises(ShapeError, match="codebook"):
        g.synth_matmul(x, idx, g.input("cb", [5, 2]), 2, 4)
    with pytest.raises(AttributeValueError, match="num_entries"):
        g.synth_matmul(x, idx, g.input("cb2", [300, 2]), 2, 300)
    with pytest.raises(ShapeError, match="k"):
        g.synth_matmul(x, idx, g.input("cb3", [4, 3]), 3, 4)
    g = Graph("range")
    g.set_outputs([g.synth_reconstruct(g.input("idx", [2, 2], "u8"), g.input("cb", [4, 2]), 2, 4, name="w")])
    with pytest.raises(EvaluationError, match="out of range"):
        reference.evaluate(g, {"idx": np.array([[0, 4], [1, 2]], np.uint8), "cb": np.zeros((4, 2), np.float32)})
