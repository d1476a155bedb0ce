"""The code blocks of README.md and docs/*.md, and running them as written.

Every fenced block (indented ones, inside a list item, included) carries a marker in the HTML
comment right before it:

* `<!-- doc-test: run -->`: tests/test_doc_blocks.py runs it twice, from a clean folder.
* `<!-- doc-test: long -->`: too long for the test suite (an install, a conversion of seconds
  and more); `python benchmarks/doc_blocks.py` runs these the same way.
* `<!-- doc-test: long, stands-in: KIND=NAME[, KIND=NAME ...] -->`: a long block that reads
  files it does not make (a checkpoint folder, a GGUF file, a package): the script first lays
  down a tiny stand-in of each KIND under the exact NAME the block uses (see `STAND_INS`).
* `<!-- doc-test: long, in a clone -->`: a block the README runs from a clone of the
  repository: the script runs it in a fresh clone, in the virtual environment `.venv` the
  README's first block makes there.
* `<!-- doc-test: needs WHAT -->`: it cannot run here and the comment says why (macOS, Swift,
  the whole test suite's time, PyTorch); the test still checks every `rlx-mil` command in it
  against the parser.
* `<!-- doc-test: shows WHAT -->`: not code (a diagram, an output sample, a file tree): a block
  without a language.

Only ```python and ```sh blocks run; a ```swift block needs macOS; a block without a language
shows something.

`python benchmarks/doc_blocks.py [--all]` runs the long blocks (with --all, the `run` ones too)
twice each in one clean temporary folder and prints one line per block.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```[ \t]*$", re.S | re.M)
_MARKER = re.compile(r"<!--\s*doc-test:\s*(run|long|needs|shows)\b\s*(.*?)\s*-->")
_IN_CLONE = ", in a clone"
#: What runs here (python with this interpreter, sh with bash -e).
RUNNABLE = ("python", "sh")
_STANDS_IN = re.compile(r"^,\s*stands-in:\s*(.+)$")

#: The stand-ins a `long` block may ask for, by kind (each tiny, written in seconds):
STAND_INS = {
    "decoder-folder": "a tiny random Qwen3 checkpoint with a tokenizer, chat template and generation config",
    "llama-folder": "the same as decoder-folder, of the Llama family",
    "gguf": "a tiny Llama-style GGUF file (Q8_0 weights, context 8192) with a BPE tokenizer in its metadata",
    "llm-package": "the stateful prefill + decode package of decoder-folder (max context 128, prefill 8)",
    "graph-package": "a stateless one-graph package of decoder-folder (prefill, seq 8)",
    "rlx-graph": "an RLX graph JSON file: y = gelu(x [1, 16, 64] @ w [64, 64]), README's 'Using it' block",
    "graph-params": "the weight w of rlx-graph, as .npz or .safetensors after the NAME's suffix",
    "graph-inputs": "an input x of rlx-graph, as .npz",
    "encoder-package": "a tiny BERT package [2, 128] with a WordPiece tokenizer (MiniLM's context of 512)",
    "dinov2-folder": "a tiny random DINOv2 checkpoint (patch 14, image 518, as dinov2-small)",
    "siglip-folder": "a tiny random SigLIP checkpoint (patch 16, image 224) with SigLIP's preprocessor_config.json",
    "siglip2-folder": "a tiny random SigLIP2 checkpoint (patch 16, 256 patches, as the naflex models)",
    "siglip-package": "the image-embedding package of siglip-folder (--normalize)",
    "image": "a 320 x 240 RGB picture (PNG or JPEG after the NAME's suffix)",
    "whisper-folder": "a tiny random Whisper checkpoint with a small multilingual tokenizer",
    "whisper-package": "WhisperKit's folder (stateful decoder too) converted from whisper-folder",
    "wav": "three seconds of a warbling tone, 22.05 kHz 16-bit (WAV or FLAC after the NAME's suffix)",
}


@dataclass(frozen=True)
class Block:
    file: str
    line: int
    language: str
    code: str
    kind: str  # "run", "long", "needs" or "" (no marker)
    note: str

    @property
    def stand_ins(self) -> dict[str, str]:
        """{NAME: KIND} of a `long, stands-in: KIND=NAME, ...` marker (empty otherwise)."""
        match = _STANDS_IN.match(self.note) if self.kind == "long" else None
        if match is None:
            return {}
        pairs = [item.strip().split("=", 1) for item in match.group(1).split(",")]
        return {name.strip(): kind.strip() for kind, name in pairs}

    @property
    def in_clone(self) -> bool:
        return self.kind == "long" and self.note == _IN_CLONE

    def marker_problems(self) -> list[str]:
        """What is wrong with the block's marker (its vocabulary), empty when nothing."""
        if not self.kind:
            return [f"{self.where}: no <!-- doc-test: run|long|needs|shows ... --> marker"]
        if self.kind in ("needs", "shows") and not self.note:
            return [f"{self.where}: a {self.kind} marker says what the block {self.kind}"]
        if self.kind in ("run", "long") and self.language not in RUNNABLE:
            return [f"{self.where}: a ```{self.language} block does not run here; mark it needs WHAT or shows WHAT"]
        if self.kind == "shows" and self.language:
            return [f"{self.where}: a ```{self.language} block is code: mark it run, long or needs WHAT"]
        if self.kind == "needs" and not self.language:
            return [f"{self.where}: a block without a language is not code: mark it shows WHAT"]
        if self.kind == "run" and self.note:
            return [f"{self.where}: a run marker takes no text, got {self.note!r}"]
        if self.kind == "long" and self.note and not self.in_clone:
            match = _STANDS_IN.match(self.note)
            if match is None:
                return [f"{self.where}: a long marker takes only ', stands-in: KIND=NAME, ...', got {self.note!r}"]
            problems = []
            for item in match.group(1).split(","):
                kind, equals, name = item.strip().partition("=")
                if not equals or not name.strip():
                    problems.append(f"{self.where}: stand-in {item.strip()!r} is not KIND=NAME")
                elif kind.strip() not in STAND_INS:
                    problems.append(f"{self.where}: no stand-in kind {kind.strip()!r} (one of {sorted(STAND_INS)})")
            return problems
        return []

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(languages: tuple[str, ...] | None = None) -> list[Block]:
    """Every fenced block of the docs (or those of `languages`), an indented one dedented."""
    found = []
    for path in doc_files():
        text = path.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            indent, language = match.group(1), match.group(2)
            if languages is not None and language not in languages:
                continue
            lines = match.group(3).splitlines(keepends=True)
            code = "".join(line[len(indent):] if line.startswith(indent) else line.lstrip(" ") for line in lines)
            before = text[:match.start()].rstrip("\n").splitlines()
            comments = []
            while before and before[-1].strip().startswith("<!--"):
                comments.append(before.pop())
            marker = next((m for c in comments if (m := _MARKER.search(c))), None)
            found.append(Block(str(path.relative_to(ROOT)), text[:match.start()].count("\n") + 1, language,
                               code, marker.group(1) if marker else "", marker.group(2) if marker else ""))
    return found


