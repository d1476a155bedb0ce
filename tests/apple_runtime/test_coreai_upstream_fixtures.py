"""Every graph serialised by upstream RLX, converted in fp32, also runs through Apple's Core AI
runtime and gives the reference's numbers within 1e-4 relative (its largest deviation, scaled
by the output's largest magnitude): the program held in memory (as `--verify --engine coreai`
translates it) and the saved package (as `rlx-mil run PKG.mlpackage --engine coreai` reads
it). A fixture Core AI cannot run is listed in `CANNOT_RUN` and in docs/coreai.md; the test
fails when a listed one runs, an unlisted one fails, or the lists differ."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("coreai", reason="needs the coreai extra: pip install -e \".[coreai]\" (Python >= 3.11)")

from conftest import upstream_fixture_paths
from documented_limits import documented_cannot_run
from graph_data import leaf_values

import rlx_mil
import rlx_mil.lowering.program
from rlx_mil import reference
from rlx_mil.coreai.engine import CoreAIBatch, CoreAIProgram
from rlx_mil.errors import CoreAITranslationError
from rlx_mil.ir.graph import Graph
from rlx_mil.testing import supported_targets

FIXTURES = upstream_fixture_paths()
pytestmark = pytest.mark.skipif(
    not FIXTURES, reason="upstream JSON fixtures absent: ../shared/fixtures/upstream-json not found"
)


#: fixture (file stem) -> why Core AI cannot run its program here (none today).
CANNOT_RUN: dict[str, str] = {}


@pytest.fixture(scope="module")
def saved_packages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoreAIBatch]:
    """Every fixture's fp32 package saved, all translated from disk into one asset."""
    folder = tmp_path_factory.mktemp("upstream_coreai")
    sources = {}
    for path in FIXTURES:
        graph = Graph.from_json_file(path)
        _, params = leaf_values(graph)
        model = rlx_mil.convert(graph, params, target=supported_targets(graph)[-1], precision="fp32")
        sources[path.stem] = str(rlx_mil.save(model, folder / f"{path.stem}.mlpackage"))
    with CoreAIBatch(sources) as batch:
        yield batch


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_fixture_runs_through_core_ai(path: Path, saved_packages: CoreAIBatch) -> None:
    graph = Graph.from_json_file(path)
    inputs, params = leaf_values(graph)
    target = supported_targets(graph)[-1]
    model = rlx_mil.convert(graph, params, target=target, precision="fp32")
    if path.stem in CANNOT_RUN:
        with pytest.raises(CoreAITranslationError):
            CoreAIProgram(model).close()
        return
    want = reference.evaluate(graph, inputs, params)
    with CoreAIProgram(model) as program:
        _check(path, program.run(inputs), want)
    _check(path, saved_packages.program(path.stem).run(inputs), want)


def test_the_docs_list_the_fixtures_core_ai_cannot_run() -> None:
    assert documented_cannot_run()["upstream fixture"] == set(CANNOT_RUN)


def _check(path: Path, got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name, value in want.items():
        expected = np.asarray(value, np.float64)
        actual = np.asarray(got[name], np.float64)
        assert actual.shape == expected.shape, name
        # NaN where the reference has NaN (log of a negative...), equal infinities, count as equal.
        same = (np.isnan(actual) & np.isnan(expected)) | (np.isinf(expected) & (actual == expected))
        finite = np.where(np.isfinite(expected), np.abs(expected), 0.0)
        scale = max(float(np.max(finite)), 1e-30) if expected.size else 1.0
        delta = np.where(same, 0.0, np.abs(actual - expected))
        error = float(np.max(np.where(np.isnan(delta), np.inf, delta))) if expected.size else 0.0
        assert error <= 1e-4 * scale, f"{path.stem} {name}: max deviation {error:.3g} over scale {scale:.3g}"
