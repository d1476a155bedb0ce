"""The final MIL program -> a Core AI module: every function becomes a graph (entry point) of
one module, its states become Core AI states, its consts and constexpr weights become Core AI
constants and compression ops, and every other op goes through its rule (`registry.RULES`).

Floats are held in `float_dtype` (float32 by default: Apple's Linux runtime accumulates fp16
matmuls in fp16, so an fp16 program is checked with fp32 compute); every integer dtype the
program declares stays, except int64 (held as int32, as Core ML does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_mil.coreai import adapter, weight_layout
from rlx_mil.coreai.registry import INEXPRESSIBLE, RULES, RuleContext
from rlx_mil.errors import CoreAITranslationError

#: fp16 and bf16 vars are held as this dtype unless the caller asks for another.
DEFAULT_FLOAT = np.dtype(np.float32)
#: fp16 constants of at least this many elements (weights) keep two bytes per value in the asset.
_FP16_STORED_FROM = 1024


def _fp16_tables() -> tuple[np.ndarray, np.ndarray]:
    """For each high byte of an fp16 bit pattern (sign, exponent, top two mantissa bits): A and
    B with value = A + B * low byte, exactly, in float32."""
    high = np.arange(256, dtype=np.uint16)
    sign = np.where(high & 0x80, -1.0, 1.0)
    exponent = (high >> 2) & 0x1F
    top = (high & 0x3).astype(np.float64)
    unit = np.where(exponent == 0, 2.0 ** -24, 2.0 ** (exponent.astype(np.float64) - 25))  # one low-mantissa step
    lead = np.where(exponent == 0, 0.0, 1024.0)  # the implicit leading bit, in steps
    a = sign * unit * (lead + top * 256)
    b = sign * unit
    special = exponent == 0x1F  # inf / NaN patterns (never weights): kept as such
    a = np.where(special, np.where(top == 0, sign * np.inf, np.nan), a)
    b = np.where(special, 0.0, b)
    return a.astype(np.float32), b.astype(np.float32)


def _fp16_weight(array: np.ndarray) -> Any:
    """An fp16 weight held as float32 but stored in two bytes per value: Core AI's
    pre-compilation would fold a cast of an fp16 constant into an fp32 one (twice the bytes),
    so the bit pattern's bytes are stored as 8-bit `lut_to_dense` codes and the value rebuilt as
    A[high] + B[high] * low (exact in float32)."""
    bits = np.ascontiguousarray(array).view(np.uint16)
    high, low = (bits >> 8).astype(np.uint8), (bits & 0xFF).astype(np.uint8)
    a, b = _fp16_tables()
    table_shape = [1] * array.ndim + [256, 1]
    high_codes, low_codes = adapter.constant(high), adapter.constant(low)
    axis = np.int16(0)
    lead = adapter.ops.lut_to_dense(high_codes, adapter.constant(a.reshape(table_shape)), axis)
    step = adapter.ops.lut_to_dense(high_codes, adapter.constant(b.reshape(table_shape)), axis)
    steps = adapter.ops.lut_to_dense(low_codes, adapter.constant(np.arange(256, dtype=np.float32).reshape(table_shape)), axis)
    return adapter.ops.broadcasting_add(lead, adapter.ops.broadcasting_mul(step, steps))


@dataclass
class EntryPoint:
    """One translated function: its interface as the Core AI graph declares it."""

    name: str
    inputs: dict[str, tuple[tuple[int, ...], np.dtype]] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    #: state name -> (shape, dtype)
    states: dict[str, tuple[tuple[int, ...], np.dtype]] = field(default_factory=dict)


@dataclass
class Translation:
    builder: adapter.ModuleBuilder
    entries: dict[str, EntryPoint]


def translate_program(program: Any, functions: Sequence[str] | None = None, *,
                      float_dtype: Any = DEFAULT_FLOAT, entry_names: Mapping[str, str] | None = None,
                      builder: adapter.ModuleBuilder | None = None) -> Translation:
    """Translate `functions` (default: all) of a MIL program (pymil or milexec's light program)
    into one Core AI module; `entry_names` renames entry points (function -> graph name)."""
    import rlx_mil.coreai.rules  # noqa: F401  (registers every rule)

    adapter.require()
    wanted = list(functions) if functions is not None else list(program.functions)
    missing = [name for name in wanted if name not in program.functions]
    if missing:
        raise CoreAITranslationError(f"the program has no function {missing[0]!r} (functions: {sorted(program.functions)})")
    for name in wanted:
        require_rules(program.functions[name])
    builder = builder or adapter.ModuleBuilder()
    entries: dict[str, EntryPoint] = {}
    for name in wanted:
        entry_name = (entry_names or {}).get(name, name)
        entries[entry_name] = FunctionTranslator(builder, program.functions[name], entry_name, np.dtype(float_dtype)).run()
    return Translation(builder, entries)


def require_rules(function: Any) -> None:
    """Raise one error listing every op type of `function` that has no rule, with why."""
    from rlx_mil.mil_walk import iter_ops

    absent: dict[str, str] = {}
    for op in iter_ops(function):
        if op.op_type != "const" and op.op_type not in RULES:
            absent.setdefault(op.op_type, INEXPRESSIBLE.get(op.op_type, "no Core AI rule yet"))
    if absent:
        listed = "; ".join(f"{op_type} ({why})" for op_type, why in sorted(absent.items()))
        raise CoreAITranslationError(f"the program has ops Core AI cannot express here: {listed}")


def _is_state(var: Any) -> bool:
    from coremltools.converters.mil.mil import types

    return bool(types.is_state(var.sym_type))


class FunctionTranslator:
    def __init__(self, builder: adapter.ModuleBuilder, function: Any, entry_name: str, float_dtype: np.dtype) -> None:
        self.builder = builder
        self.function = function
        self.entry_name = entry_name
        self.float_dtype = float_dtype
        self.env: dict[int, Any] = {}
        #: state name -> its current value (read_state reads it, coreml_update_state sets it).
        self.state_values: dict[str, Any] = {}
        self.state_of_var: dict[int, str] = {}
        #: ids of the values that are graph arguments or constants (not made by an op).
        self.plain: set[int] = set()
        self.symbols: dict[Any, int] = {}
        #: ids of the vars read as `x @ W^T` weights, and their transposed values once made.
        self.linear_weights: set[int] = weight_layout.weight_vars(function)
        self._transposed: dict[int, Any] = {}

    # -- dtypes ---------------------------------------------------------------------------------
    def held_dtype(self, var: Any) -> np.dtype:
        from coremltools.converters.mil.mil import types

        sym = var.sym_type
        if types.is_state(sym):
            sym = sym.wrapped_type()
        primitive = sym.get_primitive() if types.is_tensor(sym) else sym
        try:
            dtype = np.dtype(types.nptype_from_builtin(primitive))
        except (KeyError, TypeError) as err:
            raise CoreAITranslationError(f"var '{var.name}' has a type Core AI cannot hold ({sym})") from err
        if dtype.metadata:
            dtype = np.dtype(dtype.str)
        if dtype.kind == "f":
            return self.float_dtype
        if dtype == np.int64:
            return np.dtype(np.int32)
        if dtype == np.uint64:
            return np.dtype(np.uint32)
        return dtype

    @staticmethod
    def shape(var: Any) -> tuple[int, ...]:
        return tuple(int(d) if isinstance(d, (int, np.integer)) else -1 for d in var.shape)

    # -- values ---------------------------------------------------------------------------------
    def const_value(self, var: Any) -> Any:
        """The value of a var a `const` op produces (None for any other var)."""
        op = getattr(var, "op", None)
        if op is None or op.op_type != "const":
            return None
        return var.val

    def value(self, var: Any) -> Any:
        key = id(var)
        if key in self.env:
            return self.env[key]
        if key in self.state_of_var:
            return self.state_values[self.state_of_var[key]]
        val = self.const_value(var)
        if val is None:
            raise CoreAITranslationError(f"var '{var.name}' is used before it is defined")
        if isinstance(val, str):
            raise CoreAITranslationError(f"var '{var.name}' is a string; only ops read strings as parameters")
        value = self.stored_constant(np.asarray(val), self.held_dtype(var))
        self.env[key] = value
        return value

    def stored_constant(self, array: np.ndarray, dtype: np.dtype) -> Any:
        """A constant held as `dtype`; a large fp16 one keeps two bytes per value."""
        if array.dtype == np.float16 and dtype == np.float32 and array.size >= _FP16_STORED_FROM:
            return _fp16_weight(array)
        value = adapter.constant(array.astype(dtype, copy=False))
        self.plain.add(id(value))
        return value

    def transposed_weight(self, var: Any) -> Any | None:
        """W^T of a weight var read as `x @ W^T`, transposed at translation time
        (`weight_layout`); None when it cannot be (the caller transposes activations)."""
        if id(var) not in self.linear_weights:
            return None
        if id(var) not in self._transposed:
            self._transposed[id(var)] = weight_layout.transposed(self, var)
        return self._transposed[id(var)]

    def bind(self, var: Any, value: Any) -> None:
        self.env[id(var)] = value

    # -- walking --------------------------------------------------------------------------------
    def run(self) -> EntryPoint:
        entry = EntryPoint(self.entry_name)
        inputs = []
        for name, var in self.function.inputs.items():
            shape, dtype = self.shape(var), self.held_dtype(var)
            inputs.append((name, shape, dtype))
            if _is_state(var):
                entry.states[name] = (shape, dtype)
            else:
                entry.inputs[name] = (shape, dtype)
        with self.builder.graph(self.entry_name, inputs) as scope:
            for (name, var), argument in zip(self.function.inputs.items(), scope.arguments, strict=True):
                if _is_state(var):
                    self.state_of_var[id(var)] = name
                    self.state_values[name] = argument
                else:
                    self.bind(var, argument)
                self.plain.add(id(argument))
            self.run_ops(self.function.operations)
            outputs = {var.name: self.output_value(var) for var in self.function.outputs}
            entry.outputs = list(outputs)
            updates = {name: (f"{name}__updated", value) for name, value in self.state_values.items()}
            scope.finish(outputs, updates)
        return entry

    def output_value(self, var: Any) -> Any:
        value = self.value(var)
        if id(value) not in self.plain:
            return value
        # An output that is a graph input or a constant gets an op of its own (an output
        # must be produced inside the graph).
        zero = adapter.constant(np.zeros((), dtype=_numpy_of(value)))
        if _numpy_of(value) == np.bool_:
            return adapter.ops.broadcasting_or(value, adapter.constant(np.zeros((), np.bool_)))
        return adapter.ops.broadcasting_add(value, zero)

    def run_ops(self, operations: Sequence[Any]) -> None:
        for op in operations:
            if op.op_type == "const":
                continue
            rule = RULES[op.op_type]
            try:
                result = rule(RuleContext(self, op))
            except CoreAITranslationError:
                raise
            except Exception as err:  # a Core AI builder refused what the rule built
                raise CoreAITranslationError(f"op '{op.name}' ({op.op_type}): Core AI refused it: {err}") from err
            results = result if isinstance(result, (tuple, list)) else (result,)
            if len(results) != len(op.outputs):
                raise CoreAITranslationError(
                    f"op '{op.name}' ({op.op_type}): the rule made {len(results)} values for {len(op.outputs)} outputs")
            for var, value in zip(op.outputs, results, strict=True):
                self.bind(var, value)

    def run_block(self, block: Any, block_inputs: Sequence[Any]) -> list[Any]:
        """Translate a nested block (a loop body, a branch) at the current insertion point."""
        for var, value in zip(block.inputs, block_inputs, strict=True):
            self.bind(var, value)
        self.run_ops(block.operations)
        return [self.value(var) for var in block.outputs]


def _numpy_of(value: Any) -> Any:
    from rlx_mil.coreai.registry import numpy_dtype

    return numpy_dtype(value)
