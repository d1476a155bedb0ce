"""GGUF tensors planned by the conversion's own `compress=` (`from_gguf(requantize="compress")`,
`convert-gguf --deploy ane`): the quantized tensors become float weights (llama.cpp's decode,
read one tensor at a time), `auto4` plans them in the Neural Engine's forms on text tokenized by
the file's own tokenizer, and the quality check and `--verify` judge the package against the
file's decode."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.gguf.gguf_files import bpe_metadata, trained_bpe, write_gguf
from rlx_mil import reference
from rlx_mil.cli import main
from rlx_mil.compress import report_of
from rlx_mil.errors import InvalidOptionError
from rlx_mil.models import from_gguf
from rlx_mil.models.checkpoint import Checkpoint
from rlx_mil.models.gguf.codes import FORMATS
from rlx_mil.models.gguf.requantize import COMPRESS, compressed_types, parse_requantize
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint
from rlx_mil.models.verify import package_weights

SEQ = 5
#: What the Neural Engine holds: per-channel palettes and int8 per output channel, no per-block ints.
ANE_LABELS = ("lut3-tensor-scaled", "lut4-tensor-scaled", "lut6-group16", "lut6-tensor-scaled", "int8-sym-channel")


def _types(name: str, shape: Any) -> str:
    return "Q4_1" if "ffn" in name else "Q8_0"


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """A tiny Llama with its tokenizer: Q4_1 feed-forward weights, Q8_0 elsewhere (tied
    embeddings), and the weights the file holds (the `gguf` package's decode)."""
    tmp = tmp_path_factory.mktemp("gguf_ane_plan")
    tok = trained_bpe("smollm")
    cfg: dict[str, Any] = {**copy.deepcopy(TINY_CONFIGS["llama"]), "vocab_size": tok.get_vocab_size(),
                           "rope_parameters": None, "tie_word_embeddings": True, "num_hidden_layers": 1}
    weights = Checkpoint(write_random_checkpoint(tmp / "hf", cfg, seed=5))
    held = write_gguf(tmp / "m.gguf", cfg, {k: weights[k] for k in weights}, types=_types,
                      tokenizer=bpe_metadata(tok, "smollm"))
    return tmp / "m.gguf", held


def test_compress_specs() -> None:
    types = frozenset(FORMATS)
    assert parse_requantize(COMPRESS, types) == {} and compressed_types(COMPRESS, types) == types
    mixed = "Q4_1=compress,Q8_0=lut6"
    assert {k: s.label for k, s in parse_requantize(mixed, types).items()} == {"Q8_0": "lut6-group16"}
    assert compressed_types(mixed, types) == {"Q4_1"}
    assert compressed_types({"Q6_K": "compress"}, types) == {"Q6_K"} and compressed_types("lut4", types) == frozenset()
    with pytest.raises(InvalidOptionError, match="Q9_X"):
        compressed_types("Q9_X=compress", types)
    with pytest.raises(InvalidOptionError, match="or 'compress'"):
        parse_requantize("Q4_1=none", types)


def test_compressed_types_are_float_weights_of_the_files_decode(mixed_gguf: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, held = mixed_gguf
    _, params = from_gguf(path, seq_len=SEQ, requantize="Q4_1=compress")
    carried = params.prequantized_weights()  # type: ignore[attr-defined]
    assert carried and all(w.type_name == "Q8_0" for w in carried.values())  # the others keep their codes
    name = "model.layers.0.mlp.down_proj.weight"
    assert name not in carried
    np.testing.assert_array_equal(params[name], held[name].astype(np.float32))  # llama.cpp's decode, exactly
    _, every = from_gguf(path, seq_len=SEQ, requantize=COMPRESS)
    assert every.prequantized_weights() == {}  # type: ignore[attr-defined]


def test_the_files_decode_is_made_a_slab_of_rows_at_a_time(mixed_gguf: tuple[Path, dict[str, np.ndarray]],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A quantized tensor read as a float weight is llama.cpp's decode whether it takes one slab
    or many (a slab of 64 weights: 1 to 4 rows of these tensors, Q/K rows re-ordered)."""
    import rlx_mil.models.gguf.tensors as tensors

    path, held = mixed_gguf
    _, params = from_gguf(path, seq_len=SEQ, requantize=COMPRESS)
    quantized = [n for n in held if params.source_type(n) in ("Q4_1", "Q8_0")]  # type: ignore[attr-defined]
    assert len(quantized) >= 7 and "model.layers.0.self_attn.q_proj.weight" in quantized
    whole = {n: params[n] for n in quantized}
    monkeypatch.setattr(tensors, "DECODE_SLAB", 64)
    for name in quantized:
        sliced = params[name]
        assert sliced.dtype == np.float32 and sliced.shape == held[name].shape
        np.testing.assert_array_equal(sliced, whole[name])
        np.testing.assert_array_equal(sliced, held[name].astype(np.float32))


def test_python_api_plans_the_files_tensors_for_the_neural_engine(mixed_gguf: tuple[Path, dict[str, np.ndarray]],
                                                                  tmp_path: Path) -> None:
    """`from_gguf(requantize="compress")` + `convert(deploy="ane", compress=gguf_compress("auto4", ...))`:
    every tensor of the file planned in a Neural Engine form, on the file's tokenized text (the
    plan's sensitivities in mean KL), and the executor computing what the reference computes on
    the codes' decode."""
    import rlx_mil
    from rlx_mil import milexec
    from rlx_mil.llm.calibration import gguf_compress

    path, held = mixed_gguf
    config = gguf_compress("auto4", path, deploy="ane")
    assert config.calibration is not None and config.calibration_graph is not None
    assert config.candidates and config.fit == "on" and config.budget == pytest.approx(0.4)
    graph, params = from_gguf(path, seq_len=SEQ, requantize=COMPRESS)
    model = rlx_mil.convert(graph, params, precision="fp32", deploy="ane", compress=config)
    report = report_of(model)
    assert report is not None and report.weights
    assert "predicted mean KL" in report.plan  # measured on the calibration text's next tokens
    assert {w.scheme for w in report.weights} <= set(ANE_LABELS), [w.scheme for w in report.weights]
    assert "model.embed_tokens.weight" in {w.name for w in report.weights}
    # What each weight was in the file, beside what it became.
    assert {w.name: w.source for w in report.weights} == {
        w.name: "Q4_1" if ".mlp." in w.name else "Q8_0" for w in report.weights}
    counts = {t: sum(w.source == t for w in report.weights) for t in ("Q4_1", "Q8_0")}
    assert counts["Q4_1"] == 3 and "from the file's types: Q4_1 (3) -> " in report.to_text()
    assert report.bytes_after <= 0.4 * report.bytes_before * 1.01
    saved = tmp_path / "ane.mlpackage"
    rlx_mil.save(model, saved)
    decoded = package_weights(params, saved, report)  # codes fitted to the text: the package's own, decoded
    errors = {}
    for w in report.weights:  # against the file's decode: close, not noise (a Q8_0 row of one block is exact in int8)
        want = held[w.name].astype(np.float64)
        errors[w.name] = np.abs(np.asarray(decoded[w.name], np.float64) - want).max()
        assert errors[w.name] < 0.25 * (want.max() - want.min()), (w.name, w.scheme, errors[w.name])
    assert max(errors.values()) > 0
    ids = np.random.default_rng(2).integers(0, held["model.embed_tokens.weight"].shape[0], (1, SEQ)).astype(np.int32)
    want_logits = reference.evaluate(graph, {"input_ids": ids}, decoded)["logits"]
    got_logits = milexec.run(model, {"input_ids": ids})["logits"]
    np.testing.assert_allclose(got_logits, want_logits, atol=1e-4 * np.abs(want_logits).max(), rtol=1e-4)
    assert gguf_compress("int8", path) == rlx_mil.compress.parse_compress("int8")  # nothing to measure: no text


def _convert(path: Path, out: Path, *extra: str) -> int:
    return main(["convert-gguf", str(path), "-o", str(out), "--seq-len", str(SEQ), "--precision", "fp32", "--deploy",
                 "ane", "--quiet", "--overwrite", *extra])


def test_deploy_ane_plans_with_auto4_and_judges_against_the_files_decode(
        mixed_gguf: tuple[Path, dict[str, np.ndarray]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = mixed_gguf
    out, report_path = tmp_path / "ane.mlpackage", tmp_path / "r.json"
    assert _convert(path, out, "--verify", "--report", str(report_path)) == 0
    printed = capsys.readouterr().out
    assert "compressed" in printed and "auto4;budget=0.4;fit=on" in printed
    assert re.search(r"\n  from the file's types: Q4_1 \(3\) -> [^;\n]+; Q8_0 \(\d+\) -> ", printed), printed
    assert "quality vs the float model the GGUF codes decode to: top-1" in printed
    assert "tokens of the built-in held-out English text" in printed
    assert "verify: fidelity" in printed and "verify: quality" in printed and "FAILED" not in printed
    body = json.loads(report_path.read_text())
    schemes = {w["scheme"] for w in body["compression"]["weights"]}
    assert schemes and schemes <= set(ANE_LABELS), schemes
    assert "predicted mean KL" in body["compression"]["plan"]  # calibrated on the file's tokenized text
    assert body["quality"]["compared_with"] == "the float model the GGUF codes decode to"
    # The user's text: the plan calibrates on it and the check measures on it, tokenized by the file.
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 20, encoding="utf-8")
    assert _convert(path, out, "--compress-calibration", str(text), "--compress-budget", "0.35") == 0
    printed = capsys.readouterr().out
    assert "auto4;budget=0.35;fit=on" in printed and "tokens of the given text" in printed


def test_a_bad_requantization_warns_and_fails_verify(
        mixed_gguf: tuple[Path, dict[str, np.ndarray]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--requantize lut2` overrides the plan (every quantized tensor a 2-bit table): the check
    against the file's decode says it is below the thresholds and `--verify` fails."""
    path, _ = mixed_gguf
    assert _convert(path, tmp_path / "bad.mlpackage", "--requantize", "lut2", "--verify") == 1
    printed = capsys.readouterr().out
    assert "gguf-Q4_1>lut2-group16" in printed and "auto4" not in printed
    assert "quality vs the float model the GGUF codes decode to" in printed and "BELOW THRESHOLD" in printed
    assert "verify: FAILED: quality below the thresholds" in printed