def _shim(folder: Path) -> dict[str, str]:
    """An environment whose `rlx-mil` is this checkout's command (whatever is installed)."""
    bin_dir = folder / "_bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "rlx-mil"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rlx_mil.cli "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("RLX_MIL_TRACEBACK", None)
    return env


def run_block(block: Block, folder: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run the block in `folder` (python with this interpreter, sh with bash -e)."""
    env = _shim(folder)
    command = [sys.executable, "-c", block.code] if block.language == "python" else ["bash", "-e", "-c", block.code]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)


#: The real models' context lengths, which the stand-ins keep (a block asks for up to these).
_MAX_POSITIONS = {"qwen3": 40960, "llama": 131072}


def _chat_checkpoint(folder: Path, family: str) -> None:
    import json

    sys.path.insert(0, str(ROOT / "tests"))
    from llm.text_fixtures import chat_checkpoint

    chat_checkpoint(folder, family=family)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = _MAX_POSITIONS[family]
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def lay_down(kind: str, path: Path) -> None:
    """Write the tiny stand-in of `kind` (a key of STAND_INS) at `path`."""
    if kind in ("decoder-folder", "llama-folder"):
        _chat_checkpoint(path, "qwen3" if kind == "decoder-folder" else "llama")
    elif kind == "gguf":
        sys.path.insert(0, str(ROOT / "tests"))
        from models.gguf.gguf_files import bpe_metadata, trained_bpe, write_gguf

        from rlx_mil.models.checkpoint import Checkpoint
        from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

        tokenizer = trained_bpe("smollm")
        config = {**TINY_CONFIGS["llama"], "vocab_size": tokenizer.get_vocab_size(), "rope_parameters": None,
                  "tie_word_embeddings": True, "num_hidden_layers": 2, "max_position_embeddings": 8192}
        with tempfile.TemporaryDirectory(prefix="rlx_mil_doc_ckpt_") as tmp:
            weights = Checkpoint(write_random_checkpoint(Path(tmp), config, seed=0))
            write_gguf(path, config, {k: weights[k] for k in weights}, types=lambda name, shape: "Q8_0",
                       tokenizer=bpe_metadata(tokenizer, "smollm"))
    elif kind in ("llm-package", "graph-package"):
        with tempfile.TemporaryDirectory(prefix="rlx_mil_doc_ckpt_") as tmp:
            checkpoint = Path(tmp) / "tiny"
            _chat_checkpoint(checkpoint, "qwen3")
            shape = ["--max-context", "128", "--prefill", "8"] if kind == "llm-package" else ["--graph-only", "--seq-len", "8"]
            command = [sys.executable, "-m", "rlx_mil.cli", "convert-hf", str(checkpoint), "-o", str(path), *shape, "-q"]
            subprocess.run(command, check=True, env=_shim(Path(tmp)), capture_output=True)
    elif kind in ("rlx-graph", "graph-params", "graph-inputs"):
        _graph_files(kind, path)
    elif kind == "encoder-package":
        _encoder_package(path)
    elif kind in ("dinov2-folder", "siglip-folder", "siglip2-folder"):
        _vision_folder(kind.removesuffix("-folder"), path)
    elif kind == "siglip-package":
        with tempfile.TemporaryDirectory(prefix="rlx_mil_doc_ckpt_") as tmp:
            _vision_folder("siglip", Path(tmp) / "siglip")
            command = [sys.executable, "-m", "rlx_mil.cli", "convert-hf", str(Path(tmp) / "siglip"), "-o", str(path),
                       "--normalize", "-q"]
            subprocess.run(command, check=True, env=_shim(Path(tmp)), capture_output=True)
    elif kind == "image":
        _picture(path)
    elif kind in ("whisper-folder", "whisper-package"):
        _whisper(kind, path)
    elif kind == "wav":
        _warble(path)
    else:
        raise ValueError(f"no stand-in kind {kind!r}")


def _graph_files(kind: str, path: Path) -> None:
    import numpy as np

    from rlx_mil import Graph

    if kind == "rlx-graph":
        g = Graph("block")
        x = g.input("x", [1, 16, 64])
        w = g.param("w", [64, 64])
        g.set_outputs([g.gelu(g.matmul(x, w), name="y")])
        path.write_text(g.to_json(indent=1))
        return
    if kind == "graph-inputs":
        np.savez(path, x=np.random.default_rng(1).standard_normal((1, 16, 64)).astype(np.float32))
        return
    params = {"w": (np.random.default_rng(0).standard_normal((64, 64)) / 8).astype(np.float32)}
    if path.suffix == ".npz":
        np.savez(path, w=params["w"])
    else:
        from safetensors.numpy import save_file

        save_file(params, str(path))


def _encoder_package(path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from llm.text_fixtures import write_wordpiece_tokenizer
    from tokenizers import Tokenizer

    from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

    with tempfile.TemporaryDirectory(prefix="rlx_mil_doc_ckpt_") as tmp:
        checkpoint = Path(tmp) / "tiny-bert"
        write_wordpiece_tokenizer(checkpoint)
        vocab = Tokenizer.from_file(str(checkpoint / "tokenizer.json")).get_vocab_size()
        write_random_checkpoint(checkpoint, {**TINY_CONFIGS["bert"], "vocab_size": vocab, "max_position_embeddings": 512})
        command = [sys.executable, "-m", "rlx_mil.cli", "convert-hf", str(checkpoint), "-o", str(path),
                   "--seq-len", "128", "--batch-size", "2", "-q"]
        subprocess.run(command, check=True, env=_shim(Path(tmp)), capture_output=True)


def _vision_folder(family: str, path: Path) -> None:
    import copy

    from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

    config = copy.deepcopy(TINY_CONFIGS[family])
    vision = config.get("vision_config", config)
    if family == "dinov2":
        vision.update(patch_size=14, image_size=518)
    elif family == "siglip":
        vision.update(patch_size=16, image_size=224)
    else:
        vision.update(patch_size=16, num_patches=256)
    write_random_checkpoint(path, config, seed=0)
    if family == "siglip":  # google/siglip-base-patch16-224's image processor, as the Hub folder has it
        import json

        settings = {"image_processor_type": "SiglipImageProcessor", "do_resize": True, "size": {"height": 224, "width": 224},
                    "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "processor_class": "SiglipProcessor"}
        (path / "preprocessor_config.json").write_text(json.dumps(settings, indent=2))


def _picture(path: Path) -> None:
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:240, 0:320]
    pixels = np.stack([x * 255 // 320, y * 255 // 240, (x + y) % 256], axis=-1).astype(np.uint8)
    Image.fromarray(pixels, "RGB").save(path)


def _warble(path: Path, seconds: float = 3.0, rate: int = 22050) -> None:
    import numpy as np
    import soundfile as sf

    t = np.arange(round(seconds * rate)) / rate
    audio = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 2 * t))
    sf.write(path, audio.astype(np.float32), rate, subtype="PCM_16")


def _whisper(kind: str, path: Path) -> None:
    """The checkpoint (a tiny random Whisper with a small multilingual tokenizer) or the folder
    of packages converted from it: always the same weights, so a package and a checkpoint laid
    down side by side belong together."""
    sys.path.insert(0, str(ROOT))
    from rlx_mil.models.families.whisper import TINY_WHISPER
    from rlx_mil.models.random_checkpoint import write_random_checkpoint
    from rlx_mil.speech.packages import convert_whisper
    from tests.speech.fake_whisper import EOT, SOT, VOCAB, write_speech_folder

    def checkpoint(folder: Path) -> Path:
        config = {**TINY_WHISPER, "vocab_size": VOCAB, "decoder_start_token_id": SOT, "pad_token_id": EOT,
                  "bos_token_id": EOT, "eos_token_id": EOT, "max_target_positions": 64,
                  "begin_suppress_tokens": [220, EOT]}
        write_random_checkpoint(folder, config, seed=7)
        write_speech_folder(folder.parent / f"{folder.name}-text")
        for name in ("tokenizer.json", "generation_config.json"):
            (folder.parent / f"{folder.name}-text" / name).rename(folder / name)
        return folder

    if kind == "whisper-folder":
        checkpoint(path)
        return
    with tempfile.TemporaryDirectory(prefix="rlx_mil_doc_ckpt_") as tmp:
        source = checkpoint(Path(tmp) / f"whisper-{path.name.rsplit('-', 1)[-1]}")
        written = convert_whisper(source, Path(tmp) / "out", precision="fp32", cache_len=32, stateful=True)
        written.folder.rename(path)


def _clone_and_run(block: Block, folder: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """The block in a fresh clone of this checkout's commit, in the `.venv` README's first
    block makes there (a virtual environment of its own: an install never touches this one)."""
    clone = folder / "rlx_mil"
    if not clone.exists():
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "RLX_MIL_TRACEBACK")}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    script = f"python3 -m venv .venv && . .venv/bin/activate\n{block.code}"
    return subprocess.run(["bash", "-e", "-c", script], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=timeout)


def run_twice(block: Block, timeout: float = 600) -> str | None:
    """None when the block runs twice in one clean folder (its stand-ins laid down first); else
    what went wrong."""
    with tempfile.TemporaryDirectory(prefix="rlx_mil_doc_") as tmp:
        for name, kind in block.stand_ins.items():
            where = Path(tmp) / name.rstrip("/")
            where.parent.mkdir(parents=True, exist_ok=True)
            lay_down(kind, where)
        for attempt in (1, 2):
            done = _clone_and_run(block, Path(tmp), timeout) if block.in_clone else run_block(block, Path(tmp), timeout)
            if done.returncode != 0:
                tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
                return f"{block.where}: run {attempt} exited {done.returncode}:\n{tail}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="also the blocks the test suite runs")
    parser.add_argument("--only", default="", help="only blocks whose FILE:LINE contains this")
    args = parser.parse_args()
    failed = 0
    for block in blocks():
        if args.only not in block.where:
            continue
        if block.kind == "long" or (args.all and block.kind == "run"):
            problem = run_twice(block, timeout=3600)
            print(f"{block.where}: {'ok' if problem is None else 'FAILED'}", flush=True)
            if problem is not None:
                print(problem, flush=True)
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
