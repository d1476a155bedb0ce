"""One small, representative graph per IR op type (for conformance tests across targets).

Cases live in one module per op family (`catalogue/<family>.py`, each with a `CASES` dict),
named like the family modules of `rlx_mil/ir/ops/`. A case is a graph builder, or a `Row`
(as torchlib's OpInfo rows do) carrying what the generic tests need to know of it: the oldest
target it converts for, its tolerances, and the precisions at which the executor's numbers on
random leaves are expected to differ from the reference, with the reason (a strict expected
failure: the test fails if they stop differing, so the reason cannot go stale). The generic
tests read `ROWS`; `CATALOGUE` maps names to builders.

`CatalogueModels` (the session fixture `catalogue_models`) converts and lowers each case once
per test process and setting, for the tests that check different things about the same
conversion; those tests share the xdist group `CATALOGUE_GROUP`, so they run on one worker.
"""

from __future__ import annotations

import importlib
import pkgutil
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import rlx_mil
from rlx_mil.api import lower_with_names
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import OP_TYPES
from rlx_mil.lowering.program import LoweredProgram
from rlx_mil.lowering.target import Precision, Target
from rlx_mil.testing import DEFAULT_TOLERANCES, Tolerance

#: The xdist group of the tests that share `CatalogueModels`' conversions.
CATALOGUE_GROUP = "catalogue-conversions"



@dataclass(frozen=True)
class Row:
    """One catalogue case and what the generic tests expect of it."""

    build: Callable[[], Graph]
    #: The oldest deployment target the case converts for.
    min_target: Target = Target.IOS15
    tolerances: Mapping[Precision, Tolerance] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    #: precision -> why the executor's numbers on random leaves differ from the reference there.
    differs: Mapping[Precision, str] = field(default_factory=dict)


def _row(case: Callable[[], Graph] | Row) -> Row:
    return case if isinstance(case, Row) else Row(case)


#: Family module name -> its cases.
FAMILY_CASES: dict[str, dict[str, Row]] = {
    info.name: {name: _row(case) for name, case in importlib.import_module(f"{__name__}.{info.name}").CASES.items()}
    for info in pkgutil.iter_modules([str(Path(__file__).parent)])
}

ROWS: dict[str, Row] = {name: row for cases in FAMILY_CASES.values() for name, row in cases.items()}

CATALOGUE: dict[str, Callable[[], Graph]] = {name: row.build for name, row in ROWS.items()}


def covered_op_types() -> set[str]:
    return {node.op.type_name for build in CATALOGUE.values() for node in build()}


def all_op_type_names() -> set[str]:
    return set(OP_TYPES)


def random_leaves(graph: Graph, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    from graph_data import leaf_values

    return leaf_values(graph, seed)


class CatalogueModels:
    """Each catalogue case converted (`rlx_mil.convert`) and lowered (`lower_with_names`) once
    per (target, precision, attention), from `random_leaves(graph)`'s params. Callers only read
    what they get; `close` deletes the converted packages."""

    def __init__(self) -> None:
        self._models: dict[tuple[str, Target, Precision, str], Any] = {}
        self._lowered: dict[tuple[str, Target, Precision, str], LoweredProgram] = {}

    def model(self, case: str, target: str | Target, precision: str | Precision, attention: str = "auto") -> Any:
        key = (case, Target.parse(target), Precision.parse(precision), attention)
        if key not in self._models:
            graph = CATALOGUE[case]()
            _, params = random_leaves(graph)
            self._models[key] = rlx_mil.convert(graph, params, target=key[1], precision=key[2], attention=attention)
        return self._models[key]

    def lowered(self, case: str, target: str | Target, precision: str | Precision, attention: str = "auto") -> LoweredProgram:
        key = (case, Target.parse(target), Precision.parse(precision), attention)
        if key not in self._lowered:
            graph = CATALOGUE[case]()
            _, params = random_leaves(graph)
            self._lowered[key] = lower_with_names(graph, params, target=key[1], precision=key[2], attention=attention)
        return self._lowered[key]

    def close(self) -> None:
        for model in self._models.values():
            shutil.rmtree(model.package_path, ignore_errors=True)
        self._models.clear()
        self._lowered.clear()
