"""One small, representative graph per IR op type (for conformance tests across targets).

Cases live in one module per op family (`catalogue/<family>.py`, each with a `CASES` dict),
named like the family modules of `rlx_mil/ir/ops/`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import OP_TYPES

#: Family module name -> its cases.
FAMILY_CASES: dict[str, dict[str, Callable[[], Graph]]] = {
    info.name: importlib.import_module(f"{__name__}.{info.name}").CASES
    for info in pkgutil.iter_modules([str(Path(__file__).parent)])
}

CATALOGUE: dict[str, Callable[[], Graph]] = {
    name: build for cases in FAMILY_CASES.values() for name, build in cases.items()
}


def covered_op_types() -> set[str]:
    return {node.op.type_name for build in CATALOGUE.values() for node in build()}


def all_op_type_names() -> set[str]:
    return set(OP_TYPES)


def random_leaves(graph: Graph, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    from graph_data import leaf_values

    return leaf_values(graph, seed)
