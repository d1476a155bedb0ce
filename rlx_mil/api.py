"""Public conversion API: `lower`, `convert`, `save`, and `convert_functions` / `convert_buckets`
(several graphs as the functions of one package sharing the weights)."""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import sys
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlx_mil.coreml import metadata
from rlx_mil.coreml.dedup import consts_compared_in_chunks
from rlx_mil.coreml.deploy import DeployForm, RewriteContext, lowering_attention, rewrite_program
from rlx_mil.coreml.deploy.compression import form_compression
from rlx_mil.coreml.deploy.wide_split import name_split_outputs
from rlx_mil.coreml.multifunction import PassedFunction, collecting, collecting_functions, join_programs
from rlx_mil.coreml.output_format import (
    SUFFIXES,
    check_format,
    format_of_suffix,
    model_format,
    output_path,
    remember_format,
)
from rlx_mil.coreml.patches import pass_bars_hidden
from rlx_mil.coreml.pipeline import (
    FP16_UNSAFE_PASSES,
    default_pass_pipeline,
    fusion_patterns_built_once,
    nonreplaceable_marks_only_with_constexprs,
    program_text_only_when_logged,
    rlx_pass_pipeline,
    validation_once_per_pipeline,
)
from rlx_mil.coreml.saving import check_destination, save_package
from rlx_mil.coreml.scratch import conversion_temporaries
from rlx_mil.coreml.weight_writes import direct_weight_writes
from rlx_mil.errors import ConversionError, InvalidOptionError, RlxMilError
from rlx_mil.input_contract import encode_ranges, graph_input_ranges
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.naming import mil_identifier
from rlx_mil.lowering.context import Compressor, LowerOptions
from rlx_mil.lowering.program import LoweredProgram, lower_graph, require_graph, weights_shared_across_graphs
from rlx_mil.lowering.state.capacity import neural_engine_capacity
from rlx_mil.lowering.state.kv_cache import POSITION_INPUT, KVCachePlan, bind_cache_lengths, plan_kv_cache
from rlx_mil.lowering.target import Precision, Target
from rlx_mil.progress import Progress
from rlx_mil.version import __version__

if TYPE_CHECKING:
    import coremltools as ct

    from rlx_mil.compress import WeightCompressor

__all__ = [
    "FP16_UNSAFE_PASSES", "PER_FUNCTION_OPTIONS", "convert", "convert_buckets", "convert_functions",
    "default_pass_pipeline", "lower", "lower_with_names", "release", "release_when_collected", "save",
]

ATTENTION_MODES = ("auto", "fused", "decomposed")
COMPUTE_UNITS = ("ALL", "CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE")


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidOptionError(f"{what} must be True or False, got {value!r}")
    return value


def _attention_mode(attention: str, form: DeployForm, target: Target) -> str:
    if attention not in ATTENTION_MODES:
        raise InvalidOptionError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
    return lowering_attention(form, attention, target)


def _options(attention: str, compressor: Compressor | None = None, form: DeployForm = DeployForm.PLAIN,
             fp16_io: bool = False) -> LowerOptions:
    if attention not in ATTENTION_MODES:
        raise InvalidOptionError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
    return LowerOptions(attention=attention, compressor=compressor, neural_engine=form is DeployForm.ANE,
                        fp16_io=_flag(fp16_io, "fp16_io"))


def _compressor(compress: Any, graph: Graph, target: Target, precision: Precision, params: Any = None) -> tuple[WeightCompressor | None, Any]:
    """The weight compressor for `compress` (None: float weights) and the params the lowering
    reads; shape/target problems are raised here, before any weight is read. Weights that
    `params` carries already quantized (a GGUF file's) keep their codes whatever `compress`
    says of the others; the lowering then sees placeholders for them."""
    from rlx_mil.compress.prequantized import PlaceholderParams, carried_weights

    carried = carried_weights(params)
    if compress is None and not carried:
        return None, params
    from rlx_mil.compress import CompressionConfig, WeightCompressor, parse_compress

    config = parse_compress(compress) if compress is not None else None
    if carried:
        # Kept codes checked against the file's own decode tell nothing, and the check would
        # hold the whole model in float twice: it runs for them only when `compress` asks.
        config = dataclasses.replace(config or CompressionConfig(check=False), prequantized=carried)
    if config is None:
        return None, params
    compressor = WeightCompressor(config, graph, target, precision, params)
    compressor.check()
    return compressor, (PlaceholderParams(params, carried) if carried else params)


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
    deploy: str | DeployForm = "plain",
) -> LoweredProgram:
    """Like `lower`, also returning the model-interface name maps."""
    graph = require_graph(graph)
    tgt, prec, form = Target.parse(target), Precision.parse(precision), DeployForm.parse(deploy)
    attention = _attention_mode(attention, form, tgt)
    if form is DeployForm.ANE:
        max_context = neural_engine_capacity(max_context)
    if dims is not None:
        graph = graph.bind(dims)
    graph, plan = _kv_plan(graph, kv_cache, max_context, cache_layout, tgt, form)
    compressor, params = _compressor(form_compression(compress, form), graph, tgt, prec, params)
    lowered = lower_graph(graph, params, target=tgt, precision=prec, options=_options(attention, compressor, form), kv_cache=plan)
    context = RewriteContext(form, tgt, prec)
    rewrite_program(lowered.program, context)
    name_split_outputs(lowered.outputs, context.split_outputs_made)
    return lowered


