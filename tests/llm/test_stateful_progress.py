"""A stateful package's conversion reports every stage: reading, each function, the join, the
save (a 0.6B model's took minutes without a line)."""

from __future__ import annotations

import io
import re
from pathlib import Path

from tiny_llm_package import BUCKET, MAX_CONTEXT, tiny_checkpoint

from rlx_mil.llm.package import convert_llm_checkpoint
from rlx_mil.progress import Progress


def test_every_stage_of_a_stateful_conversion_is_reported(tmp_path: Path) -> None:
    checkpoint = tiny_checkpoint(tmp_path / "ck", seed=3)
    stream = io.StringIO()
    out = tmp_path / "llm.mlpackage"
    convert_llm_checkpoint(checkpoint, out, max_context=MAX_CONTEXT, prefill=[BUCKET], progress=Progress(stream=stream))
    lines = stream.getvalue().splitlines()
    stages = [re.sub(r": .*| \(\d+\.\d s\)$", "", line.strip()) for line in lines]
    assert stages == [
        "reading the checkpoint",
        f"converting function prefill_{BUCKET} (1/2)",
        "converting function decode (2/2)",
        "joining 2 functions, writing each weight once",
        "writing the package",
    ], lines
    assert all(re.search(r"\(\d+\.\d s\)$", line) for line in lines), lines
    assert f"2 functions (prefill_{BUCKET}, decode)" in lines[0]
    assert str(out) in lines[-1] and out.is_dir()


def test_without_progress_nothing_is_printed(tmp_path: Path, capsys: object) -> None:
    checkpoint = tiny_checkpoint(tmp_path / "ck", seed=3)
    convert_llm_checkpoint(checkpoint, tmp_path / "llm.mlpackage", max_context=MAX_CONTEXT, prefill=[BUCKET])
    captured = capsys.readouterr()  # type: ignore[attr-defined]
    assert captured.out == "" and "converting function" not in captured.err
