"""The code blocks of README.md and docs/*.md, and running them as written.

Every ```python and ```sh block carries a marker in the HTML comment right before it:

* `<!-- doc-test: run -->`: tests/test_doc_blocks.py runs it twice, from a clean folder.
* `<!-- doc-test: long -->`: too long for the test suite (an install, a conversion of seconds
  and more); `python benchmarks/doc_blocks.py` runs these the same way.
* `<!-- doc-test: long, stands-in: KIND=NAME[, KIND=NAME ...] -->`: a long block that reads
  files it does not make (a checkpoint folder, a GGUF file, a package): the script first lays
  down a tiny stand-in of each KIND under the exact NAME the block uses (see `STAND_INS`).
* `<!-- doc-test: needs WHAT -->`: it cannot run here and the comment says why (macOS, the real
  Whisper weights, a synopsis with placeholders, variables from another block); the test still
  checks every `rlx-mil` command in it against the parser.

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
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_MARKER = re.compile(r"<!--\s*doc-test:\s*(run|long|needs)\b\s*(.*?)\s*-->")
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
    "siglip-folder": "a tiny random SigLIP checkpoint (patch 16, image 224)",
    "siglip2-folder": "a tiny random SigLIP2 checkpoint (patch 16, 256 patches, as the naflex models)",
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

    def marker_problems(self) -> list[str]:
        """What is wrong with the block's marker (its vocabulary), empty when nothing."""
        if not self.kind:
            return [f"{self.where}: no <!-- doc-test: run|long|needs ... --> marker"]
        if self.kind == "needs" and not self.note:
            return [f"{self.where}: a needs marker says what the block needs"]
        if self.kind == "run" and self.note:
            return [f"{self.where}: a run marker takes no text, got {self.note!r}"]
        if self.kind == "long" and self.note:
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


def blocks(languages: tuple[str, ...] = ("python", "sh")) -> list[Block]:
    found = []
    for path in doc_files():
        text = path.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            if match.group(1) not in languages:
                continue
            before = text[:match.start()].rstrip("\n").splitlines()
            comments = []
            while before and before[-1].strip().startswith("<!--"):
                comments.append(before.pop())
            marker = next((m for c in comments if (m := _MARKER.search(c))), None)
            found.append(Block(str(path.relative_to(ROOT)), text[:match.start()].count("\n") + 1, match.group(1),
                               match.group(2), marker.group(1) if marker else "", marker.group(2) if marker else ""))
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


def run_twice(block: Block, timeout: float = 600) -> str | None:
    """None when the block runs twice in one clean folder (its stand-ins laid down first); else
    what went wrong."""
    with tempfile.TemporaryDirectory(prefix="rlx_mil_doc_") as tmp:
        for name, kind in block.stand_ins.items():
            lay_down(kind, Path(tmp) / name.rstrip("/"))
        for attempt in (1, 2):
            done = run_block(block, Path(tmp), timeout)
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
