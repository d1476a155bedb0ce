"""Core AI assets as an output: `convert-hf --stateful -o NAME.aimodel` (plain, `--compress
int4`, `--compress lut4`) writes an asset that `rlx-mil generate --chat` and `rlx-mil eval` run
on Apple's runtime, with the tokens and perplexity of the same package through milexec; a
prefill + decode asset stores its weights once; `rlx_mil.save(model, "x.aimodel")` works for a
plain graph."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("coreai", reason="needs the coreai extra: pip install -e \".[coreai]\" (Python >= 3.11)")

from llm.text_fixtures import chat_checkpoint

import rlx_mil
from rlx_mil.cli import main
from rlx_mil.coreml.package_info import package_info
from rlx_mil.ir.graph import Graph
from rlx_mil.llm.generate import Session

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, tuple[Path, Path]]:
    """compress scheme -> (asset, package) of one tiny chat checkpoint. The plain asset is
    written by the command line (`-o NAME.aimodel`), the compressed ones from their packages."""
    from rlx_mil.coreai.asset import save_aimodel

    folder = tmp_path_factory.mktemp("aimodel")
    checkpoint = chat_checkpoint(folder / "tiny-chat")
    out: dict[str | None, tuple[Path, Path]] = {}
    for compress in (None, "int4", "lut4"):
        extra = ["--compress", compress] if compress else []
        package = folder / f"{compress or 'plain'}.mlpackage"
        _convert(checkpoint, package, *extra)
        asset = folder / f"{compress or 'plain'}.aimodel"
        if compress is None:
            # --verify: the package against the reference, then the asset (Apple's runtime)
            # against the package; a difference is exit code 1.
            _convert(checkpoint, asset, "--verify")
            assert not list(folder.glob(".rlx_mil_convert_*"))  # the staging package is gone
        else:
            save_aimodel(package, asset)
        out[compress] = (asset, package)
    return out


def _convert(checkpoint: Path, out: Path, *extra: str) -> None:
    assert main(["convert-hf", str(checkpoint), "-o", str(out), "--stateful", "--max-context", "32", "--prefill", "8",
                 "--precision", "fp32", "-q", *extra]) == 0


def _weights_bytes(asset: Path) -> int:
    return (asset / "main.mlirb").stat().st_size


@pytest.mark.parametrize("compress", [None, "int4", "lut4"])
def test_asset_generates_the_packages_tokens(converted: dict[str | None, tuple[Path, Path]], compress: str | None,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    asset, package = converted[compress]
    prompt = [3, 17, 5, 9, 11, 2]
    want = Session(package, engine="milexec").generate(prompt, 8)
    assert Session(asset).generate(prompt, 8) == want
    capsys.readouterr()
    assert main(["generate", str(package), "--chat", "--prompt", QUESTION, "-n", "8", "-q", "--engine", "milexec"]) == 0
    want_text = capsys.readouterr().out
    assert main(["generate", str(asset), "--chat", "--prompt", QUESTION, "-n", "8", "-q"]) == 0
    assert capsys.readouterr().out == want_text
    # The asset keeps the compressed form: about the package's weight bytes, not the dense ones
    # (the tiny model's program structure is a large share of both here).
    weights = package_info(package).weight_bytes
    assert _weights_bytes(asset) <= 1.6 * weights + 40_000, (_weights_bytes(asset), weights)


def test_eval_of_the_asset_matches_the_package(converted: dict[str | None, tuple[Path, Path]], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    asset, package = converted[None]
    text_file = tmp_path / "text.txt"
    text_file.write_text("The capital of France is Paris. Hello, how are you? " * 3)
    results = []
    for source, engine in ((asset, "coreai"), (package, "milexec")):
        capsys.readouterr()
        assert main(["eval", str(source), "--text", str(text_file), "--max-tokens", "40", "--json", "-q",
                     "--engine", engine]) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0]["scored"] == results[1]["scored"] > 0
    # milexec keeps the package's declared (fp16) cache dtype; the asset computes in fp32.
    assert results[0]["perplexity"] == pytest.approx(results[1]["perplexity"], rel=1e-3)


def test_prefill_and_decode_share_one_weight_copy(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((256, 256)).astype(np.float32)}
    graphs = {}
    for name, rows in (("prefill", 8), ("decode", 1)):
        g = Graph(name)
        x = g.input("x", [rows, 256])
        g.set_outputs([g.matmul(x, g.param("w", [256, 256]), name="y")])
        graphs[name] = g
    model = rlx_mil.convert_functions(graphs, params, precision="fp32")
    asset = rlx_mil.save(model, tmp_path / "two.aimodel")
    weight = params["w"].nbytes
    assert weight <= _weights_bytes(asset) < 1.1 * weight  # one copy, not two
    x = rng.standard_normal((8, 256)).astype(np.float32)
    from rlx_mil.coreai.asset import AssetProgram

    with AssetProgram(asset) as program:
        got = program.run({"x": x}, function_name="prefill")["y"]
    np.testing.assert_allclose(got, x @ params["w"], rtol=1e-5, atol=1e-4)


def test_inspect_shows_the_assets_entry_points(converted: dict[str | None, tuple[Path, Path]],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    asset, _ = converted[None]
    capsys.readouterr()
    assert main(["inspect", str(asset), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary["functions"]) == {"decode", "prefill_8"}
    assert {s["name"] for s in summary["functions"]["decode"]["states"]} == {"key_cache", "value_cache"}
    assert summary["program_bytes"] > 0 and "tokenizer.json" in summary["text_files"]


def test_checkpoint_api_writes_an_asset(converted: dict[str | None, tuple[Path, Path]], tmp_path: Path) -> None:
    from rlx_mil.llm.package import convert_llm_checkpoint

    _, package = converted[None]
    asset = tmp_path / "api.aimodel"
    convert_llm_checkpoint(package.parent / "tiny-chat", asset, max_context=32, prefill=[8], precision="fp32")
    assert (asset / "rlx_mil_text" / "tokenizer.json").is_file() and not list(tmp_path.glob(".rlx_mil_convert_*"))
    prompt = [3, 17, 5, 9]
    assert Session(asset).generate(prompt, 6) == Session(package, engine="milexec").generate(prompt, 6)
