"""Shared test set-up: quiet coremltools, hypothesis profiles, the shared/ fixtures path."""

from __future__ import annotations

import logging
import os
from pathlib import Path

# Both must happen before coremltools is imported anywhere (its logger and tqdm bars).
os.environ.setdefault("TQDM_DISABLE", "1")
logging.getLogger("coremltools").setLevel(logging.ERROR)

import gc  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "quick", max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
settings.register_profile(
    "thorough", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("RLX_MIL_HYPOTHESIS_PROFILE", "quick"))

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DIR = Path(os.environ.get("RLX_MIL_SHARED_DIR", REPO_ROOT.parent / "shared"))
UPSTREAM_JSON_DIR = SHARED_DIR / "fixtures" / "upstream-json"


def upstream_fixture_paths() -> list[Path]:
    if not UPSTREAM_JSON_DIR.is_dir():
        return []
    return sorted(UPSTREAM_JSON_DIR.glob("*.json"))


@pytest.fixture
def upstream_json_dir() -> Path:
    if not UPSTREAM_JSON_DIR.is_dir():
        pytest.skip(f"upstream JSON fixtures not found at {UPSTREAM_JSON_DIR} (../shared/ is absent)")
    return UPSTREAM_JSON_DIR


@pytest.fixture(autouse=True)
def _freeze_gc_for_fast_conversions() -> Iterator[None]:
    """ct.convert runs gc.collect(), whose cost grows with every object alive in the test
    process (about 0.5 s per conversion late in a run). Freezing what exists before each test
    keeps each conversion fast; the objects are unfrozen (and collectable) when the test ends."""
    gc.freeze()
    yield
    gc.unfreeze()
