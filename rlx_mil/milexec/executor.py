"""The interpreter: walks a MIL Function op by op, calling one NumPy kernel per op.

Precision model (see the package docstring and docs/milexec.md): every value is stored in the
dtype the program declares for it, so an fp16 var holds an fp16-rounded array (overflow to inf,
underflow to 0, NaN all show where they happen); each op computes in float32 from those stored
values and its result is rounded to its declared output dtype.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from rlx_mil import interrupts
from rlx_mil.coreml.output_pieces import assemble
from rlx_mil.errors import MilExecError
from rlx_mil.input_contract import range_problem
from rlx_mil.ir.shape import MAX_TENSOR_ELEMENTS
from rlx_mil.ir.values import BFLOAT16, numeric_kind
from rlx_mil.mil_walk import iter_ops, oversized_outputs
from rlx_mil.milexec.crosscheck import CrossChecker, Tolerance
from rlx_mil.milexec.loader import IONames, ResolvedSource, release, resolve_source
from rlx_mil.milexec.plan import Plan, build_plan, root_key
from rlx_mil.milexec.protoread import read_model
from rlx_mil.milexec.registry import KERNELS, OpContext, declared_dtype
from rlx_mil.milexec.streamed import materialize
from rlx_mil.progress import counting, expect, tick

#: The unit a running stage counts the ops of a run in (`convert --verify`'s bar).
OPS = " ops"

if TYPE_CHECKING:
    from coremltools.converters.mil.mil import Block, Operation, Var

PrecisionModel = Literal["declared", "float32"]
PRECISION_MODELS: tuple[str, ...] = ("declared", "float32")


@dataclass
class ExecutionResult:
    """Everything one run produced.

    outputs: caller-facing outputs (float as float32, bool as bool, ints as int32/int64).
    values: every var's stored value by var name (only with `keep_values=True`), in the stored
        dtype (fp16 vars as fp16 under the "declared" precision model).
    states: final value of every state, in its declared dtype (fp16).
    nonfinite_origins: ops (as "name (op_type)") whose float output holds inf/NaN although all of
        their float inputs were finite, in execution order: where overflow or NaN started.
    cross_checked / cross_check_skipped: ops compared with coremltools' value_inference, and the
        ops that could not be (with the reason), when cross-checking was on.
    seconds_by_op_type: wall time spent in each op type's kernel.
    """

    outputs: dict[str, np.ndarray]
    function_name: str
    precision_model: str
    states: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, np.ndarray] = field(default_factory=dict)
    nonfinite_origins: list[str] = field(default_factory=list)
    cross_checked: list[str] = field(default_factory=list)
    cross_check_skipped: dict[str, str] = field(default_factory=dict)
    seconds_by_op_type: dict[str, float] = field(default_factory=dict)


def execute(
    source: Any,
    inputs: Mapping[str, Any],
    *,
    function_name: str | None = None,
    states: MutableMapping[str, np.ndarray] | None = None,
    precision_model: PrecisionModel = "declared",
    cross_check: bool = False,
    cross_check_tolerances: Mapping[Any, Tolerance] | None = None,
    keep_values: bool = False,
    io_names: Mapping[str, Any] | IONames | None = None,
) -> ExecutionResult:
    """Run `source` on `inputs` and return the full :class:`ExecutionResult`.

    See `rlx_mil.milexec.run` for the arguments.
    """
    import rlx_mil.milexec.kernels  # noqa: F401  (registers every kernel)

    if precision_model not in PRECISION_MODELS:
        raise MilExecError(f"unknown precision_model {precision_model!r}; use one of {PRECISION_MODELS}")
    # A package is read straight from its protobuf unless cross-checked (that needs pymil ops).
    resolved = resolve_source(source, function_name, io_names, None if cross_check else read_model)
    checker = CrossChecker(cross_check_tolerances) if cross_check else None
    # A run that keeps or cross-checks every value holds them all and writes nothing in place.
    plan = None if keep_values or checker is not None else build_plan(resolved.function)
    interpreter = _Interpreter(precision_model, checker, keep_values, plan)
    return interpreter.run(resolved, inputs, states)


class _Interpreter:
    def __init__(
        self,
        precision: str,
        checker: CrossChecker | None,
        keep_values: bool,
        plan: Plan | None = None,
        *,
        track_nonfinite: bool = True,
        states_in_place: bool = False,
    ) -> None:
        self.precision = precision
        self.checker = checker
        self.keep_values = keep_values
        self.plan = plan
        self.track_nonfinite = track_nonfinite
        self.states_in_place = states_in_place
        #: root_key -> number of live env values in that buffer (only with a plan).
        self.roots: dict[int, int] = {}
        self.meta = plan.meta if plan is not None else {}
        #: id(op) -> the op's inputs by name, built once (coremltools rebuilds `op.inputs` per access).
        self.op_inputs: dict[int, dict[str, Any]] = plan.inputs if plan is not None else {}
        self.env: dict[int, Any] = {}
        self.finite: dict[int, bool] = {}
        self.state_values: dict[str, np.ndarray] = {}
        self.state_names: dict[int, str] = {}
        self.values: dict[str, np.ndarray] = {}
        self.nonfinite_origins: list[str] = []
        self.seconds: dict[str, float] = {}

    # -- entry ------------------------------------------------------------------------------
    def run(
        self,
        resolved: ResolvedSource,
        inputs: Mapping[str, Any],
        states: MutableMapping[str, np.ndarray] | None,
    ) -> ExecutionResult:
        interrupts.check()  # a Ctrl-C a library swallowed stops the next run
        function = resolved.function
        if self.plan is None or not self.plan.checked:
            _require_kernels(function)
            _require_addressable(function)
        feeds, state_feeds = _bind_inputs(
            function, inputs, states, resolved.io_names, self.precision, resolved.input_ranges, self.states_in_place
        )
        try:
            for var, value in feeds:
                self._bind(var, value)
            for var, value in state_feeds:
                self.state_values[var.name] = value
                self.state_names[id(var)] = var.name
            with np.errstate(all="ignore"):
                outputs = self.run_block(function, None)
        finally:
            if self.checker is not None:
                self.checker.restore()

        output_names = resolved.io_names.outputs if resolved.io_names else {}
        result: dict[str, np.ndarray] = {}
        for var, value in zip(function.outputs, outputs, strict=True):
            key = output_names.get(var.name, var.name)
            result[key] = _for_caller(value)
        if resolved.output_pieces:
            result = assemble(result, resolved.output_pieces)
        if states is not None:
            for name, value in self.state_values.items():
                states[name] = value
        return ExecutionResult(
            outputs=result,
            function_name=resolved.function_name,
            precision_model=self.precision,
            states=dict(self.state_values),
            values=self.values,
            nonfinite_origins=self.nonfinite_origins,
            cross_checked=list(self.checker.checked) if self.checker else [],
            cross_check_skipped=dict(self.checker.skipped) if self.checker else {},
            seconds_by_op_type=self.seconds,
        )

    # -- blocks -----------------------------------------------------------------------------
    def run_block(self, block: Block, block_inputs: Sequence[np.ndarray] | None) -> list[np.ndarray]:
        if block_inputs is not None:
            if len(block_inputs) != len(block.inputs):
                raise MilExecError(
                    f"block '{block.name}' takes {len(block.inputs)} inputs, got {len(block_inputs)}"
                )
            for var, value in zip(block.inputs, block_inputs, strict=True):
                self._bind(var, value)
        plan = self.plan if block_inputs is None else None  # liveness covers the top-level block
        count = block_inputs is None and counting(OPS)  # a stage's bar counts the run's ops
        if count:
            expect(OPS, sum(op.op_type != "const" and (plan is None or id(op) not in plan.precomputed)
                            for op in block.operations))
        for op in block.operations:
            if op.op_type == "const" or (plan is not None and id(op) in plan.precomputed):
                continue
            self._execute(op)
            if count:
                tick(OPS)
            if plan is not None:
                for var in plan.free_after.get(id(op), ()):
                    self._drop(var)
                for weight in plan.release_after.get(id(op), ()):
                    release(weight)
        return [materialize(self.lookup(var)) for var in block.outputs]

    def _store(self, var: Var, value: Any) -> None:
        key = id(var)
        if self.plan is not None:
            if key in self.env:
                self._drop(var)
            if isinstance(value, np.ndarray):
                root = root_key(value)
                self.roots[root] = self.roots.get(root, 0) + 1
        self.env[key] = value

    def _drop(self, var: Var) -> None:
        value = self.env.pop(id(var), None)
        if isinstance(value, np.ndarray):
            root = root_key(value)
            left = self.roots.get(root, 0) - 1
            if left > 0:
                self.roots[root] = left
            else:
                self.roots.pop(root, None)

    def donatable(self, op: Operation, var: Var) -> bool:
        """May `op` write into `var`'s buffer? See `Plan` and `OpContext.donatable`."""
        plan = self.plan
        if plan is None or plan.last_user.get(id(var)) != id(op):
            return False
        value = self.env.get(id(var))
        if not isinstance(value, np.ndarray) or not value.flags.writeable:
            return False
        root = root_key(value)
        return root not in plan.pinned and self.roots.get(root) == 1

    def lookup(self, var: Var) -> Any:
        key = id(var)
        if key in self.env:
            return self.env[key]
        if self.plan is not None and key in self.plan.consts:
            return self.plan.consts[key]
        if key in self.state_names:
            return self.state_values[self.state_names[key]]
        producer = var.op
        if producer is not None and producer.op_type == "const":
            value = var.val
            stored = value if isinstance(value, str) else self._coerce(var, np.asarray(value), None)
            self.env[key] = stored
            return stored
        raise MilExecError(f"var '{var.name}' is used before any op produced it")

    def _bind(self, var: Var, value: np.ndarray) -> None:
        stored = self._coerce(var, value, None)
        self._store(var, stored)
        if self.track_nonfinite:
            self.finite[id(var)] = _all_finite(stored)
        if self.keep_values:
            self.values[var.name] = stored
        if self.checker is not None:
            self.checker.attach(var, stored)

    # -- ops --------------------------------------------------------------------------------
    def _execute(self, op: Operation) -> None:
        fn = KERNELS.get(op.op_type)
        if fn is None:
            raise MilExecError(
                f"no milexec kernel for op type '{op.op_type}' (op '{op.name}'); "
                f"add one with @kernel({op.op_type!r}) in rlx_mil.milexec.kernels"
            )
        inputs = self.op_inputs.get(id(op))
        if inputs is None:
            inputs = self.op_inputs[id(op)] = dict(op.inputs)
        ctx = OpContext(
            op, self.lookup, self.run_block, self.state_values, self.donatable,
            self.plan.shared_states if self.plan is not None else frozenset(), inputs,
        )
        start = time.perf_counter()
        try:
            produced = fn(ctx)
        except MilExecError:
            raise
        except Exception as exc:
            raise MilExecError(
                f"op '{op.name}' ({op.op_type}) failed in its milexec kernel: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            self.seconds[op.op_type] = self.seconds.get(op.op_type, 0.0) + time.perf_counter() - start
        results = list(produced) if isinstance(produced, tuple) else [produced]
        if len(results) != len(op.outputs):
            raise MilExecError(
                f"op '{op.name}' ({op.op_type}): kernel returned {len(results)} values for "
                f"{len(op.outputs)} outputs"
            )
        stored = [
            self._coerce(var, np.asarray(value), op) for var, value in zip(op.outputs, results, strict=True)
        ]
        if self.checker is not None:
            self.checker.check(op, stored, self.lookup)
        outputs_finite = True
        for var, value in zip(op.outputs, stored, strict=True):
            self._store(var, value)
            if self.track_nonfinite:
                self.finite[id(var)] = finite = _all_finite(value)
                outputs_finite = outputs_finite and finite
            if self.keep_values:
                self.values[var.name] = value
            if self.checker is not None:
                self.checker.attach(var, value)
        if not outputs_finite and all(self._is_finite(v) for v in _flat_inputs(op)):
            self.nonfinite_origins.append(f"{op.name} ({op.op_type})")

    def _is_finite(self, var: Var) -> bool:
        key = id(var)
        if key not in self.finite:
            value = self.lookup(var)
            self.finite[key] = _all_finite(value)
        return self.finite[key]

    def _coerce(self, var: Var, value: np.ndarray, op: Operation | None) -> np.ndarray:
        """Round `value` to `var`'s declared dtype (per the precision model), check its shape."""
        meta = self.meta.get(id(var))
        if meta is None:
            meta = self.meta[id(var)] = (declared_dtype(var), tuple(var.shape))
        dtype, declared = meta
        if dtype is None:
            return value
        if dtype == np.float16 and self.precision == "float32":
            dtype = np.dtype(np.float32)
        if value.dtype != dtype:
            with np.errstate(all="ignore"):
                value = value.astype(dtype)
        if value.shape != declared:
            if not declared and value.size == 1:
                value = value.reshape(())
            # A negative declared dim is one coremltools could not size (topk with k=-1 says -1).
            elif len(declared) != value.ndim or any(
                _is_static(d) and 0 <= int(d) != n for d, n in zip(declared, value.shape, strict=True)
            ):
                where = f"op '{op.name}' ({op.op_type})" if op is not None else f"var '{var.name}'"
                raise MilExecError(
                    f"{where}: computed shape {value.shape} for '{var.name}' does not match its declared "
                    f"shape {_shape_text(declared)}"
                )
        return value


def _require_addressable(function: Any) -> None:
    """Refuse up front a program with a tensor beyond MAX_TENSOR_ELEMENTS rather than
    allocating it (a hostile or hand-built package can declare any shape)."""
    for op, var, count in oversized_outputs(function, MAX_TENSOR_ELEMENTS):
        raise MilExecError(
            f"op '{op.name}' ({op.op_type}): output '{var.name}' {_shape_text(tuple(var.shape))} holds {count}"
            f" elements, more than the limit of {MAX_TENSOR_ELEMENTS}; refusing to allocate it"
        )


def _require_kernels(function: Any) -> None:
    """Refuse up front a program holding op types without a kernel, naming each type's ops."""
    missing: dict[str, list[str]] = {}
    for op in iter_ops(function):
        if op.op_type != "const" and op.op_type not in KERNELS:
            missing.setdefault(op.op_type, []).append(op.name)
    if missing:
        lines = [
            f"op type '{op_type}' (op{'s' if len(names) > 1 else ''} {', '.join(repr(n) for n in names[:3])}"
            f"{', ...' if len(names) > 3 else ''})"
            for op_type, names in sorted(missing.items())
        ]
        raise MilExecError(
            "no milexec kernel for:\n  - "
            + "\n  - ".join(lines)
            + "\nadd kernels with @kernel('<op_type>') in rlx_mil.milexec.kernels"
        )


# -- inputs and outputs -----------------------------------------------------------------------
def _bind_inputs(
    function: Any,
    inputs: Mapping[str, Any],
    states: Mapping[str, np.ndarray] | None,
    io_names: IONames | None,
    precision: str,
    ranges: Mapping[str, tuple[int, int]] | None = None,
    states_in_place: bool = False,
) -> tuple[list[tuple[Any, np.ndarray]], list[tuple[Any, np.ndarray]]]:
    from coremltools.converters.mil.mil import types

    placeholders: dict[str, Any] = dict(function.inputs)
    state_vars = {n: v for n, v in placeholders.items() if types.is_state(v.sym_type)}
    tensor_vars = {n: v for n, v in placeholders.items() if n not in state_vars}
    ir_to_mil = {ir: mil for mil, ir in (io_names.inputs.items() if io_names else ())}
    if not isinstance(inputs, Mapping):
        raise MilExecError(f"inputs must map input names to arrays, got {type(inputs).__name__}")
    # An IR name can equal another input's interface name ("a.b" becomes "a_b" beside an input
    # named "a_b", which becomes "a_b_1"): when every key is an IR name, read them all as such.
    by_ir_name = bool(ir_to_mil) and all(key in ir_to_mil for key in inputs)

    problems: list[str] = []
    given: dict[str, tuple[str, Any]] = {}
    for key, value in inputs.items():
        mil = ir_to_mil.get(key) if by_ir_name else (key if key in tensor_vars else ir_to_mil.get(key))
        if mil is None or mil not in tensor_vars:
            problems.append(f"unexpected input '{key}' (model inputs: {_names_text(tensor_vars, io_names)})")
            continue
        if mil in given:
            problems.append(f"input '{mil}' given twice (as '{given[mil][0]}' and '{key}')")
            continue
        given[mil] = (key, value)
    for mil in tensor_vars:
        if mil not in given:
            label = _label(mil, io_names)
            problems.append(f"missing input {label}")

    symbols: dict[Any, tuple[int, str]] = {}
    feeds: list[tuple[Any, np.ndarray]] = []
    for mil, (key, value) in given.items():
        var = tensor_vars[mil]
        array, problem = _as_array(value)
        if problem is None and array.ndim == 0 and tuple(var.shape) == (1,):
            # Core ML has no rank-0 inputs: a converted scalar input is a [1] placeholder.
            array = array.reshape(1)
        # The shape first: a huge feed for a small input is refused before it is cast.
        if problem is None:
            problem = _shape_problem(array.shape, tuple(var.shape), symbols, key)
        if problem is None:
            array, problem = _convert_input(array, var, precision)
        if problem is None and ranges and mil in ranges:
            # What the reference refuses (a token id of -1, a cache_position past the cache),
            # Core ML would wrap around or write nowhere: the model declares the range.
            problem = range_problem(array, ranges[mil])
        if problem is not None:
            problems.append(f"input '{key}': {problem}")
            continue
        feeds.append((var, array))

    state_feeds: list[tuple[Any, np.ndarray]] = []
    if states is not None and not isinstance(states, Mapping):
        raise MilExecError(f"states must map state names to arrays, got {type(states).__name__}")
    provided = dict(states or {})
    for name, var in state_vars.items():
        dtype = declared_dtype(var) or np.dtype(np.float16)
        if dtype == np.float16 and precision == "float32":
            dtype = np.dtype(np.float32)  # the float32 model keeps states unrounded too
        if not all(_is_static(d) for d in var.shape):
            problems.append(f"state '{name}' has a symbolic shape {_shape_text(tuple(var.shape))}")
            continue
        shape = tuple(int(d) for d in var.shape)
        if name in provided:
            array, problem = _as_array(provided.pop(name))
            if problem is not None:
                problems.append(f"state '{name}': {problem}")
                continue
            if array.shape != shape:
                problems.append(f"state '{name}': shape {array.shape}, expected {shape}")
                continue
            in_place = (states_in_place and array.dtype == dtype and array.flags.writeable
                        and array.flags.c_contiguous and isinstance(array, np.ndarray))
            state_feeds.append((var, array if in_place else array.astype(dtype)))
        else:
            # A fresh Core ML state buffer: zeros.
            state_feeds.append((var, np.zeros(shape, dtype=dtype)))
    for name in provided:
        problems.append(f"unexpected state '{name}' (model states: {sorted(state_vars) or 'none'})")

    if problems:
        raise MilExecError("bad inputs for the MIL program:\n  - " + "\n  - ".join(problems))
    return feeds, state_feeds


def _as_array(value: Any) -> tuple[np.ndarray, str | None]:
    """`value` as an array without copying an ndarray, refusing non-numeric ones."""
    try:
        array = np.asarray(value)
    except Exception as exc:
        return np.zeros(()), f"cannot be read as an array ({exc})"
    if numeric_kind(array.dtype) is None:
        return array, f"dtype {array.dtype} is not numeric"
    return array, None


def _convert_input(array: np.ndarray, var: Any, precision: str) -> tuple[np.ndarray, str | None]:
    """A numeric feed of the right shape cast to its placeholder's dtype (range-checked)."""
    dtype = declared_dtype(var)
    if dtype is None:
        return array, f"placeholder has unsupported type {var.sym_type}"
    if dtype.kind in "iu":
        if numeric_kind(array.dtype) == "f":
            array = array.astype(np.float64) if array.dtype == BFLOAT16 else array
            if not np.all(np.isfinite(array)) or not np.array_equal(array, np.round(array)):
                return array, f"holds non-integer values but the model input is {dtype}"
        info = np.iinfo(dtype)
        if array.size and (array.min() < info.min or array.max() > info.max):
            return array, f"values outside the range of {dtype}"
    if dtype == np.float16 and precision == "float32":
        dtype = np.dtype(np.float32)
    with np.errstate(all="ignore"):
        return array.astype(dtype), None


def _shape_problem(
    actual: tuple[int, ...], declared: tuple[Any, ...], symbols: dict[Any, tuple[int, str]], key: str
) -> str | None:
    if len(actual) != len(declared):
        return f"rank {len(actual)} (shape {actual}), expected shape {_shape_text(declared)}"
    for axis, (n, d) in enumerate(zip(actual, declared, strict=True)):
        if _is_static(d):
            if n != int(d):
                return f"shape {actual}, expected {_shape_text(declared)}"
            continue
        seen = symbols.get(d)
        if seen is not None and seen[0] != n:
            return f"dim {axis} is {n} but the same symbolic dim '{d}' is {seen[0]} in input '{seen[1]}'"
        symbols.setdefault(d, (n, key))
    return None


def _for_caller(value: Any) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind == "f":
        return array.astype(np.float32)
    if array.dtype.kind == "b":
        return array.astype(bool)
    if array.dtype.kind in "iu":
        return array.astype(np.int64 if array.dtype == np.int64 else np.int32)
    return array


def _flat_inputs(op: Operation) -> list[Var]:
    flat: list[Var] = []
    for value in op.inputs.values():
        if isinstance(value, (list, tuple)):
            flat.extend(value)
        else:
            flat.append(value)
    return flat


def _all_finite(value: Any) -> bool:
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return bool(np.isfinite(value).all())
    return True


def _is_static(dim: Any) -> bool:
    return isinstance(dim, (int, np.integer))


def _shape_text(shape: tuple[Any, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _label(mil: str, io_names: IONames | None) -> str:
    ir = io_names.inputs.get(mil) if io_names else None
    return f"'{ir}' (model input '{mil}')" if ir and ir != mil else f"'{mil}'"


def _names_text(tensor_vars: Mapping[str, Any], io_names: IONames | None) -> str:
    return ", ".join(_label(n, io_names) for n in tensor_vars) or "none"
