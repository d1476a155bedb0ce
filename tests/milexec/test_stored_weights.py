"""`rlx_mil.milexec.stored_weights`: the weights a saved package holds, decoded from its own
codes, equal what `dequantized_params` computes for every ordinary scheme (and a GGUF file's
kept codes, and the Neural Engine form's cut and reshaped weights); a package that lacks a
weight its report lists is refused by name."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlx_mil
from rlx_mil.compress import dequantized_params, report_of
from rlx_mil.errors import MilExecError
from rlx_mil.ir.graph import Graph
from rlx_mil.milexec.stored_weights import StoredWeights, package_params
from tests.compress.tiny_lm import TinyLM, tiny_lm, tiny_lm_params

SCHEMES = ("int8", "int4", "uint4", "int4-sym-block16", "uint4-float", "lut4", "lut4-scaled", "lut6", "lut3-scaled",
           "lut2")


def _saved(tmp: Path, graph: Graph, params: dict[str, Any], **options: Any) -> tuple[Path, Any]:
    model = rlx_mil.convert(graph, params, **options)
    path = rlx_mil.save(model, tmp / "m.mlpackage", overwrite=True)
    report = report_of(model)
    assert report is not None and report.weights
    return Path(path), report


def _assert_same(path: Path, report: Any, params: Any, fp16: bool) -> None:
    stored = StoredWeights(path, report.weights)
    declared = StoredWeights(path, report.weights, precision_model="declared")
    want_all = dequantized_params(params, report)
    assert set(stored) == {w.name for w in report.weights}
    for w in report.weights:
        want = np.asarray(want_all[w.name], np.float32)
        got = stored[w.name]
        assert got.shape == tuple(w.shape) and got.dtype == np.float32
        np.testing.assert_array_equal(got, want, err_msg=f"{w.name} ({w.scheme})")
        # "declared": the weight as the package's float type holds it
        rounded = want.astype(np.float16).astype(np.float32) if fp16 else want
        np.testing.assert_array_equal(declared[w.name], rounded, err_msg=f"{w.name} ({w.scheme}, declared)")


def _matmuls(rows: int, cols: int, transposed: bool) -> Graph:
    """x @ W and x @ V^T: a [K, N] weight (stored transposed) and an [N, K] one read through a Transpose."""
    g = Graph("two_matmuls")
    x = g.input("x", [2, rows], "f32")
    y = g.matmul(x, g.param("w", [rows, cols]), name="mm")
    v = g.param("v", [cols, rows] if transposed else [rows, cols])
    z = g.matmul(x, g.transpose(v, [1, 0]) if transposed else v, name="mm2")
    g.set_outputs([g.add(y, z, name="out")])
    return g


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scheme=st.sampled_from(SCHEMES), rows=st.sampled_from([32, 64]), cols=st.sampled_from([16, 48]),
       transposed=st.booleans(), fp16=st.booleans(), seed=st.integers(0, 2**16))
def test_stored_weights_are_the_dequantized_weights(tmp_path: Path, scheme: str, rows: int, cols: int, transposed: bool,
                                                    fp16: bool, seed: int) -> None:
    graph = _matmuls(rows, cols, transposed)
    rng = np.random.default_rng(seed)
    params = {n.op.name: rng.standard_normal(n.shape.sizes()).astype(np.float32) for n in graph if n.op.type_name == "Param"}
    path, report = _saved(tmp_path, graph, params, compress=f"{scheme};min_size=1", precision="fp16" if fp16 else "fp32")
    _assert_same(path, report, params, fp16)


@pytest.mark.parametrize(("compress", "options"), [
    ("int8", {"target": "iOS17"}),  # constexpr_affine_dequantize
    ("lut4", {"target": "iOS16"}),  # the iOS16 LUT, indices packed
    ("4bit", {"deploy": "ane"}),  # lut4-scaled, [O, C, 1, 1] conv weights, the head cut in two
])
def test_every_target_and_the_neural_engine_form(tmp_path: Path, compress: str, options: dict[str, Any]) -> None:
    # A head wider than 16,384 for the Neural Engine form (it cuts it in two); small otherwise.
    wide = options.get("deploy") == "ane"
    config = TinyLM(vocab=16400 if wide else 256, hidden=16, heads=2, kv_heads=1, intermediate=32, layers=1, seq=4)
    graph = tiny_lm(config)
    params = tiny_lm_params(graph, config)
    path, report = _saved(tmp_path, graph, params, compress=compress, precision="fp16", **options)
    _assert_same(path, report, params, fp16=True)
    if options.get("deploy") == "ane":
        pieces = StoredWeights(path, report.weights).op_names("head.weight")
        assert [p.rsplit(":", 1)[1] for p in pieces] == ["logits_weight_conv_part0", "logits_weight_conv_part1"]


def _gguf(tmp: Path, types: Any) -> tuple[Any, Any, Path, Any]:
    from rlx_mil.models import from_gguf
    from rlx_mil.models.checkpoint import Checkpoint
    from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint
    from tests.models.gguf.gguf_files import write_gguf

    cfg: dict[str, Any] = {**copy.deepcopy(TINY_CONFIGS["llama"]), "rope_scaling": None, "num_hidden_layers": 1}
    weights = Checkpoint(write_random_checkpoint(tmp / "hf", cfg, seed=3))
    write_gguf(tmp / "m.gguf", cfg, {k: weights[k] for k in weights}, types=types)
    graph, params = from_gguf(tmp / "m.gguf", seq_len=4)
    path, report = _saved(tmp, graph, params, precision="fp16")
    return graph, params, path, report


@pytest.mark.parametrize("kinds", [("Q4_0", "Q8_0"), ("Q5_1", "Q4_1")])
def test_a_gguf_files_kept_codes(tmp_path: Path, kinds: tuple[str, str]) -> None:
    """The file's own codes (the 5-bit types held split in two tables, summed at run time)."""
    _, params, path, report = _gguf(tmp_path, lambda n, s: kinds[0] if "ffn" in n else kinds[1])
    assert {w.scheme for w in report.weights} >= {f"gguf-{k}" for k in kinds}
    declared = StoredWeights(path, report.weights, precision_model="declared")
    stored = StoredWeights(path, report.weights)
    want_all = dequantized_params(params, report)
    for w in report.weights:
        want = np.asarray(want_all[w.name], np.float32)
        # as the fp16 program holds them: the split form's run-time ops round as they declare
        np.testing.assert_array_equal(declared[w.name], want.astype(np.float16).astype(np.float32), err_msg=w.scheme)
        # the float32 decode: the codes' values, the split form's scaling unrounded
        np.testing.assert_allclose(stored[w.name], want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max()),
                                   err_msg=w.scheme)
        if not w.scheme.startswith("gguf-Q5"):
            np.testing.assert_array_equal(stored[w.name], want, err_msg=w.scheme)


