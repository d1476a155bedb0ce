"""`rlx-mil convert --compress` and the compression report in `rlx-mil inspect`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlx_mil.cli import main
from tests.compress.tiny_lm import TinyLM, tiny_lm, tiny_lm_inputs, tiny_lm_params

CONFIG = TinyLM(layers=1)


def _files(tmp_path: Path) -> tuple[Path, Path, Path]:
    graph = tiny_lm(CONFIG)
    graph.to_json_file(tmp_path / "g.json")
    np.savez(tmp_path / "w.npz", **tiny_lm_params(graph, CONFIG))  # type: ignore[arg-type]
    np.savez(tmp_path / "in.npz", **tiny_lm_inputs(CONFIG))  # type: ignore[arg-type]
    return tmp_path / "g.json", tmp_path / "w.npz", tmp_path / "in.npz"


def test_convert_compress_with_check_then_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph, weights, inputs = _files(tmp_path)
    out = tmp_path / "m.mlpackage"
    spec = "lut4;embeddings=int8;lm_head=int4-block16"
    assert main(["convert", str(graph), "--params", str(weights), "-o", str(out), "--compress", spec,
                 "--compress-check", str(inputs)]) == 0
    printed = capsys.readouterr().out
    assert "compressed 9 weights (lut4-group16;embeddings=int8-sym-channel;lm_head=int4-sym-block16;min_size=2048)" in printed
    assert "output logits: max |error|" in printed
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "compression: lut4-group16;embeddings=int8-sym-channel" in text
    assert "embed_tokens.weight" in text and "int8-sym-channel" in text
    assert "vs the uncompressed conversion" in text
    assert main(["inspect", str(out), "--json"]) == 0
    meta = json.loads(capsys.readouterr().out)["metadata"]
    report = json.loads(meta["rlx_mil.compression"])
    assert {w["name"]: w["scheme"] for w in report["weights"]}["head.weight"] == "int4-sym-block16"
    err = report["output_error"]["logits"]
    assert 0 < err["relative_l2"] < 0.5 and err["max_abs"] > 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--compress", "int7"], "unknown compression scheme 'int7'"),
        (["--compress", "int4", "--target", "iOS16"], "4-bit linear quantization needs iOS18"),
        (["--compress-check", "in.npz"], "--compress-check needs --compress"),
    ],
)
def test_bad_compression_options_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    graph, weights, _ = _files(tmp_path)
    out = tmp_path / "m.mlpackage"
    extra = [str(tmp_path / e) if e.endswith(".npz") else e for e in extra]
    assert main(["convert", str(graph), "--params", str(weights), "-o", str(out), *extra]) == 1
    err = capsys.readouterr().err
    # One line, or a heading line and one "  - " line per weight when several are affected.
    lines = err.splitlines()
    assert message in err and lines[0].startswith("rlx-mil convert: error: ")
    assert all(line.startswith("  - ") for line in lines[1:])
    assert not out.exists()


def test_convert_auto_with_budget_and_calibration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph, weights, inputs = _files(tmp_path)
    out = tmp_path / "a.mlpackage"
    assert main(["convert", str(graph), "--params", str(weights), "-o", str(out), "--compress", "auto4",
                 "--compress-budget", "0.4", "--compress-calibration", str(inputs)]) == 0
    assert "compressed 9 weights (auto4;budget=0.4;min_size=2048)" in capsys.readouterr().out
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "activation-weighted errors" in text and "on the calibration inputs" in text and "auto4: est. error" in text
    assert main(["convert", str(graph), "--params", str(weights), "-o", str(tmp_path / "b.mlpackage"),
                 "--compress-budget", "0.3"]) == 1
    assert "--compress-budget, --max-error and --compress-calibration need --compress" in capsys.readouterr().err
