"""The float weights a saved package holds, decoded from its own stored codes, by the original
(IR) weight name.

A check of a compressed package must judge the codes the package holds, not weights encoded
again from the report's scheme names: an encoder fitted on calibration data (GPTQ-style rounding,
activation-weighted k-means) gives other codes without that data, and a re-encoding would judge
weights the package does not hold. `StoredWeights(package, weights)` reads the package's
program (weights mapped from its weight file, 4-bit blobs packed: `loader.load_program`) and
decodes a weight when it is read, one at a time, with the executor's own kernels: the
`constexpr_*` op that holds it (`lut_to_dense`, `blockwise_shift_scale`, `affine_dequantize`,
`sparse_to_dense`, ... and any chain of them) and the run-time ops of a GGUF code held split in
two tables (`rlx_mil.compress.prequantized.split_op`). Nothing decoded is kept.

Which op holds a weight: the compression report records the name the lowering gave each
weight's decoding op (`WeightReport.ops`); a package from before that names them by the
weight's MIL identifier. The Neural Engine form's rewrites rebuild a projection's weight as
`<op>_conv` (`[O, C, 1, 1]`) and cut a wide one into `<op>_part<i>` (optionally `_conv_part<i>`,
with a `_<k>` suffix where a name was taken); the pieces are joined along the axis they were cut.
Functions of a multifunction package and the packages of a chunked set are searched in order.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlx_mil.errors import MilExecError
from rlx_mil.milexec.executor import PRECISION_MODELS, PrecisionModel, _Interpreter
from rlx_mil.milexec.loader import FourBitCodes, _open_model, load_program, release
from rlx_mil.milexec.protoread import read_model, read_program
from rlx_mil.reference.overlay import OverlaidParams


class WeightPlace(Protocol):
    """What locating a weight needs (a `rlx_mil.compress.WeightReport` is one)."""

    name: str
    #: "kn": a [K, N] matmul weight stored as the [N, K] `linear` weight; "dense": as given.
    layout: str
    shape: list[int]
    ops: list[str]


def _identifier(name: str) -> str:
    from rlx_mil.ir.naming import mil_identifier

    return mil_identifier(name)


class _Function:
    """One function of one package: its ops by name and their program order."""

    def __init__(self, where: str, function: Any) -> None:
        self.where = where
        self.function = function
        self.by_name: dict[str, Any] = {}
        self.order: dict[int, int] = {}
        for index, op in enumerate(function.operations):
            self.by_name.setdefault(op.name, op)
            self.order[id(op)] = index


class StoredWeights(Mapping[str, np.ndarray]):
    """By weight name, the float32 values a saved package's compressed weights decode to (see
    the module doc). `packages`: a `.mlpackage` path, or the packages of a chunked set in
    order, or a program loaded already (`load_program(path, packed_4bit=True)`, a prepared
    session's, which then holds the only copy of the codes); `weights`: the compressed weights
    to find (a compression report's `weights`).
    `precision_model` as for `milexec.run`: "float32" (the default) keeps the decode's float32
    arithmetic: the values the codes denote, what `rlx_mil.compress.dequantized_params` computes
    for them (for a GGUF code held split in an fp16 program, its run-time ops unrounded);
    "declared" rounds each op of the decode to the dtype it declares (an fp16 package's weights
    as fp16 values, as the device holds them).

    A weight is decoded when read and not kept: the caller holds at most one at a time beyond
    what it keeps itself. Every weight is located when the mapping is made, so a package that
    lacks one raises `MilExecError` naming it before anything is decoded."""

    def __init__(
        self,
        packages: Any,
        weights: Iterable[WeightPlace],
        *,
        precision_model: PrecisionModel = "float32",
    ) -> None:
        if precision_model not in PRECISION_MODELS:
            raise MilExecError(f"precision_model must be one of {PRECISION_MODELS}, got {precision_model!r}")
        import rlx_mil.milexec.kernels  # noqa: F401  (registers every kernel)

        self.precision_model = precision_model
        paths = [packages] if isinstance(packages, (str, os.PathLike)) or hasattr(packages, "functions") \
            else list(packages)
        self._functions: list[_Function] = []
        # One package: its default function is read first, the others only for a weight it lacks
        # (a multifunction LLM's functions share every weight: parsing them all cost a third of a
        # 3-function package's quality check). A chunked set's packages are read whole, in order.
        rest: Any = None
        #: Whether the mapped codes' pages are dropped after each decode: only in a program read
        #: here (a session's own program keeps what its memory mode chose).
        self._release = True
        for path in paths:
            if hasattr(path, "functions"):  # a program loaded already (a prepared session's): not read again
                program, where = path, "the program"
                self._release = False
            elif len(paths) == 1:
                model = _open_model(path)
                program = read_model(model, path, packed_4bit=True, default_only=True)
                if program is None:
                    program = load_program(path, packed_4bit=True)
                elif set(program.all_functions) - set(program.functions):
                    rest = (model, path, [n for n in program.all_functions if n not in program.functions])
                where = Path(path).name
            else:
                program = read_program(path, packed_4bit=True) or load_program(path, packed_4bit=True)
                where = Path(path).name
            self._add(program, where)
        self._places: dict[str, tuple[WeightPlace, _Function, list[Any], tuple[Any, Any] | None]] = {}
        wanted = list(weights)
        missing = self._locate_all(wanted)
        if missing and rest is not None:
            model, path, names = rest
            others = read_model(model, path, names, packed_4bit=True)
            if others is None:  # what the light reader leaves to coremltools: the whole program again
                self._functions, self._places = [], {}
                self._add(load_program(path, packed_4bit=True), Path(path).name)
            else:
                self._add(others, Path(path).name)
            missing = self._locate_all(wanted)
        if missing:
            shown = ", ".join(repr(n) for n in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise MilExecError(
                f"{', '.join(str(p) for p in paths)}: no op of the package holds the compressed weight"
                f"{'s' if len(missing) > 1 else ''} {shown} its compression report lists (a damaged or"
                " rewritten program?)"
            )

    def _add(self, program: Any, where: str) -> None:
        default = getattr(program, "default_function_name", None)
        names = sorted(program.functions, key=lambda n: n != default)  # the default function first
        for name in names:
            self._functions.append(_Function(f"{where}:{name}", program.functions[name]))

    def _locate_all(self, weights: list[WeightPlace]) -> list[str]:
        """Locate every weight not located yet; the names of those no function holds."""
        missing = []
        for weight in weights:
            if weight.name in self._places or weight.name in missing:
                continue
            found = self._locate(weight)
            if found is None:
                missing.append(weight.name)
            else:
                self._places[weight.name] = (weight, *found)
        return missing

    # -- locating ---------------------------------------------------------------------------
    def _locate(self, weight: WeightPlace) -> tuple[_Function, list[Any], tuple[Any, Any] | None] | None:
        """The function and the op(s) holding `weight`: one op, or the pieces it was cut into;
        and the factor consts of its low-rank correction when it has one."""
        names = list(weight.ops) or [_identifier(weight.name)]
        for function in self._functions:
            for base in names:
                for candidate in (base, f"{base}_conv"):
                    op = function.by_name.get(candidate)
                    if op is not None:
                        return function, [op], _factors(function, base)
                pieces = _pieces(function, base)
                if pieces:
                    return function, pieces, _factors(function, base)
        return None

    # -- Mapping ----------------------------------------------------------------------------
    def __getitem__(self, name: str) -> np.ndarray:
        weight, function, ops, factors = self._places[name]
        values = [self._decode(function, op) for op in ops]
        if factors is not None:  # Q + A B, in the stored [out, in] layout, before it is laid out as the Param
            down, up = (_dropped_unit_dims(np.asarray(op.outputs[0].val, np.float32), 2) for op in factors)
            storage = _storage_shape(weight)
            whole = _assemble(weight, values, function.where, [op.name for op in ops])
            rows = (whole.T if weight.layout == "kn" else whole).reshape(storage[0], -1) + up @ down
            return _assemble(weight, [rows.reshape(storage)], function.where, [op.name for op in (*ops, *factors)])
        return _assemble(weight, values, function.where, [op.name for op in ops])

    def __iter__(self) -> Iterator[str]:
        return iter(self._places)

    def __len__(self) -> int:
        return len(self._places)

    def __contains__(self, name: object) -> bool:
        return name in self._places

    def op_names(self, name: str) -> list[str]:
        """The ops `name` is decoded from (`package:function:op`), for messages."""
        _, function, ops, _ = self._places[name]
        return [f"{function.where}:{op.name}" for op in ops]

    # -- decoding ---------------------------------------------------------------------------
    def _decode(self, function: _Function, root: Any) -> np.ndarray:
        """The output of `root` computed from the constants it depends on: every op between
        them, in program order, through the executor's kernels."""
        cone: dict[int, Any] = {}
        stack = [root]
        while stack:
            op = stack.pop()
            if id(op) in cone:
                continue
            cone[id(op)] = op
            for var in _input_vars(op):
                producer = var.op
                if producer is None:
                    raise MilExecError(f"{function.where}: op {root.name!r} reads the input {var.name!r}: it is not a"
                                       " stored weight")
                if producer.op_type != "const":
                    stack.append(producer)
        scratch = _Interpreter(self.precision_model, None, False, None, track_nonfinite=False)
        try:
            for op in sorted(cone.values(), key=lambda o: function.order.get(id(o), -1)):
                if op.blocks:
                    raise MilExecError(f"{function.where}: op {root.name!r} depends on a control-flow op"
                                       f" {op.name!r}: it is not a stored weight")
                for var in _input_vars(op):
                    if var.op is not None and var.op.op_type == "const" and isinstance(var.val, FourBitCodes):
                        scratch.env[id(var)] = var.val.unpacked()
                with np.errstate(all="ignore"):
                    scratch._execute(op)
            value = scratch.env[id(root.outputs[0])]
        finally:
            scratch.env.clear()
        if self._release:  # the codes' pages go back (the file keeps them): no second copy of the weights stays
            for op in cone.values():
                for var in _input_vars(op):
                    if var.op is not None and var.op.op_type == "const" and isinstance(var.val, np.ndarray):
                        release(var.val)
        return np.asarray(value, np.float32)


def _input_vars(op: Any) -> list[Any]:
    found: list[Any] = []
    for value in op.inputs.values():
        found.extend(value if isinstance(value, (list, tuple)) else [value])
    return found


def _factors(function: _Function, base: str) -> tuple[Any, Any] | None:
    """The (B, A) consts of the low-rank correction of the weight decoded by op `base`
    (`rlx_mil.compress.lowrank.FACTOR_SUFFIXES`, a 1x1 conv's `_conv` after them), else None."""
    found = []
    for suffix in ("_lr_down", "_lr_up"):
        op = function.by_name.get(f"{base}{suffix}_conv") or function.by_name.get(f"{base}{suffix}")
        found.append(op)
    return (found[0], found[1]) if found[0] is not None and found[1] is not None else None


_PIECE = re.compile(r"(_conv)?_part(\d+)(_\d+)?$")


def _pieces(function: _Function, base: str) -> list[Any]:
    """The pieces a rewrite cut `base` into (`<base>[_conv]_part<i>[_<k>]`), in order of i:
    the first full set (pieces 0..n-1 of one cut) found."""
    cuts: dict[tuple[str, str], dict[int, Any]] = {}
    for name, op in function.by_name.items():
        if not name.startswith(base):
            continue
        match = _PIECE.fullmatch(name[len(base):])
        if match is None or op.op_type == "const":
            continue
        cuts.setdefault((match.group(1) or "", match.group(3) or ""), {})[int(match.group(2))] = op
    for _, parts in sorted(cuts.items()):
        if sorted(parts) == list(range(len(parts))):
            return [parts[i] for i in range(len(parts))]
    return []


def _storage_shape(weight: WeightPlace) -> tuple[int, ...]:
    shape = tuple(int(d) for d in weight.shape)
    return (shape[-1], shape[-2]) if weight.layout == "kn" else shape


def _dropped_unit_dims(value: np.ndarray, rank: int) -> np.ndarray:
    """`value` without the unit dims after its first `rank` (a conv weight's `[O, C, 1, 1]`)."""
    if value.ndim > rank and all(d == 1 for d in value.shape[rank:]):
        return value.reshape(value.shape[:rank])
    return value


def _assemble(weight: WeightPlace, values: list[np.ndarray], where: str, ops: list[str]) -> np.ndarray:
    """The weight in its Param's shape from the decoded values of its op or pieces."""
    storage = _storage_shape(weight)
    if len(values) == 1 and values[0].size == int(np.prod(storage, dtype=np.int64)):
        whole = values[0].reshape(storage)
    else:
        parts = [_dropped_unit_dims(v, len(storage)) for v in values]
        axes = {a for p in parts for a in range(len(storage)) if p.ndim == len(storage) and p.shape[a] != storage[a]}
        if len(axes) != 1 or any(p.ndim != len(storage) for p in parts):
            raise MilExecError(f"{where}: the pieces {ops} of weight {weight.name!r} (shapes"
                               f" {[list(p.shape) for p in parts]}) do not make its {list(storage)}")
        whole = np.concatenate(parts, axis=axes.pop())
        if whole.shape != storage:
            raise MilExecError(f"{where}: the pieces {ops} of weight {weight.name!r} join to {list(whole.shape)},"
                               f" not its {list(storage)}")
    if weight.layout == "kn":
        whole = whole.T
    return np.ascontiguousarray(whole.reshape(tuple(int(d) for d in weight.shape)), dtype=np.float32)


class PackageParams(OverlaidParams):
    """`params` with every weight `stored` (a `StoredWeights`) holds replaced by the package's
    decoded value (on access, one at a time): what the package computes with, for the reference evaluator.
    The other weights (kept in float) are `params`' own."""

    def __init__(self, params: Mapping[str, Any], stored: Mapping[str, Any]) -> None:
        super().__init__(params)
        self.stored = stored

    def __getitem__(self, name: str) -> Any:
        if name in self.stored:
            return self.stored[name]
        return self._params[name]

    def _overlaid(self, name: str) -> bool:
        return name in self.stored


def package_params(
    params: Mapping[str, Any],
    packages: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    report: Any,
    *,
    precision_model: PrecisionModel = "float32",
) -> PackageParams:
    """`params` as the saved package computes with them: each weight `report` (the package's
    `rlx_mil.compress.CompressionReport`) lists as compressed decoded from the package's own
    codes when read (`StoredWeights`), the others unchanged."""
    return PackageParams(params, StoredWeights(packages, report.weights, precision_model=precision_model))
