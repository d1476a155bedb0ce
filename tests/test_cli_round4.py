"""Reliability round 4, the last pieces: `eval` of a long text scores a bounded, announced
number of tokens (reading and encoding only what they need), and Ctrl-C during `demo`'s
verification leaves nothing behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from rlx_mil.cli import main
from rlx_mil.coreml.scratch import scratch_dir


def test_ctrl_c_during_demo_verification_exits_130_leaving_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import rlx_mil.milexec

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    tmpdir, out = tmp_path / "tmp", tmp_path / "out" / "demo.mlpackage"
    tmpdir.mkdir()
    out.parent.mkdir()
    scratch_before = sorted(os.listdir(scratch_dir()))  # the process's scratch folder (it goes at exit)
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    monkeypatch.setattr(rlx_mil.milexec, "execute", interrupted)
    code = main(["demo", "-o", str(out), "--layers", "1", "--hidden", "32", "--heads", "2", "--kv-heads", "1",
                 "--seq", "8", "-q"])
    assert code == 130
    assert capsys.readouterr().err.strip().splitlines() == ["rlx-mil demo: interrupted"]
    assert list(out.parent.iterdir()) == [] and list(tmpdir.iterdir()) == []
    assert sorted(os.listdir(scratch_dir())) == scratch_before
