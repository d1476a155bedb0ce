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

from rlx_mil.coreml.dedup import consts_compared_in_chunks
from rlx_mil.coreml.metadata import (
    INPUT_RANGES,
    PER_FUNCTION_KEYS,
    PREFIX,
    FunctionTable,
    LLMContract,
    SplitOutputs,
    read_io_names,
    read_json,
    write_io_names,
)
from rlx_mil.coreml.scratch import scratch_dir
from rlx_mil.errors import InvalidOptionError

_TEMP_DIRS: list[str] = []


def _remove_temp_dirs() -> None:
    while _TEMP_DIRS:
        shutil.rmtree(_TEMP_DIRS.pop(), ignore_errors=True)


atexit.register(_remove_temp_dirs)


def function_workspace() -> Path:
    """A temporary folder for the function packages of one join, removed at exit at the latest."""
    work = tempfile.mkdtemp(prefix="functions-", dir=scratch_dir())
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

    contracts: dict[str, LLMContract] = {}
    io_names: dict[str, dict[str, dict[str, str]]] = {}
    common: dict[str, str] = {}
    ranges: dict[str, Any] = {}
    split = SplitOutputs()
    for name, meta in metas.items():
        split.functions[name] = SplitOutputs.read(meta).of("main")
        io_names[name] = read_io_names(meta)
        contract = LLMContract.read(meta)
        if contract is not None:
            contracts[name] = contract
        own_ranges = read_json(meta, INPUT_RANGES)
        if own_ranges is not None:
            ranges[name] = own_ranges["main"]
        common = {k: v for k, v in meta.items() if k.startswith(PREFIX) and k not in PER_FUNCTION_KEYS}
    if contracts and len(contracts) != len(metas):
        stateless = sorted(set(metas) - set(contracts))
        raise InvalidOptionError(f"functions {stateless} have no KV cache while the others do; one package shares one state")
    states = {name: c.states for name, c in contracts.items()}
    if len({json.dumps(s, sort_keys=True) for s in states.values()}) > 1:
        raise InvalidOptionError(f"the functions declare different states, which one package cannot share: {states}")
    descriptor.default_function_name = default_function
    joined = work / "package.mlpackage"
    with consts_compared_in_chunks():
        ct.utils.save_multifunction(descriptor, str(joined))
    for name in metas:
        shutil.rmtree(work / f"{name}.mlpackage", ignore_errors=True)

    model = ct.models.MLModel(str(joined), skip_model_load=True)
    meta = model.user_defined_metadata
    for key, value in common.items():
        meta[key] = value
    write_io_names(meta, **io_names[default_function])
    FunctionTable(default_function, io_names).write(meta)
    if ranges:
        meta[INPUT_RANGES] = json.dumps(ranges, sort_keys=True)
    split.write(meta)
    if contracts:
        lengths = {name: c.query_len for name, c in contracts.items()}
        contracts[default_function].joined(default_function, lengths).write(meta)
    # Write the metadata into the package itself, so every reader of it sees the contract.
    final = work / "functions.mlpackage"
    model.save(str(final))
    shutil.rmtree(joined, ignore_errors=True)
    return ct.models.MLModel(str(final), skip_model_load=True)
