"""Compressing Hugging Face checkpoints: bfloat16 [out, in] weights behind Transposes, tied
embeddings, and `rlx-mil convert-hf --compress ... --verify`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlx_mil.cli import main
from rlx_mil.models.pretrained import from_pretrained
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint
from tests.compress.helpers import convert_and_verify, op_types


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_bf16_checkpoint_compresses_every_matrix_once(tmp_path: Path, family: str) -> None:
    folder = write_random_checkpoint(tmp_path / family, TINY_CONFIGS[family], dtype="bfloat16")
    graph, params = from_pretrained(folder, seq_len=8)
    ids = np.random.default_rng(0).integers(0, TINY_CONFIGS[family]["vocab_size"], size=(1, 8)).astype(np.int32)
    model, report = convert_and_verify(graph, params, {"input_ids": ids}, "int4;min_size=0", roundtrip=False)
    matrices = {n for n in params if np.asarray(params[n]).ndim == 2 and "rope" not in n and "rotary" not in n
                and not n.endswith(("cos", "sin"))}
    names = [w.name for w in report.weights]
    assert set(names) == matrices and len(names) == len(set(names))
    # Checkpoint weights are [out, in]: stored as they are (per output channel = per row).
    assert {w.layout for w in report.weights} == {"dense"}
    assert op_types(model).count("constexpr_blockwise_shift_scale") == len(matrices)
    if TINY_CONFIGS[family]["tie_word_embeddings"]:
        assert report.weights[[w.name for w in report.weights].index("model.embed_tokens.weight")].role == "embedding"


def test_convert_hf_compress_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_random_checkpoint(tmp_path / "llama", TINY_CONFIGS["llama"], dtype="bfloat16")
    out = tmp_path / "m.mlpackage"
    assert main(["convert-hf", str(folder), "-o", str(out), "--seq-len", "8", "--quiet", "--verify",
                 "--compress", "lut4;embeddings=int8;min_size=0"]) == 0
    printed = capsys.readouterr().out
    check = [line for line in printed.splitlines() if "check logits" in line]
    # The one-call check, then the greedy-steps check: both against the dequantized weights.
    assert len(check) == 2 and all(line.rstrip().endswith("ok") for line in check), printed
    assert main(["inspect", str(out)]) == 0
    assert "compression: lut4-group16;embeddings=int8-sym-channel;min_size=0" in capsys.readouterr().out


def test_stateful_package_compresses_shared_weights_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Prefill and decode functions carry the same compressed weights once; --verify generates
    the reference's greedy tokens computed with the dequantized weights."""
    from rlx_mil.compress import report_of
    from rlx_mil.coreml.package_info import package_info

    folder = write_random_checkpoint(tmp_path / "qwen3", TINY_CONFIGS["qwen3"], dtype="bfloat16")
    packed = tmp_path / "int4.mlpackage"
    common = [str(folder), "--stateful", "--max-context", "32", "--prefill", "8", "--quiet", "--precision", "fp32"]
    assert main(["convert-hf", *common, "-o", str(packed), "--verify", "--compress", "int4;min_size=0",
                 "--allow-quality-loss"]) == 0  # int4 of every tiny random tensor: KL above 0.1
    assert ": ok" in capsys.readouterr().out
    info = package_info(packed)
    report = report_of(info.metadata)
    assert report is not None and len(report.weights) == 15  # tied embedding/LM head counted once
    # One copy for both functions: int4 + an fp32 scale per 32 weights is 0.156 of the fp32
    # bytes, plus the float norm scales and blob headers.
    assert report.bytes_after < info.weight_bytes < 0.3 * report.bytes_before


def test_verify_steps_encode_each_weight_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--verify's reference builds a graph per step; with the codes dict it carries between
    steps a compressed weight is encoded on the first step only, and the logits are the same."""
    from rlx_mil import api
    from rlx_mil.compress import dequantized, report_of
    from rlx_mil.llm.package import reference_logits

    folder = write_random_checkpoint(tmp_path / "llama", TINY_CONFIGS["llama"])
    graph, params = from_pretrained(folder, "prefill", seq_len=4)
    report = report_of(api.convert(graph, params, compress="int4;min_size=0;check=off", precision="fp32"))
    assert report is not None and report.weights
    calls: list[str] = []
    real = dequantized.encode

    def counting(arr: np.ndarray, scheme: object, precision: object, name: str) -> object:
        calls.append(name)
        return real(arr, scheme, precision, name)  # type: ignore[arg-type]

    monkeypatch.setattr(dequantized, "encode", counting)  # what the reference's dequantized view encodes with
    fresh = reference_logits(folder, [1, 2, 3], report)
    once = len(calls)
    assert once == len({w.name for w in report.weights})  # once per weight, though a run reads each twice
    kept: dict[str, object] = {}
    first = reference_logits(folder, [1, 2, 3], report, codes=kept)
    second = reference_logits(folder, [1, 2, 3, 4], report, codes=kept)
    assert len(calls) == 2 * once and len(kept) == once  # the second call encoded nothing
    np.testing.assert_array_equal(first, fresh)
    calls.clear()
    np.testing.assert_array_equal(reference_logits(folder, [1, 2, 3, 4], report), second)
