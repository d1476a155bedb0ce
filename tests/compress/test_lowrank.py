"""A low-rank correction of a compressed weight's error (`SCHEME+rN`, `rlx_mil.compress.lowrank`):
the package runs ``x Q^T + (x B^T) A^T`` beside the compressed projection, never a dense weight."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx_mil
from rlx_mil import milexec
from rlx_mil.compress import PaletteScheme, parse_scheme, report_of
from rlx_mil.compress.auto import options_for
from rlx_mil.compress.lowrank import CorrectedCodes, correct, fit_correction
from rlx_mil.compress.palette import palettize
from rlx_mil.compress.plan import WeightCompressor
from rlx_mil.errors import CompressionError, InvalidOptionError
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Target
from rlx_mil.milexec.stored_weights import StoredWeights


def _mlp() -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("mlp")
    x = g.input("x", [4, 64], "f32")
    h = g.silu(g.matmul(x, g.param("up.weight", [64, 96]), name="up"), name="act")
    # (a relu after the last matmul: a product that is a graph output is an LM head, never corrected)
    g.set_outputs([g.relu(g.matmul(h, g.param("down.weight", [96, 64]), name="down"), name="y")])
    rng = np.random.default_rng(0)
    return g, {"up.weight": rng.standard_normal((64, 96)).astype(np.float32) / 8,
               "down.weight": rng.standard_normal((96, 64)).astype(np.float32) / 10}


def _ops(model: Any) -> dict[str, Any]:
    return {op.name: op for op in model._mil_program.functions["main"].operations}


def _silu(v: np.ndarray) -> np.ndarray:
    return v / (1 + np.exp(-v))


@pytest.mark.parametrize("precision, tol", [("fp32", 1e-4), ("fp16", 2e-2)])
@pytest.mark.parametrize("deploy", ["plain", "ane"])
def test_the_corrected_layers_compute_q_plus_ab(precision: str, tol: float, deploy: str, tmp_path: Path) -> None:
    graph, params = _mlp()
    emitted: dict[str, Any] = {}
    emit = WeightCompressor._emit

    def keep(self: WeightCompressor, key: Any, codes: Any, entry: Any, op_name: Any) -> Any:
        emitted[entry.name] = codes
        return emit(self, key, codes, entry, op_name)

    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
        warnings.simplefilter("ignore")
        patch.setattr(WeightCompressor, "_emit", keep)
        model = rlx_mil.convert(graph, params, compress="lut4-scaled+r4;check=off", precision=precision, deploy=deploy)
    report = report_of(model)
    assert report is not None and {w.scheme for w in report.weights} == {"lut4-tensor-scaled+r4"}
    ops = _ops(model)
    assert "linear" not in {o.op_type for o in ops.values()} or deploy == "plain"  # the Neural Engine form: 1x1 convs
    weights = {}
    for w in report.weights:  # Q from the base codes alone, B and A as the program's consts hold them
        codes = emitted[w.name]
        (op_name,) = w.ops
        down = next(o for n, o in ops.items() if n.startswith(f"{op_name}_lr_down"))
        up = next(o for n, o in ops.items() if n.startswith(f"{op_name}_lr_up"))
        b = np.asarray(down.outputs[0].val, np.float64).reshape(4, w.shape[0])
        a = np.asarray(up.outputs[0].val, np.float64).reshape(w.shape[1], 4)
        np.testing.assert_array_equal(b, codes.right.astype(np.float64))
        np.testing.assert_array_equal(a, codes.left.astype(np.float64))
        weights[w.name] = codes.base.dequantize().astype(np.float64) + a @ b  # [out, in]
    x = np.random.default_rng(1).standard_normal((4, 64))
    want = np.maximum(_silu(x @ weights["up.weight"].T) @ weights["down.weight"].T, 0)
    got = milexec.run(model, {"x": x.astype(np.float32)}, precision_model="declared" if precision == "fp16" else "float32")
    out = np.asarray(next(iter(got.values())), np.float64)
    assert np.max(np.abs(out - want)) <= tol * np.max(np.abs(want))
    # The float model differs by more than the correction's rounding: the check compares real numbers.
    plain = np.maximum(_silu(x @ params["up.weight"]) @ params["down.weight"], 0)
    assert np.max(np.abs(out - plain)) > 10 * np.max(np.abs(out - want))
    # A saved package's stored weights decode to Q + A B (what --verify and eval judge).
    path = tmp_path / "m.mlpackage"
    model.save(str(path))
    stored = StoredWeights(str(path), report.weights)
    for name, value in weights.items():
        np.testing.assert_allclose(stored[name], value.T, rtol=0, atol=1e-5 * np.max(np.abs(value)))


def test_bytes_count_the_factors() -> None:
    graph, params = _mlp()
    sizes = {}
    for spec in ("lut4-scaled", "lut4-scaled+r4", "lut4-scaled+r8"):
        model = rlx_mil.convert(graph, params, compress=spec + ";check=off")
        report = report_of(model)
        assert report is not None
        sizes[spec] = {w.name: (w.bytes_after, w.shape) for w in report.weights}
    for name, (base, shape) in sizes["lut4-scaled"].items():
        assert sizes["lut4-scaled+r4"][name][0] == base + 2 * 4 * sum(shape)  # fp16 factors: r (out + in) values
        assert sizes["lut4-scaled+r8"][name][0] == base + 2 * 8 * sum(shape)


_BASES = ["int8", "int4", "uint4-float", "lut4", "lut4-scaled", "lut6", "lut3-scaled", "lut4-group8"]


@given(st.sampled_from(_BASES), st.integers(0, 64))
def test_the_scheme_text_round_trips(base: str, rank: int) -> None:
    text = base + (f"+r{rank}" if rank else "")
    scheme = parse_scheme(text)
    assert scheme is not None and scheme.rank == rank
    assert scheme.label.endswith(f"+r{rank}") == bool(rank)
    assert parse_scheme(scheme.label) == scheme
    assert dataclasses.replace(scheme, rank=0) == parse_scheme(base)


@pytest.mark.parametrize("text", ["lut4+r0", "lut4+", "lut4+r2+r2", "none+r4", "lut4+q4", "int8+r-1"])
def test_a_bad_correction_is_refused(text: str) -> None:
    with pytest.raises(InvalidOptionError, match=r"low-rank|'\+'"):
        parse_scheme(text)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 24), st.integers(2, 24), st.integers(1, 30), st.integers(0, 2**16))
def test_correct_over_shapes_and_ranks(out: int, inp: int, rank: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((out, inp)).astype(np.float32)
    scheme = parse_scheme(f"lut2-tensor+r{rank}")
    assert isinstance(scheme, PaletteScheme)
    base = palettize(w, dataclasses.replace(scheme, rank=0), np.float32)
    feature = rng.uniform(0.01, 4.0, inp)
    if rank > min(out, inp):
        with pytest.raises(CompressionError, match=rf"'w\.0'.*\+r{rank}.*rank {rank} exceeds"):
            correct(base, w, scheme, np.float32, "w.0", feature)
        return
    codes = correct(base, w, scheme, np.float32, "w.0", feature)
    assert isinstance(codes, CorrectedCodes) and codes.left.shape == (out, rank) and codes.right.shape == (rank, inp)
    np.testing.assert_allclose(codes.dequantize(), base.dequantize() + codes.left @ codes.right, rtol=1e-6, atol=1e-6)
    # The truncated SVD of the weighted error lowers the weighted error (Eckart-Young), to zero at full rank.
    s = np.sqrt(feature)[None, :]
    before = float(np.linalg.norm((w - base.dequantize()) * s))
    after = float(np.linalg.norm((w - codes.dequantize()) * s))
    assert after <= before * (1 + 1e-5)
    if rank == min(out, inp):
        assert after <= 1e-4 * max(before, 1e-6)


def test_a_rank_beyond_the_weight_is_a_typed_error_naming_it() -> None:
    graph, params = _mlp()
    with pytest.raises(CompressionError, match=r"'up\.weight'.*\+r65.*rank 65 exceeds"):
        rlx_mil.convert(graph, params, compress="lut4-scaled+r65;check=off")


def test_the_correction_lowers_the_activation_weighted_error() -> None:
    """With inputs whose features differ in scale, the correction fitted to their second moments
    removes more of the layer's output error than the unweighted SVD of the same rank."""
    rng = np.random.default_rng(3)
    out, inp, rank = 48, 64, 4
    w = rng.standard_normal((out, inp))
    scales = np.exp(rng.uniform(-2.5, 2.5, inp))
    x = rng.standard_normal((512, inp)) * scales
    q = palettize(w.astype(np.float32), PaletteScheme(bits=3, granularity="per_tensor"), np.float32).dequantize().astype(np.float64)
    e = w - q

    def output_error(fix: np.ndarray) -> float:
        return float(np.linalg.norm(x @ (e - fix).T))
    weighted = np.matmul(*fit_correction(e, rank, np.float32, np.mean(x * x, axis=0)))
    uniform = np.matmul(*fit_correction(e, rank, np.float32))
    assert output_error(weighted) < 0.85 * output_error(uniform) < 0.85 * output_error(np.zeros_like(e))


