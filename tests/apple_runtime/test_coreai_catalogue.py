"""Every op-catalogue case, converted to a Core ML package, also runs through Apple's Core AI
runtime (the saved package's program translated by `rlx_mil.coreai`, as `rlx-mil run
PKG.mlpackage --engine coreai` reads it; fp32 compute also for fp16 packages) and gives the
reference's numbers within the row's tolerance. A case Core AI cannot run is listed in
`CANNOT_RUN` with the reason, and docs/coreai.md lists the same cases: the test fails when a
listed case starts to run, when an unlisted one stops running, and when the two lists differ."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("coreai", reason="needs the coreai extra: pip install -e \".[coreai]\" (Python >= 3.11)")

from catalogue import CATALOGUE_GROUP, ROWS, CatalogueModels, random_leaves
from documented_limits import documented_cannot_run

from rlx_mil import reference
from rlx_mil.coreai.engine import CoreAIBatch, CoreAIProgram
from rlx_mil.errors import CoreAITranslationError, RlxMilError
from rlx_mil.lowering.target import Precision, Target
from rlx_mil.testing import compare

#: case -> why its program cannot run through Core AI here.
CANNOT_RUN: dict[str, str] = {
    "generators": "random_normal / random_uniform: Core AI has no random ops",
    "sampling": "random_categorical: Core AI has no random ops",
}


def _target(case: str) -> Target:
    return max(ROWS[case].min_target, Target.IOS18)


@pytest.fixture(scope="module")
def core_ai(catalogue_models: CatalogueModels, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[str, CoreAIBatch]]:
    """precision -> every case that runs, saved as a package (with its metadata: the io names
    `rlx-mil run` maps) and translated from disk, all into one asset (saving and loading an
    asset costs more than translating a small program: one per case took 2.5x as long)."""
    import rlx_mil

    folder = tmp_path_factory.mktemp("catalogue_packages")
    batches: dict[str, CoreAIBatch] = {}
    try:
        for precision in ("fp32", "fp16"):
            sources = {case: str(rlx_mil.save(catalogue_models.model(case, _target(case), precision),
                                              folder / f"{case}-{precision}.mlpackage"))
                       for case in sorted(ROWS) if case not in CANNOT_RUN}
            batches[precision] = CoreAIBatch(sources)
        yield batches
    finally:
        for batch in batches.values():
            batch.close()


@pytest.mark.xdist_group(CATALOGUE_GROUP)
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case", sorted(ROWS))
def test_catalogue_case_runs_through_core_ai(case: str, precision: str, catalogue_models: CatalogueModels,
                                             core_ai: dict[str, CoreAIBatch]) -> None:
    row = ROWS[case]
    graph = row.build()
    inputs, params = random_leaves(graph)
    if case in CANNOT_RUN:
        with pytest.raises(CoreAITranslationError):
            CoreAIProgram(catalogue_models.model(case, _target(case), precision)).close()
        return
    got = core_ai[precision].program(case).run(inputs)
    prec = Precision.parse(precision)
    try:
        want = reference.evaluate(graph, inputs, params)
    except RlxMilError:
        assert prec in row.differs
        return
    problems = []
    for name, value in want.items():
        ok, _, detail = compare(got[name], value, row.tolerances[prec])
        if not ok:
            problems.append(f"{name}: {detail}")
    if prec in row.differs and problems:
        return  # the executor differs from the reference here too, for the row's stated reason
    assert not problems, f"{case} {precision} through Core AI: " + "; ".join(problems)


def test_the_docs_list_the_cases_core_ai_cannot_run() -> None:
    assert documented_cannot_run()["catalogue case"] == set(CANNOT_RUN)
