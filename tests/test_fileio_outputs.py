"""Single-file outputs (reports, npz results) are written beside their path and renamed into
place, so an existing device or FIFO there must be refused, never replaced: as root,
`--report /dev/null` would otherwise swap the system's /dev/null for a JSON file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rlx_mil.errors import SpecialFileError
from rlx_mil.fileio import atomic_output_file


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
@pytest.mark.parametrize("overwrite", [False, True])
def test_a_fifo_at_the_output_path_is_refused_and_kept(tmp_path: Path, overwrite: bool) -> None:
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    with pytest.raises(SpecialFileError, match=r"report\.json: a FIFO"), atomic_output_file(fifo, overwrite=overwrite, what="report") as out:
        out.write(b"{}")
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # no temporary left


def test_a_regular_file_is_replaced_with_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.write_text("old")
    with atomic_output_file(target, overwrite=True, what="report") as out:
        out.write(b"new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