def test_auto_prices_the_correction_per_byte() -> None:
    rng = np.random.default_rng(5)
    # a weight whose error has a strong low-rank part: an outlier row and column
    w = rng.standard_normal((128, 96)).astype(np.float32)
    w[:, 7] *= 12
    w[3, :] *= 9
    options = options_for(w, 4, Target.IOS26, np.float16, None, ("lut4-scaled", "lut4-scaled+r4", "lut6"))
    by = {o.scheme.label: o for o in options}
    base, fixed = by["lut4-tensor-scaled"], by.get("lut4-tensor-scaled+r4")
    assert fixed is not None and fixed.bytes == base.bytes + 2 * 4 * (128 + 96)
    assert fixed.error < base.error
    assert "lut4-tensor-scaled+r4" not in {o.scheme.label for o in options_for(
        w, 4, Target.IOS26, np.float16, None, ("lut4-scaled", "lut4-scaled+r4", "lut6"), corrected=False)}


@pytest.fixture(scope="module")
def tiny_ane_packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tiny_llm_package import BUCKET, MAX_CONTEXT, tiny_checkpoint

    from rlx_mil.llm.package import convert_llm_checkpoint

    folder = tmp_path_factory.mktemp("lowrank_ane")
    checkpoint = tiny_checkpoint(folder, 0)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for spec in ("lut4-scaled", "lut4-scaled+r2"):
            out[spec] = folder / f"{spec}.mlpackage"
            convert_llm_checkpoint(checkpoint, out[spec], max_context=MAX_CONTEXT, prefill=[BUCKET], compress=spec,
                                   deploy="ane", precision="fp32")
    return out


