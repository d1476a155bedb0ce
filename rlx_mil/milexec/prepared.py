"""A program readied once for many runs: what `rlx_mil.generate.Session` runs on the executor.

`prepare(source, memory=...)` loads the program (weights mapped from the package's weight file,
see `rlx_mil.milexec.loader`) and builds a `Plan` per function (consts resolved once,
liveness, in-place state writes). Two memory modes decide what happens to the weights:

* ``"fast"``: every fp16 weight of at least `WIDEN_MIN` elements is widened to float32 once
  (the values are the fp16 ones, exactly: the precision model is unchanged) and compressed
  weights (``constexpr_*`` ops) are decoded once; the functions of a package share these
  arrays. Runs then do float32 BLAS straight on them. About 2x the fp16 weight bytes.
* ``"lean"``: nothing is widened or kept decoded. A large fp16 weight stays a view of the
  mapped file, is widened a block of rows at a time inside `linear`, and its resident pages
  are dropped once the op that read it ran; compressed weights are decoded by each run, op by
  op, and freed after their last use. About the states plus one layer's weights resident.
* ``"auto"``: ``"fast"`` when its estimate fits in half the memory available now, else lean.

Runs update the caller's state arrays in place (no copy of a KV cache per call) and track no
inf/NaN origins (`milexec.run(..., return_all=True)` does).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any, Literal

import numpy as np

from rlx_mil.errors import InvalidOptionError, MilExecError
from rlx_mil.milexec.executor import (
    PRECISION_MODELS,
    PrecisionModel,
    _Interpreter,
    _require_addressable,
    _require_kernels,
)
from rlx_mil.milexec.fp16 import widen
from rlx_mil.milexec.loader import IONames, ResolvedSource, load_program, release, resolve_source
from rlx_mil.milexec.plan import Plan, build_plan, root_key

MemoryMode = Literal["auto", "fast", "lean"]
MEMORY_MODES: tuple[str, ...] = ("auto", "fast", "lean")

#: fp16 consts of at least this many elements are weights that "fast" widens once.
WIDEN_MIN = 1 << 16


def prepare(
    source: Any,
    *,
    memory: MemoryMode = "auto",
    precision_model: PrecisionModel = "declared",
    functions: Sequence[str] | None = None,
) -> PreparedProgram:
    """Load `source` (a `.mlpackage` path, MIL Program or MLModel) and prepare `functions`
    (default: every function) for repeated runs; see the module doc."""
    return PreparedProgram(source, memory=memory, precision_model=precision_model, functions=functions)


class PreparedProgram:
    """Functions of one program, prepared; `run` executes one of them."""

    def __init__(
        self,
        source: Any,
        *,
        memory: MemoryMode = "auto",
        precision_model: PrecisionModel = "declared",
        functions: Sequence[str] | None = None,
    ) -> None:
        import rlx_mil.milexec.kernels  # noqa: F401  (registers every kernel)

        if memory not in MEMORY_MODES:
            raise InvalidOptionError(f"memory must be one of {MEMORY_MODES}, got {memory!r}")
        if precision_model not in PRECISION_MODELS:
            raise InvalidOptionError(f"precision_model must be one of {PRECISION_MODELS}, got {precision_model!r}")
        self.source = source
        program = load_program(source) if isinstance(source, (str, os.PathLike)) else None
        first = resolve_source(program if program is not None else source, None, None)
        self.program = first.program
        names = list(functions) if functions is not None else (
            list(self.program.functions) if self.program is not None else [first.function_name]
        )
        self.default_function = first.function_name
        self._resolved: dict[str, ResolvedSource] = {}
        for name in names:
            resolved = first if name == first.function_name else resolve_source(self.program, name, None)
            _require_kernels(resolved.function)
            _require_addressable(resolved.function)
            self._resolved[name] = resolved
        self.precision_model = precision_model
        self.memory = _choose(memory, self._resolved.values())
        self._plans: dict[str, Plan] = {}
        shared: dict[tuple[Any, ...], np.ndarray] = {}
        for name, resolved in self._resolved.items():
            plan = build_plan(resolved.function, lean=self.memory == "lean")
            if self.memory == "fast":
                self._decode_once(resolved.function, plan, shared)
            self._plans[name] = plan
        #: bytes of the weights held in their prepared (float32) form.
        self.prepared_bytes = sum(a.nbytes for a in {id(a): a for a in shared.values()}.values())

    @property
    def functions(self) -> tuple[str, ...]:
        return tuple(self._resolved)

    def run(
        self,
        inputs: Mapping[str, Any],
        *,
        function_name: str | None = None,
        states: MutableMapping[str, np.ndarray] | None = None,
        io_names: Mapping[str, Any] | IONames | None = None,
    ) -> dict[str, np.ndarray]:
        """Outputs of one run of `function_name` (default: the program's default function).
        `states` is updated in place: the arrays of a previous run are written into."""
        name = function_name or self.default_function
        if name not in self._resolved:
            raise MilExecError(f"the program has no prepared function '{name}' (functions: {sorted(self._resolved)})")
        resolved = self._resolved[name]
        if io_names is not None:
            names = io_names if isinstance(io_names, IONames) else IONames.from_mapping(io_names)
            resolved = dataclasses.replace(resolved, io_names=names)
        interpreter = _Interpreter(
            self.precision_model, None, False, self._plans[name], track_nonfinite=False, states_in_place=True
        )
        return interpreter.run(resolved, inputs, states).outputs

    # -- fast: weights widened and decoded once -------------------------------------------------
    def _decode_once(self, function: Any, plan: Plan, shared: dict[tuple[Any, ...], np.ndarray]) -> None:
        for var_id, value in list(plan.consts.items()):
            if value.dtype == np.float16 and value.size >= WIDEN_MIN:
                plan.consts[var_id] = self._widened(value, shared)
        scratch = _Interpreter(self.precision_model, None, False, plan, track_nonfinite=False)
        for op in function.operations:
            if not op.op_type.startswith("constexpr_"):
                continue
            key = (op.op_type, *(_identity(plan.consts.get(id(v))) for v in op.inputs.values()))
            scratch._execute(op)
            for index, var in enumerate(op.outputs):
                value = scratch.env.pop(id(var))
                if isinstance(value, np.ndarray) and value.dtype == np.float16 and value.size >= WIDEN_MIN:
                    value = shared.setdefault((*key, index), widen(value))
                plan.consts[id(var)] = value
                if isinstance(value, np.ndarray):
                    plan.pinned.add(root_key(value))
            plan.precomputed.add(id(op))
        plan.release_after.clear()

    def _widened(self, value: np.ndarray, shared: dict[tuple[Any, ...], np.ndarray]) -> np.ndarray:
        key = ("const", *_identity(value))
        wide = shared.get(key)
        if wide is None:
            wide = shared[key] = widen(value)
            release(value)
        return wide


def _identity(value: Any) -> tuple[Any, ...]:
    """The memory an array's values sit in (equal for the functions' shared weights)."""
    if not isinstance(value, np.ndarray):
        return (id(value),)
    return (value.__array_interface__["data"][0], value.shape, value.strides, value.dtype.str)


def _choose(memory: str, functions: Any) -> str:
    if memory != "auto":
        return memory
    seen: set[Any] = set()
    need = 0
    for resolved in functions:
        from rlx_mil.mil_walk import iter_ops

        for op in iter_ops(resolved.function):
            if op.op_type == "const":
                value = op.outputs[0].val
                if isinstance(value, np.ndarray) and value.dtype == np.float16 and value.size >= WIDEN_MIN:
                    if _identity(value) not in seen:
                        seen.add(_identity(value))
                        need += 2 * value.nbytes
            elif op.op_type.startswith("constexpr_"):
                key = (op.op_type, *(_identity(v.val) for v in op.inputs.values()))
                if key in seen:
                    continue
                seen.add(key)
                for var in op.outputs:
                    shape = [int(d) for d in var.shape if isinstance(d, (int, np.integer))]
                    need += 4 * int(np.prod(shape, dtype=np.int64))
    available = _available_bytes()
    return "fast" if available is None or need <= available // 2 else "lean"


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
