"""Fixtures and helpers of `hostile_round4.py`: tiny random checkpoints, their packages, a
Whisper folder, a GGUF file, a chunked set and a Core AI asset, built once into a work folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


LIMIT_SECONDS = 60.0

LIMIT_RSS = 1 << 30

def _cli(*args: Any) -> list[str]:
    return [sys.executable, "-m", "rlx_mil.cli", *map(str, args)]


# ---------------------------------------------------------------- running
def _env(tmpdir: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmpdir), "CI": "1"}


# ---------------------------------------------------------------- fixtures
def build_fixtures(work: Path) -> dict[str, Path]:
    """Everything the cases point at, built once (reused when --work already holds it)."""
    import numpy as np
    import soundfile as sf
    from llm.text_fixtures import chat_checkpoint

    from rlx_mil.cli import main
    from rlx_mil.models.families.whisper import TINY_WHISPER
    from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

    fx: dict[str, Path] = {}
    work.mkdir(parents=True, exist_ok=True)
    fx["chat"] = work / "tiny-chat"
    if not (fx["chat"] / "config.json").exists():
        chat_checkpoint(fx["chat"])
    fx["llama"] = work / "llama"
    if not (fx["llama"] / "config.json").exists():
        write_random_checkpoint(fx["llama"], TINY_CONFIGS["llama"], seed=1)
    fx["other"] = work / "other-vocab"
    if not (fx["other"] / "config.json").exists():
        write_random_checkpoint(fx["other"], {**TINY_CONFIGS["llama"], "vocab_size": 90}, seed=2)
    stateful = ["--stateful", "--max-context", "32", "--prefill", "8", "--precision", "fp32", "-q"]
    fx["pkg"] = work / "chat.mlpackage"
    if not fx["pkg"].exists():
        assert main(["convert-hf", str(fx["chat"]), "-o", str(fx["pkg"]), *stateful]) == 0
    fx["chunks"] = work / "chat-chunks"
    if not fx["chunks"].exists():
        assert main(["convert-hf", str(fx["chat"]), "-o", str(fx["chunks"]), *stateful, "--chunk-bytes", "120000"]) == 0
    fx["graphpkg"] = work / "graph.mlpackage"
    if not fx["graphpkg"].exists():
        assert main(["convert-hf", str(fx["llama"]), "-o", str(fx["graphpkg"]), "--graph-only", "--seq-len", "8",
                     "-q"]) == 0
    fx["asset"] = work / "chat.aimodel"
    if not fx["asset"].exists():
        from rlx_mil.coreai.asset import save_aimodel

        save_aimodel(fx["pkg"], fx["asset"])
    fx["whisper"] = work / "whisper-tiny"
    if not fx["whisper"].exists():
        write_random_checkpoint(fx["whisper"], TINY_WHISPER, seed=4)
    fx["wk"] = work / "wk-text" / "openai_whisper-tiny"
    if not fx["wk"].exists():
        # a Whisper checkpoint with a real tokenizer (the speech tests' tiny one), so that
        # transcribe reads the audio through to the end
        from speech.fake_whisper import write_speech_folder
        from speech.test_transcribe_packages import CONFIG

        spoken = write_random_checkpoint(work / "whisper-text" / "openai_whisper-tiny", CONFIG, seed=7)
        write_speech_folder(work / "whisper-text-files")
        for name in ("tokenizer.json", "generation_config.json"):
            shutil.copy(work / "whisper-text-files" / name, spoken / name)
        assert main(["convert-hf", str(spoken), "-o", str(work / "wk-text"), "--cache-len", "32", "-q"]) == 0
    fx["gguf"] = work / "tiny.gguf"
    if not fx["gguf"].exists():
        from models.gguf.gguf_files import tiny_chat_gguf

        tiny_chat_gguf(fx["gguf"], layers=1, seed=3)
    fx["g_json"] = work / "noweights.json"
    if not fx["g_json"].exists():
        import rlx_mil

        g = rlx_mil.Graph("noweights")
        x = g.input("x", [2, 3])
        g.set_outputs([g.add(x, x, name="y")])
        g.to_json_file(fx["g_json"])
    fx["wav"] = work / "tone.wav"
    t = np.arange(16000) / 16000
    sf.write(fx["wav"], (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000, subtype="PCM_16")
    fx["long_wav"] = work / "tone-90s.wav"
    t90 = np.arange(90 * 16000) / 16000
    sf.write(fx["long_wav"], (0.3 * np.sin(2 * np.pi * 220 * t90)).astype(np.float32), 16000, subtype="PCM_16")
    return fx


# ---------------------------------------------------------------- hostile files
def _copy(src: Path, dst: Path) -> Path:
    if dst.exists():
        shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
    (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
    return dst


def _edit_json(path: Path, edit: Callable[[Any], Any]) -> None:
    data = json.loads(path.read_text())
    path.write_text(json.dumps(edit(data)))


def _wav(path: Path, data: Any, rate: int, subtype: str = "PCM_16") -> Path:
    import soundfile as sf

    sf.write(path, data, rate, subtype=subtype)
    return path


def _with_template(pkg: Path, dest: Path, template: Any) -> Path:
    out = _copy(pkg, dest)
    config = next(out.rglob("tokenizer_config.json"))
    _edit_json(config, lambda d: {**d, "chat_template": template})
    return out


def _with_tokenizer(pkg: Path, dest: Path, write: Callable[[Path], None]) -> Path:
    out = _copy(pkg, dest)
    write(next(out.rglob("tokenizer.json")))
    return out


def _gguf_bytes(version: int = 3, tensors: int = 0, kvs: int = 0, body: bytes = b"") -> bytes:
    import struct

    return b"GGUF" + struct.pack("<IQQ", version, tensors, kvs) + body


def _gguf_kv(key: str, type_id: int, payload: bytes) -> bytes:
    import struct

    raw = key.encode()
    return struct.pack("<Q", len(raw)) + raw + struct.pack("<I", type_id) + payload


def _gguf_str(text: bytes) -> bytes:
    import struct

    return struct.pack("<Q", len(text)) + text


def _gguf_with(work: Path, name: str, edit: Callable[[Any], None]) -> Path:
    """A metadata-only GGUF file written by the `gguf` package with `edit(writer)`."""
    from models.gguf.gguf_files import write_metadata_only

    path = work / name
    write_metadata_only(path, "llama", edit)
    return path


def _coremltools_models(nn: Path, program: Path) -> None:
    """A neural network .mlmodel and an ML program written by coremltools itself."""
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 3))])
    def prog(x: Any) -> Any:
        return mb.relu(x=x, name="y")

    ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS16).save(str(program))
    from coremltools.models import datatypes
    from coremltools.models.neural_network import NeuralNetworkBuilder

    builder = NeuralNetworkBuilder([("x", datatypes.Array(3))], [("y", datatypes.Array(3))])
    builder.add_activation("relu", "RELU", "x", "y")
    ct.models.MLModel(builder.spec).save(str(nn))


def _twin_run(proc: subprocess.Popen[str]) -> None:
    """A second conversion with the same arguments, at once: one of the two wins."""
    twin = subprocess.run(proc.args, capture_output=True, text=True, timeout=LIMIT_SECONDS,  # type: ignore[arg-type]
                          env=_env(Path(os.environ.get("HOSTILE_TMP", tempfile.gettempdir()))))
    if twin.returncode not in (0, 1) or "Traceback" in twin.stderr:
        raise AssertionError(f"the twin conversion: exit {twin.returncode}: {twin.stderr[-300:]}")


def _remove_later(folder: Path, seconds: float) -> None:
    def remove() -> None:
        time.sleep(seconds)
        shutil.rmtree(folder, ignore_errors=True)
    threading.Thread(target=remove, daemon=True).start()


def _valid_package(path: Path) -> bool:
    done = subprocess.run(_cli("inspect", path, "--json"), capture_output=True, text=True, timeout=LIMIT_SECONDS,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return done.returncode == 0 and [p.name for p in path.parent.iterdir()] == [path.name]