def test_a_stateful_neural_engine_package_with_corrections_stays_as_valid(tiny_ane_packages: dict[str, Path]) -> None:
    """decode + prefill of a tiny Llama in the Neural Engine form: the corrections add no
    preflight finding, run as 1x1 convs, skip the tied embedding / head, and are stored once
    for both functions (as their weights are)."""
    plain, corrected = tiny_ane_packages["lut4-scaled"], tiny_ane_packages["lut4-scaled+r2"]
    findings = {p: sorted((f.rule, f.severity) for f in rlx_mil.preflight(str(p), device="ane")) for p in (plain, corrected)}
    assert findings[corrected] == findings[plain]
    import coremltools as ct

    report = report_of(ct.models.MLModel(str(corrected), skip_model_load=True))
    assert report is not None
    schemes = {w.name: w.scheme for w in report.weights}
    assert any(s.endswith("+r2") for s in schemes.values())
    assert all(not s.endswith("+r2") for n, s in schemes.items() if "embed" in n or "lm_head" in n)
    factors = sum(2 * 4 * sum(w.shape) for w in report.weights if w.scheme.endswith("+r2"))  # fp32: 4 bytes, rank 2
    bins = {p: sum(f.stat().st_size for f in p.rglob("*.bin")) for p in (plain, corrected)}
    assert factors <= bins[corrected] - bins[plain] < 2 * factors  # once, not once per function
    stored = StoredWeights(str(corrected), report.weights)
    for w in report.weights:
        if w.scheme.endswith("+r2"):
            assert stored[w.name].shape == tuple(w.shape)


def test_apples_core_ai_runtime_runs_the_corrections_as_the_executor(tmp_path: Path) -> None:
    pytest.importorskip("coreai", reason="needs the coreai extra: pip install -e \".[coreai]\" (Python >= 3.11)")
    from rlx_mil.coreai.crosscheck import crosscheck

    graph, params = _mlp()
    path = tmp_path / "m.mlpackage"
    for deploy in ("plain", "ane"):  # (Core AI's translator takes no scaled palettes yet: a grouped table here)
        rlx_mil.convert(graph, params, compress="lut4+r4;check=off", precision="fp32", deploy=deploy).save(str(path))
        x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
        report = crosscheck(path, [(None, {"x": x})])
        assert len(report.outputs) == 1 and not report.failures(rtol=1e-4, atol=1e-5), report.failures()
