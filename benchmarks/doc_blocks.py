"""The code blocks of README.md and docs/*.md, and running them as written.

Every ```python and ```sh block carries a marker in the HTML comment right before it:

* `<!-- doc-test: run -->`: tests/test_doc_blocks.py runs it twice, from a clean folder.
* `<!-- doc-test: long -->`: too long for the test suite (an install, a conversion of seconds
  and more); `python benchmarks/doc_blocks.py` runs these the same way.
* `<!-- doc-test: needs WHAT -->`: it needs what the comment says (a real checkpoint, a Mac,
  a file it names); the test still checks every `rlx-mil` command in it against the parser.

`python benchmarks/doc_blocks.py [--all]` runs the long blocks (with --all, the `run` ones too)
twice each and prints one line per block.
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


@dataclass(frozen=True)
class Block:
    file: str
    line: int
    language: str
    code: str
    kind: str  # "run", "long", "needs" or "" (no marker)
    note: str

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


def run_twice(block: Block, timeout: float = 600) -> str | None:
    """None when the block runs twice in one clean folder; else what went wrong."""
    with tempfile.TemporaryDirectory(prefix="rlx_mil_doc_") as tmp:
        for attempt in (1, 2):
            done = run_block(block, Path(tmp), timeout)
            if done.returncode != 0:
                tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
                return f"{block.where}: run {attempt} exited {done.returncode}:\n{tail}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="also the blocks the test suite runs")
    args = parser.parse_args()
    failed = 0
    for block in blocks():
        if block.kind == "long" or (args.all and block.kind == "run"):
            problem = run_twice(block, timeout=3600)
            print(f"{block.where}: {'ok' if problem is None else 'FAILED'}", flush=True)
            if problem is not None:
                print(problem, flush=True)
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