def test_package_params_replace_only_the_compressed_weights(tmp_path: Path) -> None:
    graph = tiny_lm(TinyLM(layers=1))
    params = tiny_lm_params(graph, TinyLM(layers=1))
    path, report = _saved(tmp_path, graph, params, compress="int4", precision="fp32")
    mapped = package_params(params, path, report)
    compressed = {w.name for w in report.weights}
    assert set(mapped) == set(params) and len(mapped) == len(params)
    for name in params:
        if name in compressed:
            assert not np.array_equal(mapped[name], params[name])
        else:
            assert mapped[name] is params[name]


def test_a_weight_the_program_lacks_is_named(tmp_path: Path) -> None:
    from rlx_mil.milexec.protoread import read_program

    graph = tiny_lm(TinyLM(layers=1))
    params = tiny_lm_params(graph, TinyLM(layers=1))
    path, report = _saved(tmp_path, graph, params, compress="int8", precision="fp32")
    by_name = {w.name: w for w in report.weights}
    kept = {w.name: list(w.ops) for w in report.weights}
    lost = report.weights[1]
    lost.ops = ["no_such_op"]
    with pytest.raises(MilExecError, match=rf"compressed weight '{lost.name}'"):
        StoredWeights(path, report.weights)
    lost.ops = kept[lost.name]
    # a report naming an op the program computes from its inputs, or another weight's op
    program = read_program(path)
    assert program is not None
    computed = next(op.name for op in program.functions["main"].operations if op.op_type == "linear")
    by_name["layers.0.mlp.up_proj.weight"].ops = [computed]
    with pytest.raises(MilExecError, match=rf"{computed}' reads the input"):
        StoredWeights(path, report.weights)["layers.0.mlp.up_proj.weight"]
    by_name["layers.0.mlp.up_proj.weight"].ops = kept["layers.0.mlp.up_proj.weight"]
    by_name["layers.0.self_attn.k_proj.weight"].ops = kept["layers.0.self_attn.q_proj.weight"]  # [64, 64] for [64, 32]
    with pytest.raises(MilExecError, match=r"of weight 'layers\.0\.self_attn\.k_proj\.weight'"):
        StoredWeights(path, report.weights)["layers.0.self_attn.k_proj.weight"]
    # A report from before the ops were recorded: the weight's MIL identifier names its op.
    by_identifier = [w for w in report.weights if kept[w.name][0] == w.name.replace(".", "_")]
    assert by_identifier  # the embedding: its op is named after the Param
    for w in by_identifier:
        w.ops = []
    np.testing.assert_array_equal(StoredWeights(path, by_identifier)[by_identifier[0].name],
                                  dequantized_params(params, report)[by_identifier[0].name])


