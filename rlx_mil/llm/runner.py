"""Run a converted model: Core ML itself on macOS, the NumPy MIL executor elsewhere."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.coreml.metadata import FunctionTable, PackageMetadataError
from rlx_mil.coreml.runtime import coreml_available
from rlx_mil.errors import RlxMilError
from rlx_mil.fileio import check_package_tree
from rlx_mil.ir.naming import IO_NAMES_METADATA_KEY


def io_name_maps(model: Any, function_name: str | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """(inputs, outputs) maps from model-interface names to IR names, from the metadata."""
    from rlx_mil.milexec.loader import IONames

    metadata = dict(model.user_defined_metadata)
    table = function_io_names(metadata, function_name)
    names = IONames.from_metadata(metadata if table is None else {IO_NAMES_METADATA_KEY: json.dumps(table)})
    if names is None:
        return {}, {}
    return dict(names.inputs), dict(names.outputs)


def predict_coreml(
    model: Any, inputs: Mapping[str, np.ndarray], function_name: str | None = None
) -> dict[str, np.ndarray]:
    """`MLModel.predict` with inputs/outputs keyed by IR names (macOS only); a stateful
    model runs from a fresh state."""
    in_map, out_map = io_name_maps(model, function_name)
    to_mil = {ir: mil for mil, ir in in_map.items()}
    # As the executor: all-IR keys are IR names, else an interface name wins over an IR name.
    by_ir_name = all(name in to_mil for name in inputs)
    feeds = {}
    for name, value in inputs.items():
        array = np.asarray(value)
        array = array.astype(np.int32) if array.dtype.kind in "iu" else array.astype(np.float32)
        # Core ML has no rank-0 inputs: a converted scalar input is a [1] placeholder.
        mil = to_mil[name] if by_ir_name else (name if name in in_map else to_mil.get(name, name))
        feeds[mil] = array.reshape(1) if array.ndim == 0 else array
    raw = model.predict(feeds, state=model.make_state()) if _stateful(model, function_name) else model.predict(feeds)
    return {out_map.get(name, name): np.asarray(value) for name, value in raw.items()}


def function_io_names(metadata: Mapping[str, str], function_name: str | None) -> dict[str, Any] | None:
    """The IO-name table of one function of a multifunction package (None: the package's own)."""
    if function_name is None:
        return None
    try:
        table = FunctionTable.read(metadata)
    except PackageMetadataError as err:
        raise RlxMilError(f"{err}; re-convert the package") from None
    if table is None:
        return None
    found = table.io_names.get(function_name)
    return dict(found) if found is not None else None


def check_function(path: Path, function_name: str | None) -> None:
    """A typed error naming the package's functions when `function_name` is not one of them."""
    if function_name is None:
        return
    from rlx_mil.coreml.package_info import package_info

    names = list(package_info(path).functions)
    if function_name not in names:
        listed = ", ".join(names) if names else "none: it is a one-function package"
        raise RlxMilError(f"{path} has no function {function_name!r} (functions: {listed})")


def _stateful(model: Any, function_name: str | None) -> bool:
    desc = model.get_spec().description
    name = function_name or desc.defaultFunctionName
    return bool(len(desc.state)) or any(f.name == name and len(f.state) for f in desc.functions)


def run_package(
    path: str | os.PathLike[str],
    inputs: Mapping[str, np.ndarray],
    *,
    engine: str = "auto",
    function_name: str | None = None,
    compute_units: str = "ALL",
) -> tuple[dict[str, np.ndarray], str]:
    """Run the package at `path` (its function `function_name` of a multifunction package,
    else the default one); returns (outputs keyed by IR names, engine used). States of a
    stateful function start as zeros."""
    p = Path(path)
    if p.suffix == ".aimodel":
        if engine not in ("auto", "coreai"):
            raise RlxMilError(f"a Core AI asset runs with --engine coreai, not {engine!r}")
        from rlx_mil.coreai.asset import AssetProgram

        with AssetProgram(p) as asset:
            return asset.run(inputs, function_name=function_name), "coreai (Apple's Core AI runtime)"
    if not p.exists():
        raise RlxMilError(f"{p}: no such package")
    check_package_tree(p)
    check_function(p, function_name)
    if engine == "coreml" or (engine == "auto" and coreml_available()):
        if not coreml_available():
            raise RlxMilError("engine 'coreml' needs macOS with the Core ML runtime; use --engine milexec")
        import coremltools as ct

        units = getattr(ct.ComputeUnit, compute_units, None)
        if units is None:
            raise RlxMilError(f"unknown compute units {compute_units!r}")
        model = ct.models.MLModel(str(p), compute_units=units, function_name=function_name)
        return predict_coreml(model, inputs, function_name), "coreml"
    if engine == "coreai":
        from rlx_mil.coreai.engine import run as coreai_run

        names = function_io_names(_package_metadata(p), function_name) if function_name is not None else None
        return coreai_run(p, inputs, function_name=function_name, io_names=names), \
            "coreai (Apple's Core AI runtime, fp32 compute)"
    from rlx_mil import milexec

    if function_name is None:
        return milexec.run(p, inputs), "milexec (NumPy MIL executor)"
    from rlx_mil.coreml.package_info import package_info

    names = function_io_names(package_info(p).metadata, function_name)
    return milexec.run(p, inputs, function_name=function_name, io_names=names), "milexec (NumPy MIL executor)"


def _package_metadata(path: Path) -> Mapping[str, str]:
    from rlx_mil.coreml.package_info import package_info

    return package_info(path).metadata
