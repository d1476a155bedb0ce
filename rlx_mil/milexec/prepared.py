"""A program readied once for many runs: what `rlx_mil.generate.Session` runs on the executor.

`prepare(source, memory=...)` loads the program (weights mapped from the package's weight file,
see `rlx_mil.milexec.loader`) and builds a `Plan` per function (consts resolved once,
liveness, in-place state writes). The memory mode decides what happens to the weights:

* ``"fast"``: weights are kept in the float32 form the kernels multiply with, up to a cache
  budget of `FAST_CACHE_RATIO` times the weights' fp16 bytes: every fp16 weight of at least
  `WIDEN_MIN` elements is widened once (the values are the fp16 ones, exactly: the precision
  model is unchanged) and compressed weights (``constexpr_*`` ops) are decoded once, in
  program order while the budget lasts; the functions of a package share these arrays. The
  fp16 weights past the budget are read as in ``"lean"``; the compressed ones that a run
  computes in fp16 are decoded once too, into those fp16 values (exact), and widened a block
  of rows at a time like an fp16 package's: a compressed package then runs as the fp16 one
  does (SmolLM2 lut4 decoded its codes past the budget every step at 2.2x the fp16 CPU time;
  0.94x so). The rest (fp32 programs) are read as in ``"lean"``.
* ``"compact"``: as ``"lean"``, plus float32 forms of the weights in program order up to
  `COMPACT_CACHE_RATIO` times the weights' fp16 bytes.
* ``"lean"``: nothing is widened or kept decoded. A large fp16 weight stays a view of the
  mapped file, is widened a block of rows at a time inside `linear`, and its resident pages
  are dropped once the op that read it ran; a `constexpr_blockwise_shift_scale` weight (int8,
  int4, or indices into one integer table: a `constexpr_lut_to_dense` feeding it) and a
  weight held split (below) are decoded a block of rows at a time by the `linear` reading it and row by row by an embedding `gather`
  (`rlx_mil.milexec.streamed`); other compressed weights are decoded by each run, op by op,
  and freed after their last use. About the states plus one layer's weights resident. 4-bit
  codes stay packed, two to a byte (`rlx_mil.milexec.streamed`).
* ``"auto"``: ``"fast"`` when its estimate fits in half the memory available now (compressed
  weights then decoded once per session); else ``"compact"`` for a program with compressed
  weights and ``"lean"`` for the others.

A `constexpr_lut_to_dense` whose output only feeds a `constexpr_blockwise_shift_scale` is part
of that weight: it is decoded (or streamed) with it, never kept on its own. So are the two
tables of a weight held split (`split_chain`: a GGUF 5-bit code as a 4-bit and a 1-bit table
summed, then scaled at run time): the chain is one streamed weight whose int8 codes are the
tables' sums (`rlx_mil.milexec.split_weight`), decoded once by ``"fast"`` within its budget
and a block of rows at a time by a run otherwise, never op by op (that cost a Gemma 3 270M
Q4_K_M decode step 10x the fp16 package's CPU time; 1.7x streamed).

A `linear` that widens or decodes a weight of 2^20 elements or more a block of rows at a time
splits the rows between `threads` Python threads (default: 2 where there are 2 cores; NumPy and
BLAS release the GIL), each with its own block buffer, each output column computed by one of
them as before (a lean int4 0.6B decode step: 2.5 s wall with two threads, 4.4 s with one, the
same 0.75 s of CPU, at load 10). BLAS itself runs on
`blas_threads` threads (default 1) during a prepared run: a decode step is
matrix-vector products bound by memory bandwidth, and OpenBLAS' worker threads spin against
each other when other processes hold the cores (a 0.6B decode step took 1.3-4.4 s with two
threads and 0.16-0.18 s with one at load 5 on a 2-core machine). ``blas_threads=None`` keeps
OpenBLAS' setting.

Runs update the caller's state arrays in place (no copy of a KV cache per call) and track no
inf/NaN origins (`milexec.run(..., return_all=True)` does).
"""

from __future__ import annotations

import contextlib
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
from rlx_mil.milexec.kernels.linalg import rows_in_threads
from rlx_mil.milexec.loader import (
    FourBitCodes,
    IONames,
    ResolvedSource,
    load_program,
    mapped_file,
    release,
    resolve_source,
)
from rlx_mil.milexec.lut_weight import LutWeight
from rlx_mil.milexec.plan import Plan, build_plan, root_key
from rlx_mil.milexec.protoread import read_program
from rlx_mil.milexec.registry import declared_dtype
from rlx_mil.milexec.split_weight import split_chain, split_weight
from rlx_mil.milexec.streamed import ShiftScaleWeight, StreamedWeight, lut_chain
from rlx_mil.progress import expect, tick

