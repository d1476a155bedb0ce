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
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlx_mil.errors import InvalidOptionError
from rlx_mil.ir.graph import Graph
from rlx_mil.lower.kv_cache import LLM_METADATA_KEY
from rlx_mil.naming import IO_NAMES_METADATA_KEY, mil_identifier

#: Options one function may set for itself; the rest are shared by the whole package.
PER_FUNCTION_OPTIONS = frozenset({"dims", "kv_cache", "attention", "max_context"})

FunctionSpec = Graph | tuple[Graph, Mapping[str, Any]]

_TEMP_DIRS: list[str] = []


def _remove_temp_dirs() -> None:
    while _TEMP_DIRS:
        shutil.rmtree(_TEMP_DIRS.pop(), ignore_errors=True)


atexit.register(_remove_temp_dirs)


def _split(name: str, spec: Any) -> tuple[Graph, dict[str, Any]]:
    if isinstance(spec, Graph):
        return spec, {}
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], Graph) and isinstance(spec[1], Mapping):
        unknown = set(spec[1]) - PER_FUNCTION_OPTIONS
        if unknown:
            raise InvalidOptionError(
                f"function {name!r}: unknown per-function options {sorted(unknown)} (allowed: {sorted(PER_FUNCTION_OPTIONS)})"
            )
        return spec[0], dict(spec[1])
    raise InvalidOptionError(f"function {name!r} must be a Graph or (Graph, {{option: value}}), got {type(spec).__name__}")


def convert_functions(
    functions: Mapping[str, FunctionSpec],
    params: Mapping[str, Any] | None = None,
    *,
    default_function: str | None = None,
    path: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    **options: Any,
) -> Any:
    """Convert each `{function_name: graph or (graph, options)}` and join them into one
    multifunction `.mlpackage`; returns its `ct.models.MLModel` (not loaded for prediction).

    `options` are `rlx_mil.convert`'s keyword arguments (target, precision, kv_cache,
    max_context, cache_layout, ...), shared by every function; a function's own mapping may
    override `dims`, `kv_cache`, `attention` and `max_context`. `default_function` (default:
    "decode" if present, else the first) is what Core ML runs when no function is named.
    `path` also saves the package there (atomically, see `rlx_mil.save`).
    """
    import coremltools as ct

    from rlx_mil.lower.api import convert, save

    if not isinstance(functions, Mapping) or not functions:
        raise InvalidOptionError("functions must map at least one function name to a graph")
    specs = {}
    for name, spec in functions.items():
        if not isinstance(name, str) or mil_identifier(name) != name:
            raise InvalidOptionError(f"function name {name!r} must be an identifier ([A-Za-z_][A-Za-z0-9_]*)")
        specs[name] = _split(name, spec)
    if default_function is None:
        default_function = "decode" if "decode" in specs else next(iter(specs))
    if default_function not in specs:
        raise InvalidOptionError(f"default_function {default_function!r} is not one of the functions {sorted(specs)}")
    bad = {"dims", "path"} & set(options)
    if bad:
        raise InvalidOptionError(f"{sorted(bad)} are per-function options here; give them with each graph")

    work = tempfile.mkdtemp(prefix="rlx_mil_functions_")
    _TEMP_DIRS.append(work)
    contracts: dict[str, Any] = {}
    io_names: dict[str, Any] = {}
    descriptor = ct.utils.MultiFunctionDescriptor()
    for name, (graph, own) in specs.items():
        model = convert(graph, params, **{**options, **own})
        part = Path(work) / f"{name}.mlpackage"
        model.save(str(part))
        shutil.rmtree(str(model.package_path), ignore_errors=True)
        meta = model.user_defined_metadata
        io_names[name] = json.loads(meta[IO_NAMES_METADATA_KEY])
        if LLM_METADATA_KEY in meta:
            contracts[name] = json.loads(meta[LLM_METADATA_KEY])
        common = {k: meta[k] for k in meta.keys() if k.startswith("rlx_mil.") and k not in (IO_NAMES_METADATA_KEY, LLM_METADATA_KEY)}
        descriptor.add_function(str(part), src_function_name="main", target_function_name=name)
        del model
    if contracts and len(contracts) != len(specs):
        stateless = sorted(set(specs) - set(contracts))
        raise InvalidOptionError(f"functions {stateless} have no KV cache while the others do; one package shares one state")
    states = {name: c["states"] for name, c in contracts.items()}
    if len({json.dumps(s, sort_keys=True) for s in states.values()}) > 1:
        raise InvalidOptionError(f"the functions declare different states, which one package cannot share: {states}")
    descriptor.default_function_name = default_function
    joined = Path(work) / "package.mlpackage"
    ct.utils.save_multifunction(descriptor, str(joined))
    for name in specs:
        shutil.rmtree(Path(work) / f"{name}.mlpackage", ignore_errors=True)

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
    final = Path(work) / "functions.mlpackage"
    model.save(str(final))
    shutil.rmtree(joined, ignore_errors=True)
    model = ct.models.MLModel(str(final), skip_model_load=True)
    if path is not None:
        save(model, path, overwrite=overwrite)
    return model


def convert_buckets(
    graph: Graph,
    params: Mapping[str, Any] | None = None,
    *,
    symbol: int,
    sizes: Sequence[int],
    name: str | None = None,
    default_function: str | None = None,
    path: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    **options: Any,
) -> Any:
    """A graph with the dynamic dim `symbol` as one package with a static function per size
    (sequence-length buckets: the Neural-Engine-friendly alternative to flexible shapes).

    Functions are named `name.format(n=size)`: by default `prefill_{n}` for stateful packages
    (`kv_cache=`; size 1 becomes `decode`) and `seq_{n}` otherwise. Other arguments as for
    `convert_functions`.
    """
    if symbol not in graph.dynamic_symbols():
        raise InvalidOptionError(
            f"graph {graph.name!r} has no dynamic dim ?{symbol} (its dynamic dims: {sorted(graph.dynamic_symbols())})"
        )
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or not sizes:
        raise InvalidOptionError(f"sizes must be a non-empty list of ints >= 1, got {sizes!r}")
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InvalidOptionError(f"bucket sizes must be ints >= 1, got {size!r}")
    if len(set(sizes)) != len(sizes):
        raise InvalidOptionError(f"bucket sizes repeat: {list(sizes)}")
    stateful = options.get("kv_cache") not in (None, False)
    pattern = name if name is not None else ("prefill_{n}" if stateful else "seq_{n}")
    functions: dict[str, FunctionSpec] = {}
    for size in sorted(sizes):
        label = "decode" if stateful and size == 1 and name is None else pattern.format(n=size)
        functions[label] = (graph, {"dims": {symbol: size}})
    return convert_functions(
        functions, params, default_function=default_function, path=path, overwrite=overwrite, **options
    )
