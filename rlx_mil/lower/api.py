"""Public conversion API: `lower`, `convert`, `save`."""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlx_mil.errors import ConversionError, InvalidOptionError, RlxMilError
from rlx_mil.ir.graph import Graph
from rlx_mil.lower.context import LowerOptions
from rlx_mil.lower.kv_cache import LLM_METADATA_KEY, KVCachePlan, bind_cache_lengths, plan_kv_cache
from rlx_mil.lower.pipeline import (
    FP16_UNSAFE_PASSES,
    default_pass_pipeline,
    nonreplaceable_marks_only_with_constexprs,
    rlx_pass_pipeline,
    validation_once_per_pipeline,
)
from rlx_mil.lower.program import LoweredProgram, lower_graph, require_graph
from rlx_mil.lower.saving import save_package
from rlx_mil.lower.target import Precision, Target
from rlx_mil.lower.weight_writes import direct_weight_writes
from rlx_mil.naming import IO_NAMES_METADATA_KEY

__all__ = [
    "FP16_UNSAFE_PASSES", "convert", "default_pass_pipeline", "lower", "lower_with_names", "release",
    "release_when_collected", "save",
]

ATTENTION_MODES = ("auto", "fused", "decomposed")
COMPUTE_UNITS = ("ALL", "CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE")


def _options(attention: str, compressor: Any = None) -> LowerOptions:
    if attention not in ATTENTION_MODES:
        raise InvalidOptionError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
    return LowerOptions(attention=attention, compressor=compressor)


def _compressor(compress: Any, graph: Graph, target: Target, precision: Precision) -> Any:
    """The weight compressor for `compress` (None: float weights); shape/target problems are
    raised here, before any weight is read."""
    if compress is None:
        return None
    from rlx_mil.compress import WeightCompressor, parse_compress

    config = parse_compress(compress)
    if config is None:
        return None
    compressor = WeightCompressor(config, graph, target, precision)
    compressor.check()
    return compressor


def lower_with_names(
    graph: Graph,
    params: Mapping[str, Any] | None = None,
    *,
    target: str | Target = "iOS18",
    precision: str | Precision = "fp16",
    attention: str = "auto",
    dims: Mapping[int, int] | None = None,
    kv_cache: KVCacheOption = None,
    max_context: int | None = None,
    cache_layout: str = "stacked",
    compress: Any = None,
) -> LoweredProgram:
    """Like `lower`, also returning the model-interface name maps."""
    graph = require_graph(graph)
    if dims is not None:
        graph = graph.bind(dims)
    tgt, prec = Target.parse(target), Precision.parse(precision)
    graph, plan = _kv_plan(graph, kv_cache, max_context, cache_layout, tgt)
    return lower_graph(
        graph, params, target=tgt, precision=prec, options=_options(attention, _compressor(compress, graph, tgt, prec)),
        kv_cache=plan,
    )


KVCacheOption = str | bool | Mapping[str, str] | None


def _kv_plan(
    graph: Graph, kv_cache: KVCacheOption, max_context: int | None, cache_layout: str, target: Target
) -> tuple[Graph, KVCachePlan | None]:
    """The graph to lower (dynamic cache lengths bound) and its stateful plan, if any."""
    if kv_cache is None or kv_cache is False:
        if max_context is not None:
            raise InvalidOptionError("max_context is the capacity of a stateful KV cache; it needs kv_cache=")
        return graph, None
    graph = bind_cache_lengths(graph, kv_cache)
    return graph, plan_kv_cache(graph, kv_cache, max_context=max_context, layout=cache_layout, target=target)


def lower(
    graph: Graph,
    params: Mapping[str, Any] | None = None,
    *,
    target: str | Target = "iOS18",
    precision: str | Precision = "fp16",
    attention: str = "auto",
    dims: Mapping[int, int] | None = None,
    kv_cache: KVCacheOption = None,
    max_context: int | None = None,
    cache_layout: str = "stacked",
    compress: Any = None,
) -> Any:
    """Build the coremltools MIL `Program` for `graph` (before Core ML's passes), for inspection.

    `dims` binds dynamic dims (`{symbol: size}`) for graphs that have them; `kv_cache`,
    `max_context`, `cache_layout` and `compress` are as for `convert`.
    """
    return lower_with_names(
        graph, params, target=target, precision=precision, attention=attention, dims=dims,
        kv_cache=kv_cache, max_context=max_context, cache_layout=cache_layout, compress=compress,
    ).program


@contextmanager
def objects_frozen() -> Iterator[None]:
    """Python's collector ignores the objects that exist on entry (gc.freeze): coremltools ends
    every conversion with a full gc.collect(), which otherwise rescans every object of the
    process (~1.3 s with coremltools and NumPy loaded) to free only the conversion's garbage."""
    if gc.get_freeze_count():  # the caller froze objects itself: leave that alone
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _ct_convert(lowered: LoweredProgram, graph: Graph, tgt: Target, prec: Precision, compute_units: str, pass_pipeline: Any) -> Any:
    import coremltools as ct

    try:
        model = ct.convert(
            lowered.program,
            convert_to="mlprogram",
            minimum_deployment_target=tgt.ct_target,
            compute_precision=prec.ct_precision,
            compute_units=getattr(ct.ComputeUnit, compute_units),
            skip_model_load=sys.platform != "darwin",
            pass_pipeline=pass_pipeline,
        )
    except RlxMilError:
        raise
    except Exception as err:
        raise ConversionError(f"coremltools failed to convert graph {graph.name!r}: {type(err).__name__}: {err}") from err
    return model


