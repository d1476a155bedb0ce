"""Re-quantized GGUF tensors (`from_gguf(requantize=...)`, `convert-gguf --deploy ane`): each
quantized tensor is decoded by llama.cpp's rules and palettized / quantized again; checked
against the `gguf` package's own decode, independent NumPy properties of the tables, and the
executor on the package."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.gguf.gguf_files import write_gguf
from rlx_mil import reference
from rlx_mil.compress import dequantized_params, report_of
from rlx_mil.errors import InvalidOptionError
from rlx_mil.models import from_gguf
from rlx_mil.models.checkpoint import Checkpoint
from rlx_mil.models.gguf.codes import FORMATS
from rlx_mil.models.gguf.requantize import DecodedRows, parse_requantize
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

SEQ = 5


def _file(tmp: Path, types: Any, **extra: Any) -> tuple[Path, dict[str, np.ndarray], dict[str, Any]]:
    cfg: dict[str, Any] = {**copy.deepcopy(TINY_CONFIGS["llama"]), "rope_scaling": None, "num_hidden_layers": 1, **extra}
    weights = Checkpoint(write_random_checkpoint(tmp / "hf", cfg, seed=3))
    held = write_gguf(tmp / "m.gguf", cfg, {k: weights[k] for k in weights}, types=types)
    return tmp / "m.gguf", held, cfg


def _converted(path: Path, spec: str) -> tuple[Any, Any, Any, Any]:
    """(graph, params, model, report) of `path` re-quantized by `spec` (fp32 program)."""
    import rlx_mil

    graph, params = from_gguf(path, seq_len=SEQ, requantize=spec)
    model = rlx_mil.convert(graph, params, precision="fp32")
    report = report_of(model)
    assert report is not None
    return graph, params, model, report


def test_lut4_tables_hold_every_group_and_the_error_is_measured(tmp_path: Path) -> None:
    from rlx_mil import milexec

    path, held, cfg = _file(tmp_path, lambda n, s: "Q4_0" if "ffn" in n else "Q8_0")
    graph, params, model, report = _converted(path, "lut4")
    decoded = dequantized_params(params, model)
    by_name = {w.name: w for w in report.weights}
    assert set(by_name) == set(params.prequantized_weights())  # type: ignore[attr-defined]
    for name, w in by_name.items():
        kind = "Q4_0" if "mlp" in name else "Q8_0"
        assert w.scheme == f"gguf-{kind}>lut4-group16"
        got = np.asarray(decoded[name], np.float64)
        want = held[name]  # the gguf package's decode of the file
        rows = got.reshape(got.shape[0], -1)
        for g in range(0, rows.shape[0], 16):  # a 4-bit table per 16 output channels
            assert np.unique(rows[g:g + 16]).size <= 16
        error = float(np.max(np.abs(got - want)))
        assert w.max_error == pytest.approx(error, rel=1e-6, abs=1e-7)
        spread = float(np.max(want) - np.min(want))
        assert 0 < error < spread / 4  # lossy, but a fitted table, not noise
    ids = np.random.default_rng(1).integers(0, cfg["vocab_size"], (1, SEQ)).astype(np.int32)
    want_logits = reference.evaluate(graph, {"input_ids": ids}, decoded)["logits"]
    got_logits = milexec.run(model, {"input_ids": ids})["logits"]
    np.testing.assert_allclose(got_logits, want_logits, atol=1e-4 * np.abs(want_logits).max(), rtol=1e-4)


def test_per_type_spec_requantizes_only_that_type(tmp_path: Path) -> None:
    path, _, _ = _file(tmp_path, lambda n, s: "Q4_1" if "attn" in n else "Q8_0")
    _, params, model, report = _converted(path, "Q4_1=int8-block16")
    schemes = {w.name: w.scheme for w in report.weights}
    assert schemes["model.layers.0.self_attn.q_proj.weight"] == "gguf-Q4_1>int8-sym-block16"
    assert schemes["model.layers.0.mlp.up_proj.weight"] == "gguf-Q8_0"
    decoded = dequantized_params(params, model)
    exact = np.asarray(params["model.layers.0.self_attn.q_proj.weight"], np.float64)
    got = np.asarray(decoded["model.layers.0.self_attn.q_proj.weight"], np.float64)
    # int8 blocks of 16 re-quantizing 4-bit codes: within half an int8 step of each block.
    blocks = exact.reshape(exact.shape[0], -1, 16)
    step = np.abs(blocks).max(axis=2, keepdims=True) / 127
    assert np.all(np.abs(got.reshape(blocks.shape) - blocks) <= step / 2 + 1e-6)


def test_decoded_rows_are_the_gguf_decode(tmp_path: Path) -> None:
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    path, _, _ = _file(tmp_path, lambda n, s: "Q5_1")
    _, params = from_gguf(path, seq_len=SEQ)
    name = "model.layers.0.mlp.down_proj.weight"
    t = params.gguf_tensor(name)  # type: ignore[attr-defined]
    rows = DecodedRows(params.raw_rows(name), "Q5_1", t.shape)  # type: ignore[attr-defined]
    full = dequantize(t.raw, GGMLQuantizationType.Q5_1).reshape(t.shape)
    np.testing.assert_array_equal(rows[3:7], full[3:7])
    np.testing.assert_array_equal(np.asarray(rows), full)
    assert rows.reshape(t.shape[0], -1) is rows
    with pytest.raises(ValueError, match="rows only"):
        rows.reshape(-1)


@pytest.mark.parametrize("spec, message", [
    ("Q9_X=lut4", "'Q9_X' is not a quantized GGUF type"),
    ("Q6_K=lut5", "requantize Q6_K=lut5"),
    ("Q6_K=none", "give a scheme"),
    ("Q6_K", "requantize Q6_K"),
    ("Q6_K=lut6,lut4", "is not TYPE=SCHEME"),
])
def test_bad_specs_name_the_option(spec: str, message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        parse_requantize(spec, frozenset(FORMATS))


def test_spec_forms() -> None:
    types = frozenset(FORMATS)
    assert parse_requantize(None, types) == {} and parse_requantize("", types) == {}
    every = parse_requantize("lut4", types)
    assert set(every) == types and {s.label for s in every.values()} == {"lut4-group16"}
    some = parse_requantize({"Q6_K": "lut6", "Q5_K": "lut6-group4"}, types)
    assert {k: s.label for k, s in some.items()} == {"Q6_K": "lut6-group16", "Q5_K": "lut6-group4"}


def test_codes_are_made_once_per_params_for_a_code_store(tmp_path: Path) -> None:
    from rlx_mil.compress.code_store import CodeStore, CodeWriter

    path, held, _ = _file(tmp_path, lambda n, s: "Q4_0")
    _, params = from_gguf(path, seq_len=SEQ)
    name = "model.layers.0.mlp.up_proj.weight"
    store = CodeStore()
    first = params.prequantized_weights()[name].encode(np.float32, store.writer)  # type: ignore[attr-defined]
    again = params.prequantized_weights()[name].encode(np.float32, CodeStore().writer)  # type: ignore[attr-defined]
    assert again is first  # a second function's conversion shares the first one's arrays
    memory = params.prequantized_weights()[name].encode(np.float16, CodeWriter)  # type: ignore[attr-defined]
    assert memory is not params.prequantized_weights()[name].encode(np.float16, CodeWriter)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(first.dequantize(), held[name].astype(np.float32))  # Q4_0 is exact


def test_the_output_check_runs_only_when_asked(tmp_path: Path) -> None:
    """A GGUF conversion's codes are not checked on generated inputs (two float reference runs
    of the whole model) unless `compress` asks; asked, it measures them."""
    import rlx_mil

    path, _, _ = _file(tmp_path, lambda n, s: "Q8_0")
    graph, params = from_gguf(path, seq_len=SEQ)
    report = report_of(rlx_mil.convert(graph, params, precision="fp32"))
    assert report is not None and report.weights and report.check_error is None
    asked = report_of(rlx_mil.convert(graph, params, precision="fp32", compress="check=on"))
    assert asked is not None and asked.check_error is not None
    assert max(e["relative_l2"] for e in asked.check_error.values()) < 1e-3  # Q8_0 codes are the file's


def test_the_neural_engine_default_holds_4_bit_types_in_scaled_tables(tmp_path: Path) -> None:
    """`deploy="ane"`'s `ANE_SCHEME`: Q4_1 to one table on max-normalised rows with an fp16
    scale per row, Q8_0 to int8 per output channel; the executor computes what the reference
    computes with the decoded codes."""
    from rlx_mil import milexec
    from rlx_mil.models.gguf.requantize import ANE_SCHEME

    path, held, cfg = _file(tmp_path, lambda n, s: "Q4_1" if "ffn" in n else "Q8_0")
    graph, params, model, report = _converted(path, ANE_SCHEME)
    schemes = {w.name: w.scheme for w in report.weights}
    assert {s for n, s in schemes.items() if "mlp" in n} == {"gguf-Q4_1>lut4-tensor-scaled"}
    assert {s for n, s in schemes.items() if "mlp" not in n} == {"gguf-Q8_0>int8-sym-channel"}
    decoded = dequantized_params(params, model)
    for w in report.weights:
        got, want = np.asarray(decoded[w.name], np.float64), held[w.name]
        if "mlp" in w.name:  # one 16-entry table, scaled per row
            peak = np.max(np.abs(want), axis=1, keepdims=True)
            assert np.unique(np.round(got / np.where(peak == 0, 1, peak), 3)).size <= 16 + 2
        assert w.max_error == pytest.approx(float(np.max(np.abs(got - want))), rel=1e-5, abs=1e-6)
    ids = np.random.default_rng(2).integers(0, cfg["vocab_size"], (1, SEQ)).astype(np.int32)
    want_logits = reference.evaluate(graph, {"input_ids": ids}, decoded)["logits"]
    got_logits = milexec.run(model, {"input_ids": ids})["logits"]
    np.testing.assert_allclose(got_logits, want_logits, atol=1e-4 * np.abs(want_logits).max(), rtol=1e-4)