MemoryMode = Literal["auto", "fast", "compact", "lean"]
MEMORY_MODES: tuple[str, ...] = ("auto", "fast", "compact", "lean")

#: fp16 consts of at least this many elements are weights that "fast" widens once.
WIDEN_MIN = 1 << 16
#: "fast" keeps float32 forms of weights up to this many times the weights' fp16 bytes.
FAST_CACHE_RATIO = 1.5
#: "compact" keeps float32 forms of weights up to this many times the weights' fp16 bytes.
COMPACT_CACHE_RATIO = 0.6


def prepare(
    source: Any,
    *,
    memory: MemoryMode = "auto",
    precision_model: PrecisionModel = "declared",
    functions: Sequence[str] | None = None,
    blas_threads: int | None = 1,
    threads: int | None = None,
) -> PreparedProgram:
    """Load `source` (a `.mlpackage` path, MIL Program or MLModel) and prepare `functions`
    (default: every function) for repeated runs; see the module doc."""
    return PreparedProgram(source, memory=memory, precision_model=precision_model, functions=functions,
                           blas_threads=blas_threads, threads=threads)


class PreparedProgram:
    """Functions of one program, prepared; `run` executes one of them."""

    def __init__(
        self,
        source: Any,
        *,
        memory: MemoryMode = "auto",
        precision_model: PrecisionModel = "declared",
        functions: Sequence[str] | None = None,
        blas_threads: int | None = 1,
        threads: int | None = None,
    ) -> None:
        import rlx_mil.milexec.kernels  # noqa: F401  (registers every kernel)

        if memory not in MEMORY_MODES:
            raise InvalidOptionError(f"memory must be one of {MEMORY_MODES}, got {memory!r}")
        if precision_model not in PRECISION_MODELS:
            raise InvalidOptionError(f"precision_model must be one of {PRECISION_MODELS}, got {precision_model!r}")
        if blas_threads is not None and (isinstance(blas_threads, bool) or not isinstance(blas_threads, int)
                                         or blas_threads < 1):
            raise InvalidOptionError(f"blas_threads must be an int >= 1 or None, got {blas_threads!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise InvalidOptionError(f"threads must be an int >= 1 or None, got {threads!r}")
        self.blas_threads = blas_threads
        #: threads a large linear splits its weight's rows between (default: up to 2 cores).
        self.threads = threads if threads is not None else max(1, min(2, os.cpu_count() or 1))
        self.source = source
        # A package read here keeps its 4-bit codes packed (every stand-in is replaced below).
        program = _load(source, functions) if isinstance(source, (str, os.PathLike)) else None
        loaded = program if program is not None else source
        # Read for some functions only, the package's default one may not be among them.
        default = None if program is None or not functions or getattr(program, "default_function_name", None) in \
            program.functions else functions[0]
        first = resolve_source(loaded, default, None)
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
        shared: dict[tuple[Any, ...], Any] = {}
        weights = [_weights(resolved.function) for resolved in self._resolved.values()]
        ratio = {"fast": FAST_CACHE_RATIO, "compact": COMPACT_CACHE_RATIO}.get(self.memory, 0.0)
        budget = _Budget(int(ratio * _fp16_bytes(weights)))
        expect(" weights", sum(len(found) for found in weights))  # the opening stage's bar, if it counts them
        for (name, resolved), found in zip(self._resolved.items(), weights, strict=True):
            plan = build_plan(resolved.function, lean=self.memory != "fast")
            plan.checked = True
            self._prepare_weights(found, plan, shared, budget)
            _unpack_stand_ins(resolved.function, plan, shared)
            self._plans[name] = plan
        #: bytes of the weights held in their prepared (float32) form.
        self.prepared_bytes = budget.used

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
        with _blas_limit(self.blas_threads), rows_in_threads(self.threads):
            return interpreter.run(resolved, inputs, states).outputs

    # -- weights: cached (fast, within the budget) or streamed --------------------------------
    def _prepare_weights(self, weights: list[Any], plan: Plan, shared: dict[tuple[Any, ...], Any],
                         budget: _Budget) -> None:
        scratch = _Interpreter(self.precision_model, None, False, plan, track_nonfinite=False)
        for op in weights:
            tick(" weights")
            if op.op_type == "const":
                var = op.outputs[0]
                value = plan.consts[id(var)]
                key = ("const", *_identity(value))
                if key in shared or budget.take(4 * value.size):
                    if key not in shared:
                        shared[key] = widen(value)
                        release(value)
                    plan.consts[id(var)] = shared[key]
                continue
            key = _weight_key(op, plan.consts)
            chain = lut_chain(op) if op.op_type == "constexpr_blockwise_shift_scale" else None
            split = split_chain(op) if op.op_type == "reshape" else None
            out = op.outputs[0]
            if _table_only(op):  # a palette's table (coremltools scales one so): small, decoded once
                if key not in shared:
                    shared[key] = self._decoded(op, None, scratch)
                plan.consts[id(out)] = shared[key][0]
                plan.precomputed.update({id(op)} | ({id(chain)} if chain is not None else set()))
                continue
            # What another function shares: the form it chose (one streamed form, one cache).
            streamed = shared.get(("streamed", *key))
            half = ("half", *key)
            if streamed is None and key not in shared and half not in shared and len(op.outputs) == 1:
                streamed = self._streamed(op, split, scratch)
            chosen = key in shared or ("streamed", *key) in shared or half in shared
            if key in shared or (not chosen and budget.take(_elements(op) * 4)):
                if key not in shared:
                    shared[key] = self._decoded(op, streamed, scratch)
                for index, var in enumerate(op.outputs):
                    plan.consts[id(var)] = shared[key][index]
                    if isinstance(shared[key][index], np.ndarray):
                        plan.pinned.add(root_key(shared[key][index]))
                plan.precomputed.update({id(op)} | ({id(chain)} if chain is not None else set()))
                plan.precomputed.update(id(part) for part in split or ())
            elif half in shared or (not chosen and self.memory == "fast" and self._narrows(op)):
                # Past the float32 budget "fast" still decodes the weight once, into the fp16
                # values it declares (exact): a run widens it a block of rows at a time, as it
                # does an fp16 package's weights past the budget, instead of decoding its codes.
                if half not in shared:
                    shared[half] = self._decoded_fp16(op, streamed, scratch)
                plan.consts[id(out)] = shared[half]
                plan.pinned.add(root_key(shared[half]))
                plan.precomputed.update({id(op)} | ({id(chain)} if chain is not None else set()))
                plan.precomputed.update(id(part) for part in split or ())
            elif streamed is not None:
                plan.consts[id(out)] = shared.setdefault(("streamed", *key), streamed)
                plan.precomputed.update({id(op)} | ({id(chain)} if chain is not None else set()))
                plan.precomputed.update(id(part) for part in split or ())
                data = streamed.data
                if self.memory != "fast" and isinstance(data, np.ndarray) and mapped_file(data) is not None:
                    for user in out.child_ops:
                        plan.release_after.setdefault(id(user), []).append(data)
        if self.memory == "fast":
            plan.release_after.clear()

    def _streamed(self, op: Any, split: list[Any] | None, scratch: _Interpreter) -> StreamedWeight | None:
        """The form of weight `op` a run decodes a block of rows at a time, if it has one."""
        round_fp16 = declared_dtype(op.outputs[0]) == np.float16 and self.precision_model == "declared"
        if split is not None:
            return split_weight(split, scratch.lookup, round_fp16)
        if op.op_type == "constexpr_blockwise_shift_scale":
            chain = lut_chain(op)
            round_table = chain is not None and declared_dtype(chain.outputs[0]) == np.float16 and \
                self.precision_model == "declared"
            return ShiftScaleWeight.of(op, scratch.lookup, round_fp16, round_table)
        if op.op_type == "constexpr_lut_to_dense":  # the iOS18 form (LutWeight.of checks)
            return LutWeight.of(op, scratch.lookup, round_fp16)
        return None

    def _narrows(self, op: Any) -> bool:
        """Weight `op`'s one output is fp16 as runs compute it: its values fit fp16 exactly."""
        return len(op.outputs) == 1 and declared_dtype(op.outputs[0]) == np.float16 and \
            self.precision_model == "declared"

    def _decoded_fp16(self, op: Any, streamed: StreamedWeight | None, scratch: _Interpreter) -> np.ndarray:
        """The output of weight `op` as fp16 (`_narrows`), decoded once, a block of rows at a
        time where it streams (no float32 copy of the whole weight)."""
        if streamed is None:
            value = self._decoded(op, None, scratch)[0]
            return value if value.dtype == np.float16 else value.astype(np.float16)
        out = np.empty(streamed.shape, np.float16)
        step = max(streamed.row_step, (1 << 20) // max(1, streamed.size // max(1, streamed.shape[0])))
        step -= step % streamed.row_step
        block = np.empty((min(step, streamed.shape[0]), *streamed.shape[1:]), np.float32)
        scratch_rows = streamed.scratch()
        for start in range(0, streamed.shape[0], step):
            stop = min(streamed.shape[0], start + step)
            out[start:stop] = streamed.rows_into(start, stop, block[: stop - start], scratch_rows)
        return out

    def _decoded(self, op: Any, streamed: StreamedWeight | None, scratch: _Interpreter) -> list[Any]:
        """The outputs of constexpr `op`, computed once; a large fp16 one kept widened."""
        if streamed is not None:
            return [streamed.fill(np.empty(streamed.shape, np.float32))]
        chain = lut_chain(op) if op.op_type == "constexpr_blockwise_shift_scale" else None
        parts = split_chain(op) if op.op_type == "reshape" else ([chain, op] if chain is not None else [op])
        assert parts is not None
        for reader in parts:
            _unpack_inputs(reader, scratch.plan, {})
        with np.errstate(all="ignore"):
            for part in parts:  # a table lookup (or a split weight's tables and sums) for this op only
                scratch._execute(part)
        for part in parts[:-1]:
            scratch.env.pop(id(part.outputs[0]), None)
        values = []
        for var in op.outputs:
            value = scratch.env.pop(id(var))
            if isinstance(value, np.ndarray) and value.dtype == np.float16 and value.size >= WIDEN_MIN:
                value = widen(value)
            values.append(value)
        return values


def _load(path: str | os.PathLike[str], functions: Sequence[str] | None) -> Any:
    """The package's functions (`functions`, default every one) read straight from its protobuf
    (`rlx_mil.milexec.protoread`), or its pymil Program where that reader leaves it to
    coremltools' loader; 4-bit blobs as `FourBitCodes` stand-ins either way."""
    light = read_program(path, functions, packed_4bit=True)
    return light if light is not None else load_program(path, packed_4bit=True)


def _unpack_inputs(op: Any, plan: Plan | None, shared: dict[tuple[Any, ...], Any]) -> None:
    """Replace the `FourBitCodes` stand-ins `op` reads in `plan.consts` by their codes."""
    if plan is None:
        return
    for value in op.inputs.values():
        for var in value if isinstance(value, (list, tuple)) else [value]:
            held = plan.consts.get(id(var))
            if isinstance(held, FourBitCodes):
                key = ("unpacked", *_identity(held))
                if key not in shared:
                    shared[key] = held.unpacked()
                plan.consts[id(var)] = shared[key]
                plan.pinned.add(root_key(shared[key]))


def _unpack_stand_ins(function: Any, plan: Plan, shared: dict[tuple[Any, ...], Any]) -> None:
    """Every op a run executes reads codes, never a stand-in: those of the ops not computed
    when preparing (nested ones included) are unpacked once."""
    from rlx_mil.mil_walk import iter_ops

    for op in iter_ops(function):
        if op.op_type != "const" and id(op) not in plan.precomputed:
            _unpack_inputs(op, plan, shared)


class _Budget:
    """Bytes "fast" may still spend on float32 forms of weights."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, nbytes: int) -> bool:
        if self.used + nbytes > self.limit:
            return False
        self.used += nbytes
        return True


def _weights(function: Any) -> list[Any]:
    """The ops of `function` that hold weights, in program order: fp16 consts of at least
    WIDEN_MIN elements read by a non-constexpr op, and the top-level constexpr ops."""
    found = []
    split = {id(part) for op in function.operations if op.op_type == "reshape" for part in (split_chain(op) or [])}
    for op in function.operations:
        if id(op) in split:
            if op.op_type == "reshape" and split_chain(op) is not None:
                found.append(op)
        elif op.op_type == "const":
            var = op.outputs[0]
            value = var.val
            if (isinstance(value, np.ndarray) and value.dtype == np.float16 and value.size >= WIDEN_MIN
                    and not all(user.op_type.startswith("constexpr_") for user in var.child_ops)):
                found.append(op)
        elif op.op_type.startswith("constexpr_") and not _feeds_chain(op):
            found.append(op)
    return found


def _table_only(op: Any) -> bool:
    """A constexpr `op` whose one output is only the `lut` of iOS18 `constexpr_lut_to_dense`
    ops (a table of at most 2^8 entries per group: far smaller than the weight it decodes)."""
    users = op.outputs[0].child_ops if len(op.outputs) == 1 and op.op_type.startswith("constexpr_") else []
    return bool(users) and all(user.op_type == "constexpr_lut_to_dense" and user.inputs.get("lut") is op.outputs[0]
                               and user.inputs.get("indices") is not None for user in users)


def _feeds_chain(op: Any) -> bool:
    """A `constexpr_lut_to_dense` that is the first half of a LUT-then-scale weight."""
    users = op.outputs[0].child_ops if op.op_type == "constexpr_lut_to_dense" else []
    return len(users) == 1 and users[0].op_type == "constexpr_blockwise_shift_scale" and lut_chain(users[0]) is op


def _weight_key(op: Any, consts: Mapping[int, Any]) -> tuple[Any, ...]:
    """What identifies the weight constexpr `op` computes: its const inputs' memory (those of
    the LUT feeding a LUT-then-scale weight included)."""
    split = split_chain(op) if op.op_type == "reshape" else None
    if split is not None:
        return ("split", *[_identity(consts.get(id(v))) for part in split for v in part.inputs.values()])
    chain = lut_chain(op) if op.op_type == "constexpr_blockwise_shift_scale" else None
    parts = [_identity(consts.get(id(v))) for v in op.inputs.values()]
    if chain is not None:
        parts += [("chain",)] + [_identity(consts.get(id(v))) for v in chain.inputs.values()]
    return (op.op_type, *parts)


def _elements(op: Any) -> int:
    """Elements of the outputs of `op` (the static dims)."""
    total = 0
    for var in op.outputs:
        shape = [int(d) for d in var.shape if isinstance(d, (int, np.integer))]
        total += int(np.prod(shape, dtype=np.int64))
    return total


def _fp16_bytes(weights: list[list[Any]]) -> int:
    """fp16 bytes of every distinct weight of the functions."""
    seen: set[tuple[Any, ...]] = set()
    total = 0
    for ops in weights:
        for op in ops:
            if op.op_type == "const":
                key: tuple[Any, ...] = ("const", *_identity(op.outputs[0].val))
            else:
                key = _weight_key(op, {id(v): v.val for v in _const_inputs(op)})
            if key not in seen:
                seen.add(key)
                total += 2 * _elements(op)
    return total


def _const_inputs(op: Any) -> list[Any]:
    """The inputs of constexpr `op` (and of the LUT feeding a LUT-then-scale weight)."""
    split = split_chain(op) if op.op_type == "reshape" else None
    if split is not None:
        return [v for part in split for v in part.inputs.values()]
    chain = lut_chain(op) if op.op_type == "constexpr_blockwise_shift_scale" else None
    found = list(op.inputs.values())
    return found + (list(chain.inputs.values()) if chain is not None else [])


def _blas_limit(threads: int | None) -> Any:
    """A context that runs BLAS on `threads` threads (no-op for None)."""
    if threads is None:
        return contextlib.nullcontext()
    global _CONTROLLER
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=threads, user_api="blas")


_CONTROLLER: Any = None


def _identity(value: Any) -> tuple[Any, ...]:
    """The memory an array's values sit in (equal for the functions' shared weights)."""
    if not isinstance(value, np.ndarray):
        return (id(value),)
    return (value.__array_interface__["data"][0], value.shape, value.strides, value.dtype.str)


def _choose(memory: str, functions: Any) -> str:
    if memory != "auto":
        return memory
    weights = [_weights(resolved.function) for resolved in functions]
    compressed = any(op.op_type.startswith("constexpr_") for ops in weights for op in ops)
    # float32 forms of the weights up to the budget, the rest read from the mapped file or
    # decoded once into fp16 (a compressed one): the fp16 bytes past the budget, at most half.
    need = min(2 * _fp16_bytes(weights), int(FAST_CACHE_RATIO * _fp16_bytes(weights))) + _fp16_bytes(weights) // 2
    available = _available_bytes()
    if available is None or need <= available // 2:
        # Each weight decoded once per session: a compressed package runs about as fast as the
        # fp16 one (decoding per run cost an int4 0.6B decode step 1.97x the fp16 time).
        return "fast"
    return "compact" if compressed else "lean"


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
