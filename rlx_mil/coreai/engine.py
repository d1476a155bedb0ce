"""Apple's Core AI runtime as an engine for MIL programs: a program (a saved `.mlpackage`, a
converted MLModel, a MIL Program) is translated, saved as a temporary `.aimodel` and run by
`coreai.runtime` (on Linux, Apple's CPU kernels). Inputs, states and outputs are named and
checked as `rlx_mil.milexec.run` names and checks them."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.coreai import adapter
from rlx_mil.coreai.translate import DEFAULT_FLOAT, EntryPoint, translate_program
from rlx_mil.errors import CoreAITranslationError, MilExecError


class CoreAIProgram:
    """A MIL program translated for Core AI and loaded by its runtime (one asset holding every
    function asked for). `close` (or the `with` block) removes the temporary asset."""

    def __init__(self, source: Any, functions: Sequence[str] | None = None, *, float_dtype: Any = DEFAULT_FLOAT,
                 io_names: Any = None, _builder: adapter.ModuleBuilder | None = None, _prefix: str = "") -> None:
        from rlx_mil.milexec.loader import resolve_source
        from rlx_mil.milexec.protoread import read_model

        adapter.require()
        first = resolve_source(source, functions[0] if functions else None, io_names, read_model)
        program = first.program
        names = list(functions) if functions else ([first.function_name] if program is None else list(program.functions))
        self.resolved = {name: first if name == first.function_name else
                         resolve_source(source, name, io_names, read_model) for name in names}
        if program is None:
            from rlx_mil.milexec.light import LightProgram

            program = LightProgram({first.function_name: first.function}, first.function_name)
        self.default_function = first.function_name
        #: function -> its entry point's name in the asset (prefixed when several programs share one).
        self._entry_names = {name: f"{_prefix}{name}" for name in names}
        translation = translate_program(program, names, float_dtype=float_dtype, entry_names=self._entry_names,
                                        builder=_builder)
        self.entries: dict[str, EntryPoint] = {name: translation.entries[self._entry_names[name]] for name in names}
        self._dir: Path | None = None
        if _builder is not None:  # a `CoreAIBatch` saves and loads the shared asset
            return
        self._dir = Path(tempfile.mkdtemp(prefix="rlx_mil_coreai_"))
        try:
            path = self._dir / "program.aimodel"
            translation.builder.save(path)
            self.asset = adapter.LoadedAsset(path)
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise

    def new_states(self, function_name: str | None = None) -> dict[str, Any]:
        """Zeroed runtime state buffers of a function, for `run(runtime_states=...)`: they stay
        in the runtime between calls (no copy per call), as a Core ML state does."""
        entry = self.entries[function_name or self.default_function]
        return {name: self.asset.new_state(np.zeros(shape, dtype)) for name, (shape, dtype) in entry.states.items()}

    def run(self, inputs: Mapping[str, Any], *, function_name: str | None = None,
            states: MutableMapping[str, np.ndarray] | None = None, runtime_states: Mapping[str, Any] | None = None,
            io_names: Any = None) -> dict[str, np.ndarray]:
        """Outputs keyed like `milexec.run`'s; `states` (name -> array) are read and updated,
        or `runtime_states` (from `new_states`) are used in place. `io_names` overrides the
        package's interface-name mapping (as `milexec.run`'s)."""
        from rlx_mil.milexec.executor import _bind_inputs
        from rlx_mil.milexec.loader import IONames

        name = function_name or self.default_function
        if name not in self.entries:
            raise MilExecError(f"the program has no function '{name}' (functions: {sorted(self.entries)})")
        resolved = self.resolved[name]
        entry = self.entries[name]
        names = resolved.io_names
        if io_names is not None:
            names = io_names if isinstance(io_names, IONames) else IONames.from_mapping(io_names)
        feeds, state_feeds = _bind_inputs(resolved.function, inputs, {} if runtime_states is not None else states,
                                          names, "float32", resolved.input_ranges)
        arrays = {var.name: np.asarray(value).astype(entry.inputs[var.name][1], copy=False) for var, value in feeds}
        if runtime_states is None:
            runtime_states = {var.name: self.asset.new_state(np.asarray(value).astype(entry.states[var.name][1]))
                              for var, value in state_feeds}
        else:
            states = None
        raw = self.asset.call(self._entry_names[name], arrays, runtime_states)
        output_names = names.outputs if names else {}
        result = {output_names.get(key, key): _for_caller(raw[key]) for key in entry.outputs}
        if resolved.output_pieces:
            from rlx_mil.coreml.output_pieces import assemble

            result = assemble(result, resolved.output_pieces)
        if states is not None:
            for state_name, runtime_state in runtime_states.items():
                states[state_name] = adapter.LoadedAsset.state_value(runtime_state)
        return result

    def close(self) -> None:
        if self._dir is None:  # a view of a `CoreAIBatch`: the batch closes the asset
            return
        asset = getattr(self, "asset", None)
        if asset is not None:
            asset.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> CoreAIProgram:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CoreAIBatch:
    """Several MIL programs translated into one Core AI asset, saved and loaded once: Core AI's
    save and load of an asset cost several times the translation of a small program, so an op
    catalogue runs through one asset. `program(key)` runs one source with `CoreAIProgram`'s
    interface; a source that cannot be translated is in `refused` (key -> its error)."""

    def __init__(self, sources: Mapping[str, Any], *, float_dtype: Any = DEFAULT_FLOAT) -> None:
        builder = adapter.ModuleBuilder()
        self.refused: dict[str, CoreAITranslationError] = {}
        self._programs: dict[str, CoreAIProgram] = {}
        for index, (key, source) in enumerate(sources.items()):
            try:
                self._programs[key] = CoreAIProgram(source, float_dtype=float_dtype, _builder=builder,
                                                    _prefix=f"p{index}_")
            except CoreAITranslationError as err:
                self.refused[key] = err
        self._dir = Path(tempfile.mkdtemp(prefix="rlx_mil_coreai_"))
        try:
            path = self._dir / "programs.aimodel"
            builder.save(path)
            self.asset = adapter.LoadedAsset(path)
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        for program in self._programs.values():
            program.asset = self.asset

    def program(self, key: str) -> CoreAIProgram:
        if key in self.refused:
            raise self.refused[key]
        return self._programs[key]

    def close(self) -> None:
        self.asset.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> CoreAIBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _for_caller(value: np.ndarray) -> np.ndarray:
    if value.dtype.kind == "f" and value.dtype != np.float32:
        return value.astype(np.float32)
    return value


def run(source: Any, inputs: Mapping[str, Any], *, function_name: str | None = None,
        states: MutableMapping[str, np.ndarray] | None = None, io_names: Any = None) -> dict[str, np.ndarray]:
    """Translate `source`'s function and run it once through Apple's Core AI runtime."""
    with CoreAIProgram(source, [function_name] if function_name else None, io_names=io_names) as program:
        return program.run(inputs, function_name=function_name, states=states)


__all__ = ["CoreAIBatch", "CoreAIProgram", "CoreAITranslationError", "run"]
