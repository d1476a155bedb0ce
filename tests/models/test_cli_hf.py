"""`rlx-mil convert-hf`, `rlx-mil inspect graph.json` and the checkpoint-based demo."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from rlx_mil.cli import main
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint
from rlx_mil.progress import Progress


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli_hf")
    return {name: write_random_checkpoint(root / name, cfg, seed=3) for name, cfg in TINY_CONFIGS.items()}


@pytest.mark.parametrize("family", list(TINY_CONFIGS))
def test_convert_hf_every_family_verifies(family: str, folders: dict[str, Path], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / f"{family}.mlpackage"
    extra = ["--variant", "decode", "--cache-len", "5"] if family in ("qwen3", "gemma2", "qwen3_moe", "lfm2", "qwen3_5") else []
    # the image encoders: a resized image / a patch grid instead of tokens
    sizes = {"dinov2": ["--image-size", "20x12"], "dinov2_with_registers": ["--image-size", "12"],
             "siglip": ["--image-size", "20"], "siglip2": ["--seq-len", "6", "--spatial-shape", "2x3"],
             "siglip_vision_model": [], "siglip2_vision_model": ["--seq-len", "12"]}
    extra += sizes.get(family, ["--seq-len", "6"])
    code = main(["convert-hf", str(folders[family]), "-o", str(out), "--verify", "--quiet", *extra])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert out.is_dir()
    checks = [ln for ln in printed.out.splitlines() if ln.strip().startswith("check ")]
    assert checks and all(ln.endswith(" ok") for ln in checks)
    assert printed.err == ""  # --quiet: no progress


def test_convert_hf_progress_names_every_stage(folders: dict[str, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CI", "GITHUB_ACTIONS", "BUILDKITE", "GITLAB_CI", "TF_BUILD"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "m.mlpackage"
    graph_json = tmp_path / "g.json"
    assert main(["convert-hf", str(folders["llama"]), "-o", str(out), "--seq-len", "4", "--last-logits",
                 "--save-graph", str(graph_json), "--precision", "fp32"]) == 0
    err = capsys.readouterr().err
    for stage in ("reading the checkpoint", "loading weights: 23 tensors", "building the MIL program",
                  "Core ML passes (default)", "writing the package"):
        assert stage in err, err
    assert graph_json.is_file()
    monkeypatch.setenv("CI", "true")
    assert main(["convert-hf", str(folders["llama"]), "-o", str(out), "--seq-len", "4", "--overwrite"]) == 0
    assert capsys.readouterr().err == ""  # quiet under CI


def test_progress_bars_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    progress = Progress(stream=stream)
    progress.begin("loading weights", total=3, unit=" tensors")
    for _ in range(3):
        progress.advance()
    progress.end("3 tensors")
    text = stream.getvalue()
    assert "0/3 [" in text  # the bar, cleared when the stage ends
    assert re.search(r"\r  loading weights: 3 tensors \(\d+\.\d s\)\n$", text)


def test_convert_hf_refuses_before_work(folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "m.mlpackage"
    existing.mkdir()
    assert main(["convert-hf", str(folders["llama"]), "-o", str(existing)]) == 1
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert main(["convert-hf", str(folders["llama"]), "-o", str(tmp_path / "m.zip")]) == 1
    assert "a .mlpackage folder" in capsys.readouterr().err
    assert main(["convert-hf", str(tmp_path / "nothing"), "-o", str(tmp_path / "n.mlpackage")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rlx-mil convert-hf: error: ") and "nothing: no such checkpoint folder" in err
    assert main(["convert-hf", str(folders["llama"]), "-o", str(tmp_path / "d.mlpackage"), "--variant", "decode"]) == 1
    assert "needs cache_len" in capsys.readouterr().err
    assert main(["convert-hf", str(folders["bert"]), "-o", str(tmp_path / "b.mlpackage"), "--last-logits"]) == 1
    assert "is an encoder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.mlpackage"]


def test_inspect_graph_json(folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlx_mil.models import from_pretrained

    graph, _ = from_pretrained(folders["qwen3"], "decode", seq_len=2, cache_len=3)
    graph.to_json_file(tmp_path / "g.json")
    assert main(["inspect", str(tmp_path / "g.json")]) == 0
    text = capsys.readouterr().out
    assert "input_ids: I32[1, 2]" in text and "past_k_1: F32[1, 2, 3, 16]" in text
    assert "new_v_1: F32[1, 2, 5, 16]" in text and "logits: F32[1, 2, 96]" in text
    assert "Attention                            2" in text and "params:   26" in text
    assert "Binary(Add)" in text and "Activation(Silu)" in text
    assert main(["inspect", str(tmp_path / "g.json"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["op_histogram"]["Concat"] == 4 and len(info["params"]) == 26
    (tmp_path / "bad.json").write_text("{")
    assert main(["inspect", str(tmp_path / "bad.json")]) == 1
    assert "rlx-mil inspect: error:" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["qwen3", "bert", "gemma3_text", "gemma3", "smollm3", "granite", "phi4_mini", "qwen3_5",
                                    "granitemoehybrid", "qwen3_moe", "olmoe", "lfm2", "dinov2_with_registers", "siglip",
                                    "siglip2"])
def test_demo_other_families(family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo.mlpackage"
    keep = tmp_path / "ckpt"
    assert main(["demo", "-o", str(out), "--family", family, "--layers", "1", "--hidden", "32", "--heads", "4",
                 "--kv-heads", "2", "--seq", "8", "--checkpoint", str(keep), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert (keep / "config.json").is_file() and (keep / "model.safetensors").is_file()
    assert json.loads((keep / "config.json").read_text())["model_type"] == TINY_CONFIGS[family]["model_type"]
    line = next(ln for ln in printed.splitlines() if "check " in ln)
    assert line.endswith(" ok")


def test_a_bad_compression_spec_names_the_flag(folders: dict[str, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert-hf", str(folders["llama"]), "-o", str(tmp_path / "m.mlpackage"), "--compress", "int5"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlx-mil convert-hf: error: --compress: unknown compression scheme 'int5': expected"), err
    assert not (tmp_path / "m.mlpackage").exists()


def test_the_compression_line_reads_in_units(capsys: pytest.CaptureFixture[str]) -> None:
    from rlx_mil.cli.convert_hf import print_compression
    from rlx_mil.compress.report import METADATA_KEY, CompressionReport, WeightReport

    report = CompressionReport("int4", "iOS18", "fp16", [
        WeightReport("w", "weight", "int4-sym-block32", "dense", [4096, 4096], 33554432, 9437184, 0.1)])
    print_compression({METADATA_KEY: report.to_json()})
    # was "33554432 -> 9437184 bytes"
    assert capsys.readouterr().out.splitlines()[0] == "compressed 1 weight (int4): 32.0 MiB -> 9.0 MiB (0.281x)"
