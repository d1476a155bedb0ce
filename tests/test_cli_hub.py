"""Hub ids in convert-hf (`owner/name`) and convert-gguf (`REPO:FILE`): downloaded through
huggingface_hub from a fake Hub on 127.0.0.1 (`HF_ENDPOINT`) into a cache of the test's own
(`HF_HOME`); the cached copy serves `HF_HUB_OFFLINE=1`; no network and no copy, an unknown
repository or file: one typed error line. No request leaves the machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_hub import fake_hub
from tiny_llm_package import tiny_checkpoint

from rlx_mil.cli.hub import hub_file, hub_id
from rlx_mil.coreml.package_info import package_info

ROOT = Path(__file__).resolve().parent.parent


def _cli(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # A process of its own: huggingface_hub reads HF_ENDPOINT / HF_HUB_OFFLINE when imported.
    return subprocess.run([sys.executable, "-m", "rlx_mil.cli", *argv], capture_output=True, text=True, cwd=cwd,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_DISABLE_TELEMETRY": "1",
                               **env}, timeout=600)


def test_ids_and_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert hub_id("Qwen/Qwen3-0.6B") == ("Qwen/Qwen3-0.6B", None)
    assert hub_id("HuggingFaceTB/SmolLM2-135M@v1.0") == ("HuggingFaceTB/SmolLM2-135M", "v1.0")
    for local in ("model", "./a/b", "/abs/path", "a/b/c", "~/x/y"):
        assert hub_id(local) is None
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert hub_id("org/name") is None  # an existing folder is the folder
    assert hub_file("org/repo:model.Q4_K_M.gguf") == ("org/repo", "model.Q4_K_M.gguf", None)
    assert hub_file("org/repo@main:sub/m.gguf") == ("org/repo", "sub/m.gguf", "main")
    assert hub_file("model.gguf") is None and hub_file("C:/x.gguf") is None


def test_convert_hf_downloads_a_hub_id_then_works_offline(tmp_path: Path) -> None:
    folder = tiny_checkpoint(tmp_path / "repo", seed=3)
    (folder / "not-needed.bin").write_bytes(b"x" * 1000)  # what a checkpoint needs is fetched, not this
    home = tmp_path / "hf"
    with fake_hub({"tiny-org/tiny-llama": folder}) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(home)}
        done = _cli(["convert-hf", "tiny-org/tiny-llama", "-o", "a.mlpackage", "--max-context", "16", "-q"], env, tmp_path)
        assert done.returncode == 0, done.stderr
        fetched = {r.split()[-1].rsplit("/", 1)[-1] for r in hub.requests if r.startswith("GET") and "/resolve/" in r}
        assert fetched == {"config.json", "model.safetensors"}
    snapshots = list((home / "hub" / "models--tiny-org--tiny-llama" / "snapshots").iterdir())
    assert len(snapshots) == 1 and (snapshots[0] / "model.safetensors").is_file()
    info = package_info(tmp_path / "a.mlpackage")
    assert sorted(info.functions) == ["decode", "prefill_8"]
    # the Hub gone: offline mode uses the cached copy; without it, one typed error
    offline = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(home)}
    done = _cli(["convert-hf", "tiny-org/tiny-llama", "-o", "b.mlpackage", "--max-context", "16", "-q"], offline, tmp_path)
    assert done.returncode == 0, done.stderr
    done = _cli(["convert-hf", "tiny-org/other", "-o", "c.mlpackage", "-q"], offline, tmp_path)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        "rlx-mil convert-hf: error: tiny-org/other: not in the Hugging Face cache, and HF_HUB_OFFLINE is set;"
        " download it once online, or pass a local folder"]
    # no network (nothing listens at the endpoint) and no cached copy
    dead = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "empty")}
    done = _cli(["convert-hf", "tiny-org/tiny-llama", "-o", "d.mlpackage", "-q"], dead, tmp_path)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the Hugging Face Hub (http://127.0.0.1:9)" in lines[0], lines
    assert not (tmp_path / "c.mlpackage").exists() and not (tmp_path / "d.mlpackage").exists()


def test_unknown_repository_and_file_are_typed_errors(tmp_path: Path) -> None:
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "model.gguf").write_bytes(b"GGUF" + bytes(20))  # a broken GGUF: downloaded, then refused
    with fake_hub({"org/ggufs": folder}) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")}
        done = _cli(["convert-hf", "org/missing", "-o", "x.mlpackage", "-q"], env, tmp_path)
        assert done.returncode == 1 and "org/missing: no such repository on the Hub" in done.stderr, done.stderr
        done = _cli(["convert-gguf", "org/ggufs:absent.gguf", "-o", "x.mlpackage", "-q"], env, tmp_path)
        assert done.returncode == 1 and "org/ggufs:absent.gguf: the repository has no such file" in done.stderr
        done = _cli(["convert-gguf", "org/ggufs:model.gguf", "-o", "x.mlpackage", "-q"], env, tmp_path)
        assert done.returncode == 1 and done.stderr.startswith("rlx-mil convert-gguf: error: ")
        assert "/resolve/" in " ".join(hub.requests)  # the file was downloaded before the GGUF reader refused it
    assert len(done.stderr.strip().splitlines()) == 1 and os.listdir(tmp_path / "hf")


def test_a_missing_folder_typed_as_a_relative_path_is_no_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`convert-hf ./models/SmolLM2` where the folder is missing: argparse's Path dropped the
    "./", and the command then looked for `models/SmolLM2` on the Hub."""
    from rlx_mil.cli import hub, main

    def no_download(*args: object, **kwargs: object) -> Path:
        raise AssertionError(f"downloaded {args}")

    monkeypatch.setattr(hub, "download_checkpoint", no_download)
    monkeypatch.chdir(tmp_path)
    assert main(["convert-hf", "./models/SmolLM2", "-o", "m.mlpackage"]) == 1
    assert capsys.readouterr().err.strip() == "rlx-mil convert-hf: error: models/SmolLM2: no such checkpoint folder"
