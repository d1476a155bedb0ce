"""Core AI assets as an output: stateful chat packages of one tiny checkpoint, each also written
as an asset, three ways: the Python API (`convert_llm_checkpoint(..., format="aimodel")` once,
saved as both a package and an asset), `convert-hf --compress int4 --deploy ane --precision
fp16 --verify --engine coreai` (the package verified through Apple's runtime), and
`convert-hf --compress lut4 --deploy gpu --format aimodel -o NAME --verify` (the asset
verified against its package). Each asset gives its package's logits, greedy tokens and
`rlx-mil generate --chat` text through Apple's runtime; `rlx-mil eval` gives the package's
perplexity; compressed weights stay compressed; a prefill + decode asset stores its weights
once; `rlx_mil.save(model, "x.aimodel")` works for a plain graph."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

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
CONVERT = ["--stateful", "--max-context", "32", "--prefill", "8", "-q"]
#: scheme -> its precision (the asset computes in fp32 either way).
PRECISION = {None: "fp32", "int4": "fp16", "lut4": "fp32"}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, tuple[Path, Path]]:
    """compress scheme -> (asset, package) of one tiny chat checkpoint: three conversions."""
    import rlx_mil.coreai.asset as asset_module
    from rlx_mil.llm.package import convert_llm_checkpoint

    folder = tmp_path_factory.mktemp("aimodel")
    checkpoint = chat_checkpoint(folder / "tiny-chat", layers=1)  # one layer: what is checked needs no more
    out: dict[str | None, tuple[Path, Path]] = {}
    # The API: one conversion for Core AI, saved as an asset (a name without a suffix) and a package.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = convert_llm_checkpoint(checkpoint, None, max_context=32, prefill=[8], precision="fp32",
                                       format="aimodel")
    out[None] = (rlx_mil.save(model, folder / "plain"), rlx_mil.save(model, folder / "plain.mlpackage", format="mlpackage"))
    # --verify --engine coreai: the package through Apple's runtime against the reference.
    _convert(checkpoint, folder / "int4.mlpackage", "--compress", "int4", "--deploy", "ane", "--precision", "fp16",
             "--verify", "--engine", "coreai", "--allow-quality-loss")
    out["int4"] = (asset_module.save_aimodel(folder / "int4.mlpackage", folder / "int4.aimodel"), folder / "int4.mlpackage")
    # --format aimodel: the package is staged and removed; keep a copy of it to compare with.
    real = asset_module.save_aimodel

    def keeping_the_package(package: Any, asset: Any, **kwargs: Any) -> Any:
        shutil.copytree(package, folder / "lut4.mlpackage")
        return real(package, asset, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(asset_module, "save_aimodel", keeping_the_package)
        _convert(checkpoint, folder / "lut4", "--compress", "lut4", "--deploy", "gpu", "--precision", "fp32",
                 "--format", "aimodel", "--verify", "--allow-quality-loss")
    assert not list(folder.glob(".rlx_mil_convert_*"))  # the staging package is gone
    out["lut4"] = (folder / "lut4.aimodel", folder / "lut4.mlpackage")
    return out


def _convert(checkpoint: Path, out: Path, *extra: str) -> None:
    assert main(["convert-hf", str(checkpoint), "-o", str(out), *CONVERT, *extra]) == 0


def _weights_bytes(asset: Path) -> int:
    return (asset / "main.mlirb").stat().st_size


@pytest.mark.parametrize("compress", [None, "int4", "lut4"])
def test_asset_generates_the_packages_tokens(converted: dict[str | None, tuple[Path, Path]], compress: str | None,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    asset, package = converted[compress]
    prompt = [3, 17, 5, 9, 11, 2]
    # The logits after the prompt, against the package on milexec: an fp32 package as declared
    # (its fp16 KV cache rounds at its casts, in the asset too); an fp16 one in float32 (the
    # asset's compute), which the asset's casts to fp16 still round, hence the wider limit.
    exact = PRECISION[compress] == "fp32"
    on_milexec, on_core_ai = Session(package, engine="milexec"), Session(asset)
    got_logits = on_core_ai.feed(prompt)
    want_logits = (on_milexec if exact else Session(package, engine="milexec", precision_model="float32")).feed(prompt)
    scale = float(np.max(np.abs(want_logits)))
    limit = 1e-4 if exact else 1e-2
    assert float(np.max(np.abs(got_logits - want_logits))) <= limit * scale
    on_milexec.reset()
    on_core_ai.reset()
    assert on_core_ai.generate(prompt, 8) == on_milexec.generate(prompt, 8)
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
    assert re.fullmatch(r"acme/tiny-chat, Qwen3 \(Qwen3ForCausalLM\), \d+\.\dK parameters; name from config\.json"
                        r" _name_or_path", summary["model_text"]), summary["model_text"]
    assert summary["model"]["name"] == "acme/tiny-chat" and summary["model"]["parameters"] > 0
    # The fp16 package's asset says what it computes in, beside the package's precision.
    assert main(["inspect", str(converted["int4"][0])]) == 0
    text = capsys.readouterr().out
    assert "fp32 compute of an fp16 package" in text and "  model: acme/tiny-chat, Qwen3" in text
    assert re.search(r"program \d+(\.\d)? (KiB|MiB) \(asset \d+(\.\d)? (KiB|MiB)\)", text), text


def test_the_api_asset_carries_the_text_files(converted: dict[str | None, tuple[Path, Path]]) -> None:
    asset, _ = converted[None]
    assert asset.name == "plain.aimodel"  # format="aimodel" named it
    assert (asset / "rlx_mil_text" / "tokenizer.json").is_file()
    assert not list(asset.parent.glob(".rlx_mil_convert_*"))
