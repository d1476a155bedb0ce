"""Running a chunked set (`rlx_mil.llm.chunked`) as one model: what `rlx_mil.llm.generate.Session`
uses when it is handed a chunked set's folder.

Each call of a function runs that function of every chunk in order: a chunk gets the inputs
the Session fills (token ids, positions, `cache_position`) that it declares, plus the hidden
states earlier chunks passed it; each chunk keeps its own states (Core ML `MLState`s, or the
executor's state arrays). The last chunk's outputs (the logits) are the call's outputs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.coreml.manifest import open_model
from rlx_mil.coreml.metadata import FunctionTable, LLMContract
from rlx_mil.errors import RlxMilError
from rlx_mil.fileio import check_package_tree
from rlx_mil.llm.chunked import ChunkedSet, is_chunked_set, read_chunked_set


class ChunkedPackages:
    """The chunks of a set, opened for repeated calls."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:

        self.set: ChunkedSet = read_chunked_set(folder)
        self.folder = Path(folder)
        self.contract: LLMContract = self.set.contract
        self._io: list[dict[str, dict[str, dict[str, str]]]] = []
        self._inputs: list[dict[str, frozenset[str]]] = []
        for i in range(len(self.set.chunks)):
            path = check_package_tree(self.set.package(i))
            try:
                handle = open_model(path, skip_model_load=True)
                table = FunctionTable.read(dict(handle.user_defined_metadata))
                functions = handle.get_spec().description.functions
            except RlxMilError:
                raise
            except Exception as err:
                raise RlxMilError(f"{path}: chunk {i} is not a readable Core ML package ({err})") from None
            self._io.append(table.io_names if table is not None else {})
            self._inputs.append({f.name: frozenset(x.name for x in f.input) for f in functions})
            missing = sorted(set(self.set.functions) - set(self._inputs[-1]))
            if missing:
                raise RlxMilError(f"{path}: chunk {i} lacks the set's functions {missing}")
        self.engine = "milexec"
        self.memory = "lean"
        self._prepared: list[Any] = []
        self._models: list[dict[str, Any]] = []
        self._states: list[Any] = []

    @property
    def last_package(self) -> Path:
        """The chunk that returns the logits (its outputs are the set's)."""
        return self.set.package(len(self.set.chunks) - 1)

    @property
    def text_package(self) -> Path | None:
        return None if self.set.text_chunk is None else self.set.package(self.set.text_chunk)

    def inputs(self, function: str | None) -> frozenset[str]:
        """What the caller feeds `function`: every chunk's inputs but the values chunks pass on."""
        name = function or self.set.default_function
        passed = {n for c in self.set.chunks for n in c.receives}
        return frozenset().union(*(inputs[name] for inputs in self._inputs)) - passed

    def open(self, engine: str, compute_units: Any, memory: Any, precision_model: Any) -> None:
        """Load every chunk for `engine` ("coreml": one MLModel per chunk and function)."""
        import coremltools as ct

        self.engine = engine
        for i in range(len(self.set.chunks)):
            path = str(self.set.package(i))
            if engine == "coreml":
                self._models.append({
                    fn: ct.models.MLModel(path, compute_units=compute_units, function_name=fn) for fn in self.set.functions
                })
            else:
                from rlx_mil.milexec.prepared import prepare

                self._prepared.append(prepare(path, memory=memory, precision_model=precision_model))
        if self._prepared:
            self.memory = self._prepared[0].memory
        self.reset()

    def reset(self) -> None:
        """Fresh (zeroed) states in every chunk."""
        if self.engine == "coreml":
            self._states = [next(iter(models.values())).make_state() for models in self._models]
        else:
            self._states = [{} for _ in self.set.chunks]

    def run(self, function: str | None, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """One call of `function` through every chunk; the last chunk's outputs."""
        name = function or self.set.default_function
        carried: dict[str, Any] = {}
        out: dict[str, Any] = {}
        for i, entry in enumerate(self.set.chunks):
            wanted = self._inputs[i][name]
            chunk_feeds = {k: v for k, v in feeds.items() if k in wanted}
            for value in entry.receives:
                chunk_feeds[value] = carried[value]
            if self.engine == "coreml":
                out = dict(self._models[i][name].predict(chunk_feeds, state=self._states[i]))
            else:
                out = self._prepared[i].run(
                    chunk_feeds, function_name=name, states=self._states[i], io_names=self._io[i].get(name) or None
                )
            for value in entry.passes:
                carried[value] = np.asarray(out[value])
        return out


def open_chunked(package: Any) -> ChunkedPackages | None:
    """The chunked set at `package` (a folder with a manifest), None for anything else."""
    if isinstance(package, (str, os.PathLike)) and is_chunked_set(package):
        return ChunkedPackages(package)
    return None