def test_a_multifunction_package_reads_its_other_functions_only_for_a_weight_the_default_lacks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Functions sharing every weight: only the default function is parsed. A weight only
    another function reads is still found (that function parsed then), decoded exactly."""
    from rlx_mil.milexec import protoread

    def one_matmul(weight: str) -> Graph:
        g = Graph(f"mm_{weight}")
        x = g.input("x", [2, 64], "f32")
        g.set_outputs([g.matmul(x, g.param(weight, [64, 64]), name=f"out_{weight}")])
        return g

    rng = np.random.default_rng(0)
    params = {name: rng.standard_normal((64, 64)).astype(np.float32) for name in ("w", "v")}
    parsed: list[str] = []
    original = protoread._Reader.function

    def counted(self: Any, name: str, spec: Any) -> Any:
        parsed.append(name)
        return original(self, name, spec)

    monkeypatch.setattr(protoread._Reader, "function", counted)
    def spec(weight: str) -> Any:
        return (one_matmul(weight), {"params": {weight: params[weight]}})

    for functions, wanted, names in (({"first": spec("w"), "second": spec("w")}, ["first"], {"w"}),
                                     ({"first": spec("w"), "second": spec("v")}, ["first", "second"], {"w", "v"})):
        model = rlx_mil.convert_functions(functions, default_function="first", compress="int8", precision="fp32")
        path = rlx_mil.save(model, tmp_path / "mf.mlpackage", overwrite=True)
        report = report_of(model)
        assert report is not None and {w.name for w in report.weights} == names
        parsed.clear()
        stored = StoredWeights(path, report.weights)
        assert parsed == wanted
        want = dequantized_params(params, report)
        for w in report.weights:
            np.testing.assert_array_equal(stored[w.name], np.asarray(want[w.name], np.float32))


def test_decoding_gives_back_the_codes_pages_of_a_package_it_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight's mapped codes are released once decoded (the quality check decodes every
    weight of a model: their pages would otherwise stay resident); a program given already (a
    session's) keeps its pages. The values are the same either way."""
    from rlx_mil.milexec import stored_weights
    from rlx_mil.milexec.loader import load_program, mapped_file

    graph = tiny_lm(TinyLM(layers=1))
    params = tiny_lm_params(graph, TinyLM(layers=1))
    path, report = _saved(tmp_path, graph, params, compress="int8", precision="fp32")
    released: list[np.ndarray] = []
    monkeypatch.setattr(stored_weights, "release", released.append)
    name = report.weights[0].name
    value = StoredWeights(path, report.weights)[name]
    assert released and all(mapped_file(v) is not None for v in released)
    assert any(v.dtype == np.int8 and v.size == value.size for v in released)  # the weight's codes
    released.clear()
    np.testing.assert_array_equal(StoredWeights(load_program(path, packed_4bit=True), report.weights)[name], value)
    assert released == []
