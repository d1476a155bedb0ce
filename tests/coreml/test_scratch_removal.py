"""The conversions' scratch folder removed before the process ends (what tests/conftest.py does
when a test worker finishes: an xdist worker may end with os._exit, which runs no atexit)."""

from __future__ import annotations

import pytest

from rlx_mil.coreml import scratch


def test_the_scratch_folder_goes_now_and_a_later_conversion_gets_a_new_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scratch, "_scratch", {})  # this process's real one stays, for the session's models
    first = scratch.scratch_dir()
    (first / "tmp_package.mlpackage").mkdir()
    scratch.remove_scratch_dir()
    assert not first.exists()
    scratch.remove_scratch_dir()  # nothing left to remove: no error
    second = scratch.scratch_dir()
    assert second.is_dir() and second != first
    scratch.remove_scratch_dir()
