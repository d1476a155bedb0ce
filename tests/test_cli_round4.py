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


_INTERRUPT_IN_IMPORT = """\
import sys

class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "rlx_mil.cli.main":  # the user presses Ctrl-C while the command still imports
            raise KeyboardInterrupt

sys.meta_path.insert(0, Interrupt())
sys.argv = ["rlx-mil", "generate", "x.mlpackage"]
import rlx_mil.cli
"""


def test_ctrl_c_while_the_command_imports_is_one_line_and_130(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", _INTERRUPT_IN_IMPORT], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(root)}, cwd=tmp_path)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines() == ["rlx-mil generate: interrupted"]


def test_an_empty_compress_scheme_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

    checkpoint = write_random_checkpoint(tmp_path / "llama", TINY_CONFIGS["llama"], seed=0)
    out = tmp_path / "out.mlpackage"
    assert main(["convert-hf", str(checkpoint), "-o", str(out), "--graph-only", "--compress", " "]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == ("rlx-mil convert-hf: error: --compress needs a scheme (int8, int4, lut4, 4bit, auto4, ...;"
                         " docs/compression.md)"), lines
    assert not out.exists()
