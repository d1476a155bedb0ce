"""Several graphs as the functions of one Core ML package, sharing one copy of the weights
(and, for stateful LLM packages, the same KV-cache states).

`rlx_mil.convert_functions` lowers every function's graph against one set of weight arrays
(`rlx_mil.lowering.program.weights_shared_across_graphs`: a weight is read and cast once),
takes each through Core ML's pass pipeline in memory (`collecting_functions`: no package is
written per function), and `join_programs` writes one package in which every weight is one
blob however many functions use it: a prefill + decode package costs about what one function
does to convert and to store. Functions of one package must declare the same states (names
and shapes): an `MLState` made for the package serves every function.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.compress.report import CompressionReport, merged_report
from rlx_mil.coreml.metadata import (
    COMPRESSION,
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
from rlx_mil.coreml.pipeline import DEAD_CODE_ELIMINATION, passless_programs_left_alone
from rlx_mil.coreml.weight_writes import BLOB_MIN_ELEMENTS, program_blob_bytes
from rlx_mil.errors import ConversionError, InvalidOptionError, RlxMilError
from rlx_mil.progress import count_bytes


def merged_metadata(metas: Mapping[str, Mapping[str, str]], default_function: str) -> dict[str, str]:
    """The package metadata of functions whose own metadata is `metas`: rlx_mil's common keys,
    IO names, split outputs and input ranges per function, one LLM contract."""
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
    reports = [CompressionReport.from_json(meta[COMPRESSION]) for meta in metas.values() if COMPRESSION in meta]
    if len(reports) > 1:  # every function's compressed weights (their own, where they differ)
        common[COMPRESSION] = merged_report(reports).to_json()
    if contracts and default_function not in contracts:
        # a stateless function may sit beside stateful ones (Whisper's cross-attention prefill,
        # called without a state), but the default function is the one the contract describes
        raise InvalidOptionError(f"the default function {default_function!r} has no KV cache while"
                                 f" {sorted(contracts)} do; make a stateful function the default")
    states = {name: c.states for name, c in contracts.items()}
    if len({json.dumps(s, sort_keys=True) for s in states.values()}) > 1:
        raise InvalidOptionError(f"the functions declare different states, which one package cannot share: {states}")
    merged: dict[str, str] = dict(common)
    write_io_names(merged, **io_names[default_function])
    FunctionTable(default_function, io_names).write(merged)
    if ranges:
        merged[INPUT_RANGES] = json.dumps(ranges, sort_keys=True)
    split.write(merged)
    if contracts:
        lengths = {name: c.query_len for name, c in contracts.items()}
        contracts[default_function].joined(default_function, lengths).write(merged)
    return merged


# -- functions joined in memory: one lowering of the weights, one write --------------------------
_COLLECTING: contextvars.ContextVar[bool] = contextvars.ContextVar("rlx_mil_collect_functions", default=False)


@contextlib.contextmanager
def collecting_functions() -> Iterator[None]:
    """Within the block, `rlx_mil.convert` stops after Core ML's pass pipeline: it returns a
    `PassedFunction` (the passed MIL program and the model's metadata) instead of writing a
    package, for `join_programs`."""
    token = _COLLECTING.set(True)
    try:
        yield
    finally:
        _COLLECTING.reset(token)


def collecting() -> bool:
    return _COLLECTING.get()


class PassedFunction:
    """One function converted up to serialisation: its program after Core ML's main and
    backend pass pipelines (what `ct.convert` would have serialised), and its metadata."""

    def __init__(self, program: Any, pass_pipeline: Any) -> None:
        from coremltools.converters.mil.converter import _construct_other_pipelines
        from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipelineManager

        # `ct.convert(..., convert_to="milinternal")` stops before the backend's passes.
        _, backend = _construct_other_pipelines(pass_pipeline, "milinternal", "mlprogram")
        PassPipelineManager.apply_pipeline(program, backend)
        if DEAD_CODE_ELIMINATION not in backend.passes:
            # the pipeline's validation left the essential scopes unchecked: the exporter's
            # check, which the join skips (`join_programs`)
            program.validate(check_essential_scope=True)
        program._check_early_error_out_for_invalid_program()
        self._mil_program = program
        self.user_defined_metadata: dict[str, str] = {}
        self.package_path = None


def join_programs(functions: Mapping[str, PassedFunction], default_function: str, target: Any) -> Any:
    """One multifunction package from the passed programs of its functions: a const whose
    array another function's const holds too (the weights lowered once, see
    `rlx_mil.lowering.program.weights_shared_across_graphs`), or holds bytes equal to it, is
    written once and shared; nothing is read back or written twice. Returns the
    `ct.models.MLModel` (not loaded for prediction) with the merged metadata."""
    from coremltools.converters.mil.converter import mil_convert
    from coremltools.converters.mil.mil import Program

    program = Program()
    # `Program.add_function` checks the opsets of every function added so far, each time; the
    # last check, over all of them, is the one that matters.
    program.functions.update({name: function._mil_program.functions["main"] for name, function in functions.items()})
    program._check_program_opset_version()
    share_weights(program)
    program.default_function_name = default_function
    program.skip_all_passes = True
    program.export_as_multifunction = True
    # Each function was validated (essential scopes included) and checked for what Core ML
    # cannot run after its last pass (`PassedFunction`), and joining changes none of them: the
    # exporters' two validations of the whole program and the early error check are skipped.
    program.validate = _validated
    program._check_early_error_out_for_invalid_program = _validated
    count_bytes(program_blob_bytes(program.functions.values()))  # the running stage's bar, if any
    with passless_programs_left_alone():  # the passes are skipped: nothing to validate or print
        try:
            model = mil_convert(
                program, convert_to="mlprogram", convert_from="milinternal",
                specification_version=max(int(target.value), _IOS18_SPEC), compute_units=_cpu_only(),
                skip_model_load=True,
            )
        except (RlxMilError, OSError):
            raise
        except Exception as err:  # e.g. the package writer's "filesystem error" on a full disk
            raise ConversionError(f"coremltools failed to write the joined functions {sorted(functions)}:"
                                  f" {type(err).__name__}: {err}") from err
    model.user_defined_metadata.update(merged_metadata({n: f.user_defined_metadata for n, f in functions.items()},
                                                       default_function))
    _write_spec(model)
    return model


_IOS18_SPEC = 9


def _validated(*_: Any, **__: Any) -> None:
    """The validation (and early error check) of a joined program, whose functions were each
    validated and checked already."""


def _cpu_only() -> Any:
    import coremltools as ct

    return ct.ComputeUnit.CPU_ONLY


def share_weights(program: Any) -> int:
    """Give every group of consts of different functions holding the same values one
    `weight_id` (the serialiser writes one blob per id); returns the number of groups. Consts
    of one array (the weights lowered once) are found by identity; the bytes of a const are
    read (hashed) only when no other function holds its array but one holds a const of its
    dtype and shape that is not shared either."""
    holders: dict[tuple[Any, ...], list[Any]] = {}
    for function in program.functions.values():
        for op in function.operations:
            value = op.outputs[0].val if op.op_type == "const" else None
            if isinstance(value, np.ndarray) and value.size >= _BLOB_MIN:
                holders.setdefault(_buffer_key(value), []).append(op)
    groups: list[list[Any]] = []
    alone: dict[tuple[Any, ...], list[list[Any]]] = {}
    for ops in holders.values():
        if len({id(op.enclosing_block) for op in ops}) > 1:
            groups.append(ops)
        else:
            value = ops[0].outputs[0].val
            alone.setdefault((value.dtype.str, value.shape), []).append(ops)
    for candidates in alone.values():
        if len({id(ops[0].enclosing_block) for ops in candidates}) < 2:
            continue
        by_content: dict[tuple[Any, ...], list[Any]] = {}
        for ops in candidates:
            by_content.setdefault(_content_key(ops[0].outputs[0].val), []).extend(ops)
        groups += [ops for ops in by_content.values() if len({id(op.enclosing_block) for op in ops}) > 1]
    for index, ops in enumerate(groups):
        for op in ops:
            op.weight_id = str(index)
    return len(groups)


_BLOB_MIN = BLOB_MIN_ELEMENTS


def _buffer_key(value: np.ndarray) -> tuple[Any, ...]:
    return (value.dtype.str, value.__array_interface__["data"][0], value.shape, value.strides)


def _content_key(value: np.ndarray) -> tuple[Any, ...]:
    from rlx_mil.compress.code_store import release_pages

    digest = hashlib.blake2b(digest_size=16)
    flat = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    step = 1 << 24
    for start in range(0, flat.size, step):
        digest.update(flat[start:start + step].data)
    release_pages(value)  # codes in the code store's file: the pages read stay resident otherwise
    return (value.dtype.str, value.shape, digest.hexdigest())


def _write_spec(model: Any) -> None:
    """Store `model`'s spec (with the metadata just set) in its package, replacing the one
    coremltools wrote: the package is then complete for any reader, without copying it."""
    from coremltools.models.utils import _get_model_spec_path

    path = Path(_get_model_spec_path(str(model.package_path)))
    staged = path.with_name(path.name + ".tmp")
    staged.write_bytes(model._spec.SerializeToString())
    os.replace(staged, path)
