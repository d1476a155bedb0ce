"""The code blocks of README.md and docs/*.md (benchmarks/doc_blocks.py): each carries a marker
of the script's vocabulary; the `run` ones run as written, twice, from a clean folder (the `long`
ones, with their stand-ins, in the script); every `rlx-mil` command in any block names a real
subcommand and real options."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from doc_blocks import STAND_INS, Block, blocks, run_twice

ALL = blocks()
RUN = [b for b in ALL if b.kind == "run"]


def test_every_block_is_marked() -> None:
    problems = [p for b in ALL for p in b.marker_problems()]
    assert not problems, "\n".join(problems)
    assert len(RUN) >= 4
    standing_in = [b for b in ALL if b.stand_ins]
    assert len(standing_in) >= 20
    # what does not run says why: macOS (Swift, Core ML's prediction), the suite's or a benchmark's time and weights
    reasons = sorted({b.note.split(" ", 2)[0] + " " + b.note.split(" ", 2)[1] for b in ALL if b.kind == "needs"})
    assert len([b for b in ALL if b.kind == "needs"]) <= 10, reasons
    assert {kind for b in standing_in for kind in b.stand_ins.values()} == set(STAND_INS)


@pytest.mark.parametrize("marker, problem", [
    ("<!-- doc-test: needs -->", "says what the block needs"),
    ("<!-- doc-test: run now -->", "a run marker takes no text"),
    ("<!-- doc-test: long, stands-in: qwen-folder=Qwen3-0.6B -->", "no stand-in kind 'qwen-folder'"),
    ("<!-- doc-test: long, stands-in: gguf -->", "is not KIND=NAME"),
    ("<!-- doc-test: long, with: gguf=x.gguf -->", "takes only ', stands-in: KIND=NAME"),
    ("<!-- a comment -->", "no <!-- doc-test"),
    ("<!-- doc-test: shows an output -->", "a ```sh block is code"),
    ("<!-- doc-test: shows -->", "a shows marker says what the block shows"),
    ("<!-- doc-test: long, in a clone, stands-in: gguf=x.gguf -->", "takes only ', stands-in: KIND=NAME"),
])
def test_a_marker_outside_the_vocabulary_is_named(tmp_path: Path, marker: str, problem: str) -> None:
    import doc_blocks

    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(f"# x\n\n{marker}\n```sh\necho hi\n```\n")
    old = doc_blocks.ROOT
    doc_blocks.ROOT = tmp_path
    try:
        (block,) = doc_blocks.blocks()
    finally:
        doc_blocks.ROOT = old
    assert any(problem in p for p in block.marker_problems()), block.marker_problems()


def test_every_fenced_block_is_seen_indented_or_not(tmp_path: Path) -> None:
    """Blocks inside list items (indented fences) are extracted, dedented; a block without a
    language is something shown, a ```swift one cannot run here."""
    import doc_blocks

    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "1. Convert:\n\n   <!-- doc-test: run -->\n   ```sh\n   echo one\n     echo two\n   ```\n\n"
        "<!-- doc-test: run -->\n```\nrlx-mil inspect x\n```\n\n"
        "<!-- doc-test: long -->\n```swift\nlet x = 1\n```\n\n"
        "<!-- doc-test: needs a diagram -->\n```\na -> b\n```\n")
    old = doc_blocks.ROOT
    doc_blocks.ROOT = tmp_path
    try:
        found = doc_blocks.blocks()
    finally:
        doc_blocks.ROOT = old
    assert [(b.line, b.language, b.code) for b in found] == [
        (4, "sh", "echo one\n  echo two\n"), (10, "", "rlx-mil inspect x\n"), (15, "swift", "let x = 1\n"), (20, "", "a -> b\n")]
    assert found[0].marker_problems() == []
    assert "does not run here" in found[1].marker_problems()[0] and "does not run here" in found[2].marker_problems()[0]
    assert "mark it shows WHAT" in found[3].marker_problems()[0]


def test_a_stands_in_marker_names_each_stand_in() -> None:
    block = Block("docs/x.md", 3, "sh", "true\n", "long", ", stands-in: gguf=model.Q4_K_M.gguf, llm-package=llm.mlpackage")
    assert block.stand_ins == {"model.Q4_K_M.gguf": "gguf", "llm.mlpackage": "llm-package"}
    assert block.marker_problems() == []


@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_the_block_runs_twice_as_written(block: Block) -> None:
    problem = run_twice(block)
    assert problem is None, problem


def _command_lines(code: str) -> list[list[str]]:
    joined = re.sub(r"\\\n", " ", code)
    found = []
    for line in joined.splitlines():
        line = line.split("#", 1)[0] if not line.lstrip().startswith("rlx-mil") else re.sub(r"\s#\s.*$", "", line)
        for part in re.split(r"&&|\|", line):
            words = part.split()
            if words and words[0] == "rlx-mil":
                found.append(words[1:])
    return found


def test_every_rlx_mil_command_names_real_options() -> None:
    from rlx_mil.cli.main import _parser, _subparser

    parser = _parser()
    commands = {c for c in parser._subparsers._group_actions[0].choices} if parser._subparsers else set()
    problems = []
    checked = 0
    for block in ALL:
        for words in _command_lines(block.code):
            if not words or words[0].startswith("-"):
                continue
            command = words[0]
            if command not in commands:
                problems.append(f"{block.where}: no subcommand {command!r}")
                continue
            known = set(_subparser(parser, command)._option_string_actions)
            for word in words[1:]:
                for flag in re.findall(r"(?:^|[\[|])(--?[A-Za-z][\w-]*)", word):
                    if flag.startswith("--") and flag.removeprefix("--no-") != flag and f"--{flag[5:]}" in known:
                        continue
                    if flag not in known:
                        problems.append(f"{block.where}: rlx-mil {command} has no option {flag}")
            checked += 1
    assert not problems, "\n".join(problems)
    assert checked >= 30


def test_a_missing_package_or_tokenizer_item_is_a_typed_error(tmp_path: Path) -> None:
    """docs/models.md's `TextTokenizer(package_text_folder(PACKAGE))` with no such package, or one
    without a tokenizer item: typed errors, not pathlib's TypeError."""
    from rlx_mil.errors import MissingFileError, RlxMilError
    from rlx_mil.llm.package_files import package_text_folder
    from rlx_mil.llm.text import TextTokenizer

    with pytest.raises(MissingFileError, match="no model package at"):
        package_text_folder(tmp_path / "minilm.mlpackage")
    with pytest.raises(RlxMilError, match=r"takes a folder holding tokenizer\.json, got None"):
        TextTokenizer(None)  # type: ignore[arg-type]
