"""Turning what the caller hands `run` (MLModel, Program, Function or .mlpackage path) into a
MIL Function plus the model's interface-name mapping."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import MilExecError
from rlx_mil.fileio import check_package_tree, nesting_depth
from rlx_mil.input_contract import read_ranges
from rlx_mil.mil_walk import iter_ops
from rlx_mil.naming import IO_NAMES_METADATA_KEY


@dataclass(frozen=True)
class IONames:
    """Model-interface names (MIL identifiers) -> the original IR names, per direction."""

    inputs: Mapping[str, str] = field(default_factory=dict)
    outputs: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str]) -> IONames | None:
        text = metadata.get(IO_NAMES_METADATA_KEY)
        if text is None:
            return None
        if not isinstance(text, str):
            raise MilExecError(f"model metadata '{IO_NAMES_METADATA_KEY}' must be a JSON string, got {type(text).__name__}")
        # {"inputs": {name: name}, "outputs": {...}} nests two levels; refuse deeper before parsing.
        depth = nesting_depth(text.encode("utf-8", "surrogatepass"))
        if depth > 2:
            raise MilExecError(f"model metadata '{IO_NAMES_METADATA_KEY}' nests {depth} levels deep, expected 2")
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise MilExecError(f"model metadata '{IO_NAMES_METADATA_KEY}' is not valid JSON: {exc}") from exc
        return cls.from_mapping(raw)

    @classmethod
    def from_mapping(cls, raw: Any) -> IONames:
        if not isinstance(raw, Mapping):
            raise MilExecError(f"'{IO_NAMES_METADATA_KEY}' must be a JSON object, got {type(raw).__name__}")
        parts: dict[str, dict[str, str]] = {}
        for direction in ("inputs", "outputs"):
            table = raw.get(direction, {})
            if not isinstance(table, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in table.items()
            ):
                raise MilExecError(
                    f"'{IO_NAMES_METADATA_KEY}'.{direction} must map interface names to IR names (str -> str)"
                )
            parts[direction] = dict(table)
        return cls(inputs=parts["inputs"], outputs=parts["outputs"])


@dataclass(frozen=True)
class ResolvedSource:
    program: Any  # coremltools Program (None when a bare Function was given)
    function: Any  # coremltools Function
    function_name: str
    io_names: IONames | None
    #: Declared value ranges of integer inputs by interface name (`rlx_mil.input_contract`).
    input_ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)


def load_program(path: str | os.PathLike[str]) -> Any:
    """Reload a saved .mlpackage into a pymil Program (every function of it).

    Constant `np.bool_` scalars that the milproto loader produces are turned into Python bools:
    with numpy >= 2, `np.sum(..., keepdims=np.True_)` raises inside coremltools' own
    value_inference. The Program's `default_function_name` is taken from the spec.
    """
    return _program_from_model(_open_model(path), path)


def _open_model(path: str | os.PathLike[str]) -> Any:
    import coremltools as ct

    if not Path(path).exists():
        raise MilExecError(f"no model package at {path}")
    check_package_tree(path)
    try:
        return ct.models.MLModel(str(path), skip_model_load=True)
    except Exception as exc:
        raise MilExecError(f"cannot open {path} as a Core ML model: {exc}") from exc


def _program_from_model(model: Any, where: Any) -> Any:
    from coremltools.converters.mil.frontend.milproto.load import load as milproto_load

    spec = model.get_spec()
    if spec.WhichOneof("Type") != "mlProgram":
        raise MilExecError(f"{where} is not an ML Program (model type {spec.WhichOneof('Type')!r})")
    try:
        program = milproto_load(
            spec, specification_version=spec.specificationVersion, file_weights_dir=model.weights_dir
        )
    except Exception as exc:
        raise MilExecError(f"cannot load the MIL program of {where}: {exc}") from exc
    for function in program.functions.values():
        for op in iter_ops(function):
            if op.op_type == "const" and isinstance(op.outputs[0].val, np.bool_):
                op.outputs[0]._sym_val.val = bool(op.outputs[0].val)
    default_name = spec.description.defaultFunctionName
    if default_name:
        program.default_function_name = default_name
    return program


def resolve_source(
    source: Any, function_name: str | None, io_names: Mapping[str, Any] | IONames | None
) -> ResolvedSource:
    """Find the Function to run and the interface-name mapping for `source`."""
    from coremltools.converters.mil.mil import Function, Program

    metadata: Mapping[str, str] = {}
    if isinstance(source, (str, os.PathLike)):
        model = _open_model(source)
        program = _program_from_model(model, source)
        metadata = dict(model.user_defined_metadata)
    elif isinstance(source, Program):
        program = source
    elif isinstance(source, Function):
        program = None
    elif hasattr(source, "get_spec") and hasattr(source, "user_defined_metadata"):
        program = getattr(source, "_mil_program", None)
        if program is None:
            package = getattr(source, "package_path", None)
            if not package:
                raise MilExecError("the MLModel has neither a MIL program in memory nor a package path")
            program = _program_from_model(source, package)
        metadata = dict(source.user_defined_metadata)
        if function_name is None:
            function_name = getattr(source, "function_name", None)
    else:
        raise MilExecError(
            f"cannot run a {type(source).__name__}: pass a coremltools MLModel, a MIL Program or "
            "Function, or the path of a saved .mlpackage"
        )

    if program is None:
        function, name = source, function_name or "main"
    else:
        name = function_name or getattr(program, "default_function_name", None) or "main"
        if name not in program.functions:
            raise MilExecError(
                f"the program has no function '{name}' (functions: {sorted(program.functions)})"
            )
        function = program.functions[name]

    if isinstance(io_names, IONames):
        names: IONames | None = io_names
    elif io_names is not None:
        names = IONames.from_mapping(io_names)
    else:
        names = IONames.from_metadata(metadata)
    return ResolvedSource(program=program, function=function, function_name=name, io_names=names,
                          input_ranges=read_ranges(metadata, name))
