"""Several graphs as the functions of one Core ML package, sharing one copy of the weights
(and, for stateful LLM packages, the same KV-cache states).

Each function is converted on its own, then `coremltools.utils.save_multifunction` merges the
packages; it stores a weight blob once however many functions use it, so a prefill + decode
package is about the size of one function. Functions of one package must declare the same
states (names and shapes): an `MLState` made for the package serves every function.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlx_mil.errors import InvalidOptionError
from rlx_mil.lowering.state.kv_cache import LLM_METADATA_KEY
from rlx_mil.naming import IO_NAMES_METADATA_KEY

_TEMP_DIRS: list[str] = []


def _remove_temp_dirs() -> None:
    while _TEMP_DIRS:
        shutil.rmtree(_TEMP_DIRS.pop(), ignore_errors=True)


atexit.register(_remove_temp_dirs)


def function_workspace() -> Path:
    """A temporary folder for the function packages of one join, removed at exit at the latest."""
    work = tempfile.mkdtemp(prefix="rlx_mil_functions_")
    _TEMP_DIRS.append(work)
    return Path(work)


def add_function(work: Path, descriptor: Any, name: str, model: Any) -> dict[str, str]:
    """Save one converted function's model into `work` and add it to `descriptor` as `name`;
    returns its metadata. The model's own temporary package is removed."""
    part = work / f"{name}.mlpackage"
    model.save(str(part))
    shutil.rmtree(str(model.package_path), ignore_errors=True)
    descriptor.add_function(str(part), src_function_name="main", target_function_name=name)
    return dict(model.user_defined_metadata)


def join_functions(work: Path, descriptor: Any, metas: Mapping[str, Mapping[str, str]], default_function: str) -> Any:
    """Join the functions added to `descriptor` into one package sharing the weights, with the
    metadata of every function merged (IO names per function, one LLM contract); returns its
    `ct.models.MLModel` (not loaded for prediction)."""
    import coremltools as ct

    contracts: dict[str, Any] = {}
    io_names: dict[str, Any] = {}
    common: dict[str, str] = {}
    for name, meta in metas.items():
        io_names[name] = json.loads(meta[IO_NAMES_METADATA_KEY])
        if LLM_METADATA_KEY in meta:
            contracts[name] = json.loads(meta[LLM_METADATA_KEY])
        common = {k: v for k, v in meta.items() if k.startswith("rlx_mil.") and k not in (IO_NAMES_METADATA_KEY, LLM_METADATA_KEY)}
    if contracts and len(contracts) != len(metas):
        stateless = sorted(set(metas) - set(contracts))
        raise InvalidOptionError(f"functions {stateless} have no KV cache while the others do; one package shares one state")
    states = {name: c["states"] for name, c in contracts.items()}
    if len({json.dumps(s, sort_keys=True) for s in states.values()}) > 1:
        raise InvalidOptionError(f"the functions declare different states, which one package cannot share: {states}")
    descriptor.default_function_name = default_function
    joined = work / "package.mlpackage"
    ct.utils.save_multifunction(descriptor, str(joined))
    for name in metas:
        shutil.rmtree(work / f"{name}.mlpackage", ignore_errors=True)

    model = ct.models.MLModel(str(joined), skip_model_load=True)
    meta = model.user_defined_metadata
    for key, value in common.items():
        meta[key] = value
    meta[IO_NAMES_METADATA_KEY] = json.dumps(io_names[default_function])
    meta["rlx_mil.functions"] = json.dumps({"default": default_function, "io_names": io_names})
    if contracts:
        meta[LLM_METADATA_KEY] = json.dumps({
            **{k: v for k, v in contracts[default_function].items() if k != "query_len"},
            "default_function": default_function,
            "functions": {name: {"query_len": c["query_len"]} for name, c in contracts.items()},
        })
    # Write the metadata into the package itself, so every reader of it sees the contract.
    final = work / "functions.mlpackage"
    model.save(str(final))
    shutil.rmtree(joined, ignore_errors=True)
    return ct.models.MLModel(str(final), skip_model_load=True)