KVCacheOption = str | bool | Mapping[str, str] | None


def _kv_plan(
    graph: Graph, kv_cache: KVCacheOption, max_context: int | None, cache_layout: str, target: Target,
    form: DeployForm = DeployForm.PLAIN,
) -> tuple[Graph, KVCachePlan | None]:
    """The graph to lower (dynamic cache lengths bound) and its stateful plan, if any."""
    if kv_cache is None or kv_cache is False:
        if max_context is not None:
            raise InvalidOptionError("max_context is the capacity of a stateful KV cache; it needs kv_cache=")
        return graph, None
    graph = bind_cache_lengths(graph, kv_cache)
    return graph, plan_kv_cache(
        graph, kv_cache, max_context=max_context, layout=cache_layout, target=target, rank4=form is DeployForm.ANE
    )


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
    deploy: str | DeployForm = "plain",
) -> Any:
    """Build the coremltools MIL `Program` for `graph` (before Core ML's passes), for inspection.

    `dims` binds dynamic dims (`{symbol: size}`) for graphs that have them; `kv_cache`,
    `max_context`, `cache_layout`, `compress` and `deploy` are as for `convert` (the program
    is the deployment form's, its rewrites applied).
    """
    return lower_with_names(
        graph, params, target=target, precision=precision, attention=attention, dims=dims,
        kv_cache=kv_cache, max_context=max_context, cache_layout=cache_layout, compress=compress, deploy=deploy,
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

    collect = collecting()  # convert_functions joins the passed programs and writes them once
    try:
        model = ct.convert(
            lowered.program,
            convert_to="milinternal" if collect else "mlprogram",
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
    return PassedFunction(model, pass_pipeline) if collect else model


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
    deploy: str | DeployForm = "plain",
    split_logits: bool = True,
    fp16_io: bool = False,
    format: str | None = None,
) -> ct.models.MLModel:
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
    metadata); once saved, `rlx_mil.milexec.stored_weights.package_params(params, path, report)`
    gives the weights the package computes with, decoded from its own codes.
    `pass_pipeline` defaults to the Core ML passes that can change an rlx_mil program
    (`rlx_mil.coreml.pipeline`); `default_pass_pipeline(precision)` is Core ML's full one.

    `deploy` shapes the program for a device (`rlx_mil.coreml.deploy`, docs/deploying.md):
    "plain" (default) as above, "gpu" (fused attention, iOS18) or "ane" (the Neural Engine
    form: channels-first activations, 1x1 convs, per-head attention). The outputs are the
    same; the form is recorded in the metadata (`rlx_mil.deploy`). The Neural Engine form
    returns an output wider than 16,384 (the LM head's logits) as `ceil(V / 16384)` pieces
    (`logits_0`, `logits_1`, ...; the contract is `rlx_mil.split_outputs` in the metadata,
    which `Session`, `rlx-mil run/eval/generate` and the executor read transparently);
    `split_logits=False` returns one concatenated output instead (preflight reports its width).
    `fp16_io=True` makes the inputs and outputs the graph declares F16 fp16 in the package's
    interface (iOS16+; WhisperKit's packages take and give fp16 arrays).

    `format` is what the model is for: "mlpackage" (Core ML) or "aimodel" (Apple's Core AI
    asset of the same program; the coreai extra, checked before converting). The model
    remembers it: `rlx_mil.save(model, "name")` writes `name.aimodel`, and a path ending in the
    other format's suffix is a typed error (`rlx_mil.coreml.output_format`).
    """

    graph = require_graph(graph)
    _require_format(format)
    tgt = Target.parse(target)
    prec = Precision.parse(precision)
    form = DeployForm.parse(deploy)
    split_outputs = _flag(split_logits, "split_logits")
    attention = _attention_mode(attention, form, tgt)
    if form is DeployForm.ANE:
        max_context = neural_engine_capacity(max_context)
    if compute_units not in COMPUTE_UNITS:
        raise InvalidOptionError(f"compute_units must be one of {COMPUTE_UNITS}, got {compute_units!r}")
    if dims is not None:
        graph = graph.bind(dims)
    graph, plan = _kv_plan(graph, kv_cache, max_context, cache_layout, tgt, form)
    compressor, params = _compressor(form_compression(compress, form), graph, tgt, prec, params)
    with (
        conversion_temporaries(), objects_frozen(), direct_weight_writes(), validation_once_per_pipeline(),
        nonreplaceable_marks_only_with_constexprs(), fusion_patterns_built_once(), pass_bars_hidden(),
        program_text_only_when_logged(), consts_compared_in_chunks(),
    ):
        lowered = lower_graph(graph, params, target=tgt, precision=prec, options=_options(attention, compressor, form, fp16_io),
                              kv_cache=plan)
        context = RewriteContext(form, tgt, prec, split_outputs=split_outputs)
        rewrite_program(lowered.program, context)
        split = name_split_outputs(lowered.outputs, context.split_outputs_made)
        if pass_pipeline is None:
            pass_pipeline = rlx_pass_pipeline(prec, lowered.program)
        model = _ct_convert(lowered, graph, tgt, prec, compute_units, pass_pipeline)
    meta = model.user_defined_metadata
    metadata.write_io_names(meta, lowered.inputs, lowered.outputs)
    meta[metadata.GRAPH] = graph.name
    meta[metadata.TARGET] = tgt.label
    meta[metadata.PRECISION] = prec.value
    metadata.write_deploy(meta, form)
    metadata.SplitOutputs({"main": split}).write(meta)
    if plan is not None:
        metadata.LLMContract.from_dict(plan.describe()).write(meta)
    ranges = _input_ranges(graph, lowered.inputs, plan)
    if ranges:
        meta[metadata.INPUT_RANGES] = encode_ranges({"main": ranges})
    meta[metadata.VERSION] = __version__
    if compressor is not None:
        meta[metadata.COMPRESSION] = compressor.report().to_json()
    release_when_collected(model)
    remember_format(model, format)
    return model


def _require_format(format: Any) -> None:
    """`format` checked, and for "aimodel" the coreai extra, before any conversion work."""
    if check_format(format) == "aimodel":
        from rlx_mil.coreai import require

        require("format='aimodel'")


def _input_ranges(graph: Graph, mil_to_ir: Mapping[str, str], plan: KVCachePlan | None) -> dict[str, tuple[int, int]]:
    """The value ranges the model declares (`rlx_mil.input_contract`), by interface name: Gather
    indices within their table, a stateful model's `cache_position` within the cache."""
    ir_to_mil = {ir: mil for mil, ir in mil_to_ir.items()}
    ranges = {ir_to_mil[ir]: r for ir, r in graph_input_ranges(graph).items() if ir in ir_to_mil}
    if plan is not None and plan.pairs:
        ranges[POSITION_INPUT] = (0, plan.max_context - plan.query_len)
    return ranges


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


def save(model: ct.models.MLModel, path: str | os.PathLike[str], *, overwrite: bool = False,
         format: str | None = None) -> Path:
    """Write `model` to `path` (.mlpackage; or `.aimodel`: Apple's Core AI asset of the same
    program, `rlx_mil.coreai.asset.save_aimodel`, fp32 compute) atomically: staged beside `path`, synced to disk,
    then swapped into place, so a failure or crash leaves the old package (or none) and
    never a half-written one. Errors are typed (FileAccessError subclasses also derive from
    the matching OSError: `except FileExistsError` works); see `rlx_mil.coreml.saving`.
    `format` ("mlpackage" or "aimodel"; default: the one the model was converted with, else
    the path's suffix) adds its suffix to a path without one; a path ending in the other
    format's suffix is an `InvalidOptionError` naming both."""
    if not callable(getattr(model, "save", None)):
        raise InvalidOptionError(f"save takes the MLModel that rlx_mil.convert returns, got {type(model).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidOptionError(f"path must be a str or os.PathLike ending in .mlpackage, got {path!r}")
    dest = _destination(path, format, model)
    if dest.suffix == ".aimodel":
        # Apple's Core AI asset (the coreai extra): the program translated, fp32 compute.
        from rlx_mil.coreai.asset import save_aimodel

        return save_aimodel(model, dest, overwrite=overwrite)
    if dest.suffix != ".mlpackage":
        raise InvalidOptionError(
            f"a Core ML ML Program is saved as a .mlpackage folder (or a Core AI .aimodel asset), got {str(dest)!r}")
    return save_package(model, dest, overwrite=overwrite)


def _destination(path: str | os.PathLike[str], format: str | None, model: Any = None) -> Path:
    """`path` for `format` (else the one `model` was converted with): see `output_path`."""
    remembered = model_format(model)
    if format is None and remembered is not None:
        by_suffix = format_of_suffix(path)
        if by_suffix not in (None, remembered):
            raise InvalidOptionError(
                f"the model was converted with format={remembered!r}, which contradicts the path's suffix"
                f" ({str(path)!r}): name it {Path(path).stem}{SUFFIXES[remembered]}, or pass format={by_suffix!r}")
        return output_path(path, remembered)
    return output_path(path, format)


#: Options one function may set for itself; the rest are shared by the whole package.
PER_FUNCTION_OPTIONS = frozenset({"dims", "kv_cache", "attention", "max_context", "params"})

FunctionSpec = Graph | tuple[Graph, Mapping[str, Any]]

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
    progress: Progress | None = None,
    format: str | None = None,
    **options: Any,
) -> ct.models.MLModel:
    """Convert each `{function_name: graph or (graph, options)}` and join them into one
    multifunction `.mlpackage`; returns its `ct.models.MLModel` (not loaded for prediction).
    `progress` reports each function's conversion, the join and the save as a stage.

    `options` are `rlx_mil.convert`'s keyword arguments (target, precision, kv_cache,
    max_context, cache_layout, compress, deploy, ...), shared by every function; a function's own mapping may
    override `dims`, `kv_cache`, `attention` and `max_context`, and give the `params` it reads (a
    function reading other weights than the rest; weights of one name are still shared). `default_function` (default:
    "decode" if present, else the first) is what Core ML runs when no function is named.
    `path` also saves the package there (atomically, see `rlx_mil.save`); `format`
    ("mlpackage" or "aimodel": Apple's Core AI asset, one entry point per function, weights
    stored once) as for `rlx_mil.convert` and `rlx_mil.save`.
    """
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
    _require_format(format)
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidOptionError(f"path must be a str or os.PathLike ending in .mlpackage, got {path!r}")
        path = output_path(path, format)
        check_destination(path, overwrite)  # before converting every function

    # Every function is lowered against one set of weight arrays and taken through Core ML's
    # passes in memory; the join then writes each weight once (rlx_mil.coreml.multifunction).
    stages = progress or Progress(enabled=False)
    from rlx_mil.compress.shared import shared_compression

    # shared_compression: each weight is compressed (and the quality checked) once, not once per function.
    with conversion_temporaries(), pass_bars_hidden(), weights_shared_across_graphs(), shared_compression() as shared:
        passed = {}
        for i, (name, (graph, own)) in enumerate(specs.items(), 1):
            stages.begin(f"converting function {name} ({i}/{len(specs)})", unit=" ops")
            with collecting_functions():
                own_params = own.pop("params", params)  # a function reading its own subset of the weights
                passed[name] = convert(graph, own_params, **{**options, **own})
            stages.end(f"{len(graph)} IR nodes")
        stages.begin(f"joining {len(specs)} functions, writing each weight once")
        # frozen: a full collection would rescan every function's program (~0.3 s for 3 of a 28-layer decoder)
        with direct_weight_writes(), objects_frozen():
            model = join_programs(passed, default_function, Target.parse(options.get("target", "iOS18")).ct_target)
        del passed
        release_when_collected(model)
        if shared.codes:  # what a later quality check decodes instead of encoding every weight again
            model.rlx_mil_codes = shared.codes_by_name()
        stages.end()
    remember_format(model, format)
    if path is not None:
        stages.begin("writing the package")
        save(model, path, overwrite=overwrite)
        stages.end(str(path))
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
    format: str | None = None,
    **options: Any,
) -> ct.models.MLModel:
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
        functions, params, default_function=default_function, path=path, overwrite=overwrite, format=format, **options
    )