def convert(
    graph: Graph,
    params: Mapping[str, Any] | None = None,
    *,
    target: str | Target = "iOS18",
    precision: str | Precision = "fp16",
    compute_units: str = "ALL",
    attention: str = "auto",
    pass_pipeline: Any = None,
    dims: Mapping[int, int] | None = None,
    kv_cache: KVCacheOption = None,
    max_context: int | None = None,
    cache_layout: str = "stacked",
    compress: Any = None,
) -> Any:
    """Convert `graph` with `params` (name -> ndarray) into a `ct.models.MLModel`.

    Inputs keep their Input names and outputs the keys `rlx_mil.reference.evaluate` returns
    (as Core ML-legal identifiers; the original names are in the model metadata). Callers pass
    and get float32 arrays whatever the compute precision. `dims` binds dynamic dims
    (`{symbol: size}`); a graph with unbound dynamic dims is a typed error.

    `kv_cache` ("auto", or `{past_input_name: cache_output_name}`) makes a stateful model
    (iOS18): the caches of a decode graph in upstream's form become fp16 Core ML states of
    `max_context` slots (`cache_layout` "stacked" or "per_layer"), written at the new input
    `cache_position: int32[1]`. Carried recurrent states (GatedDeltaNet `carry_state`, RNN
    `carry`), otherwise the extra outputs `<input>_out`, become Core ML states too. See
    docs/llm.md for the contract.

    `compress` compresses weights while they are lowered, one at a time from the given arrays:
    a preset ("int8", "int4", "lut4", ...), a per-weight config string or mapping, or an
    `rlx_mil.compress.CompressionConfig` (see docs/compression.md). The model then carries a
    `rlx_mil.compress.CompressionReport` (`rlx_mil.compress.report_of(model)`, also in its
    metadata), and `rlx_mil.compress.dequantized_params` gives the weights it computes with.
    `pass_pipeline` defaults to the Core ML passes that can change an rlx_mil program
    (`rlx_mil.lower.pipeline`); `default_pass_pipeline(precision)` is Core ML's full one.
    """

    graph = require_graph(graph)
    tgt = Target.parse(target)
    prec = Precision.parse(precision)
    if compute_units not in COMPUTE_UNITS:
        raise InvalidOptionError(f"compute_units must be one of {COMPUTE_UNITS}, got {compute_units!r}")
    if dims is not None:
        graph = graph.bind(dims)
    graph, plan = _kv_plan(graph, kv_cache, max_context, cache_layout, tgt)
    compressor = _compressor(compress, graph, tgt, prec)
    with objects_frozen(), direct_weight_writes(), validation_once_per_pipeline(), nonreplaceable_marks_only_with_constexprs():
        lowered = lower_graph(graph, params, target=tgt, precision=prec, options=_options(attention, compressor), kv_cache=plan)
        if pass_pipeline is None:
            pass_pipeline = rlx_pass_pipeline(prec, lowered.program)
        model = _ct_convert(lowered, graph, tgt, prec, compute_units, pass_pipeline)
    meta = model.user_defined_metadata
    meta[IO_NAMES_METADATA_KEY] = json.dumps({"inputs": lowered.inputs, "outputs": lowered.outputs})
    meta["rlx_mil.graph"] = graph.name
    meta["rlx_mil.target"] = tgt.label
    meta["rlx_mil.precision"] = prec.value
    if plan is not None:
        meta[LLM_METADATA_KEY] = json.dumps(plan.describe())
    from rlx_mil import __version__

    meta["rlx_mil.version"] = __version__
    if compressor is not None:
        from rlx_mil.compress.report import METADATA_KEY

        meta[METADATA_KEY] = compressor.report().to_json()
    release_when_collected(model)
    return model


def release_when_collected(model: Any) -> None:
    """Delete the temporary package coremltools wrote for `model` when `model` is garbage
    collected (coremltools itself deletes them only when the process exits)."""
    package = getattr(model, "package_path", None)
    if package and getattr(model, "is_temp_package", False):
        weakref.finalize(model, shutil.rmtree, package, ignore_errors=True)


def release(model: Any) -> None:
    """Delete `model`'s temporary package now; the model cannot be saved or run afterwards."""
    package = getattr(model, "package_path", None)
    if package and getattr(model, "is_temp_package", False):
        shutil.rmtree(package, ignore_errors=True)


def save(model: Any, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Write `model` to `path` (.mlpackage) atomically: staged beside `path`, synced to disk,
    then swapped into place, so a failure or crash leaves the old package (or none) and
    never a half-written one. Errors are typed (FileAccessError subclasses also derive from
    the matching OSError: `except FileExistsError` works); see `rlx_mil.lower.saving`."""
    if not callable(getattr(model, "save", None)):
        raise InvalidOptionError(f"save takes the MLModel that rlx_mil.convert returns, got {type(model).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidOptionError(f"path must be a str or os.PathLike ending in .mlpackage, got {path!r}")
    dest = Path(path)
    if dest.suffix != ".mlpackage":
        raise InvalidOptionError(f"a Core ML ML Program is saved as a .mlpackage folder, got {str(dest)!r}")
    return save_package(model, dest, overwrite=overwrite)
