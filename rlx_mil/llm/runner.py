"""Run a converted model: Core ML itself on macOS, the NumPy MIL executor elsewhere."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import RlxMilError
from rlx_mil.fileio import check_package_tree


def coreml_available() -> bool:
    """True where `MLModel.predict` works (macOS with the Core ML runtime)."""
    if sys.platform != "darwin":
        return False
    try:
        from coremltools.libcoremlpython import _MLModelProxy  # noqa: F401
    except ImportError:
        return False
    return True


def io_name_maps(model: Any) -> tuple[dict[str, str], dict[str, str]]:
    """(inputs, outputs) maps from model-interface names to IR names, from the metadata."""
    from rlx_mil.milexec.loader import IONames

    names = IONames.from_metadata(dict(model.user_defined_metadata))
    if names is None:
        return {}, {}
    return dict(names.inputs), dict(names.outputs)


def predict_coreml(model: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`MLModel.predict` with inputs/outputs keyed by IR names (macOS only)."""
    in_map, out_map = io_name_maps(model)
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
    raw = model.predict(feeds)
    return {out_map.get(name, name): np.asarray(value) for name, value in raw.items()}


def run_package(
    path: str | os.PathLike[str], inputs: Mapping[str, np.ndarray], *, engine: str = "auto"
) -> tuple[dict[str, np.ndarray], str]:
    """Run the package at `path`; returns (outputs keyed by IR names, engine used)."""
    p = Path(path)
    if not p.exists():
        raise RlxMilError(f"{p}: no such package")
    check_package_tree(p)
    if engine == "coreml" or (engine == "auto" and coreml_available()):
        if not coreml_available():
            raise RlxMilError("engine 'coreml' needs macOS with the Core ML runtime; use --engine milexec")
        import coremltools as ct

        model = ct.models.MLModel(str(p))
        return predict_coreml(model, inputs), "coreml"
    from rlx_mil import milexec

    return milexec.run(p, inputs), "milexec (NumPy MIL executor)"
