"""Rule registry of the Core AI translator: one rule per MIL op type (as milexec has one kernel
per op type), in `rules/<family>.py`.

A rule receives a :class:`RuleContext` and returns one Core AI value per output of the op (a
single value, or a tuple for multi-output ops). Rules build with `ctx.ops` (the raw op
builders the adapter hands out) and never import `coreai` themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from rlx_mil.coreai import adapter
from rlx_mil.errors import CoreAITranslationError

RuleResult = Any
Rule = Callable[["RuleContext"], RuleResult]

#: op type -> rule. Filled by the `rule` decorator when `rlx_mil.coreai.rules` is imported.
RULES: dict[str, Rule] = {}

#: op type -> why no Core AI program can express it (listed in the coverage doc).
INEXPRESSIBLE: dict[str, str] = {}


def rule(*op_types: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for op_type in op_types:
            if op_type in RULES:
                raise CoreAITranslationError(f"a Core AI rule for op type {op_type!r} is already registered")
            RULES[op_type] = fn
        return fn

    return register


def inexpressible(op_type: str, reason: str) -> None:
    INEXPRESSIBLE[op_type] = reason


class Translator(Protocol):
    """What rules use of the translator (`rlx_mil.coreai.translate.FunctionTranslator`)."""

    float_dtype: np.dtype
    state_of_var: dict[int, str]
    state_values: dict[str, Any]
    #: MIL's symbolic dims (a loop body's slices at the loop counter) -> the static size the
    #: translated value has (`RuleContext.in_shape` learns them; `out_shape` uses them).
    symbols: dict[Any, int]

    def value(self, var: Any) -> Any: ...

    def const_value(self, var: Any) -> Any: ...

    def held_dtype(self, var: Any) -> np.dtype: ...

    def bind(self, var: Any, value: Any) -> None: ...

    def run_block(self, block: Any, block_inputs: Sequence[Any]) -> list[Any]: ...

    def transposed_weight(self, var: Any) -> Any | None: ...

    def stored_constant(self, array: np.ndarray, dtype: np.dtype) -> Any: ...


class RuleContext:
    """What a rule sees of one MIL op: its inputs as Core AI values or const values, its
    declared outputs, and the translator (for nested blocks)."""

    ops: Any = adapter.ops

    def __init__(self, translator: Translator, op: Any) -> None:
        self.translator = translator
        self.op = op
        self._inputs: dict[str, Any] = dict(op.inputs)

    @property
    def op_type(self) -> str:
        return str(self.op.op_type)

    def fail(self, message: str) -> CoreAITranslationError:
        return CoreAITranslationError(f"op '{self.op.name}' ({self.op_type}): {message}")

    # -- inputs ---------------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        return self._inputs.get(name) is not None

    def var(self, name: str) -> Any:
        var = self._inputs.get(name)
        if var is None:
            raise self.fail(f"required input '{name}' is missing")
        return var

    def v(self, name: str) -> Any:
        """Input `name` as a Core AI value (a const becomes a Core AI constant)."""
        return self.translator.value(self.var(name))

    def vs(self, name: str) -> list[Any]:
        var = self.var(name)
        return [self.translator.value(v) for v in (var if isinstance(var, (tuple, list)) else (var,))]

    def is_const(self, name: str) -> bool:
        return self.has(name) and self.translator.const_value(self.var(name)) is not None

    def const(self, name: str, default: Any = None) -> Any:
        """Input `name`'s const value as numpy (or a str); `default` when absent. A non-const
        input is an error: the rule needs it at translation time."""
        if not self.has(name):
            return default
        value = self.translator.const_value(self.var(name))
        if value is None:
            raise self.fail(f"input '{name}' must be a constant")
        return value

    def param(self, name: str, default: Any = None) -> Any:
        value = self.const(name, default)
        if isinstance(value, (str, bool, int, float)) or value is None:
            return value
        arr = np.asarray(value)
        if arr.dtype.kind in "US":
            return str(arr.item())
        return arr.item() if arr.ndim == 0 else arr.tolist()

    def ints(self, name: str, default: Sequence[int] | None = None) -> list[int]:
        if not self.has(name):
            if default is None:
                raise self.fail(f"required input '{name}' is missing")
            return list(default)
        return [int(v) for v in np.asarray(self.const(name)).reshape(-1)]

    def in_shape(self, name: str) -> tuple[int, ...]:
        """Input `name`'s shape: as MIL declares it, except that a symbolic dim whose translated
        value is static (a slice at a loop counter has a fixed extent) takes that size; the
        symbol's size is remembered for the shapes MIL derived from it."""
        var = self.var(name)
        declared = self._resolved(var.shape)
        if all(d >= 0 for d in declared) or isinstance(var, (tuple, list)):
            return declared
        try:
            actual = adapter.shape_of(self.translator.value(var))
        except CoreAITranslationError:
            return declared
        if len(actual) != len(declared) or any(a < 0 for a in actual) or any(
                d >= 0 and d != a for d, a in zip(declared, actual, strict=True)):
            return declared
        for dim, size in zip(var.shape, actual, strict=True):
            if not isinstance(dim, (int, np.integer)):
                self.translator.symbols[dim] = size
        return actual

    def _resolved(self, dims: Sequence[Any]) -> tuple[int, ...]:
        return tuple(self._dim(d) for d in dims)

    def _dim(self, dim: Any) -> int:
        """A static dim, or a symbolic one (a sympy symbol or expression such as `is31/3`)
        whose symbols are known; else -1."""
        if isinstance(dim, (int, np.integer)):
            return int(dim)
        known = self.translator.symbols
        if dim in known:
            return known[dim]
        free = getattr(dim, "free_symbols", None)
        if not free or not known or not set(free) <= set(known):
            return -1
        size = dim.subs({symbol: known[symbol] for symbol in free})
        return int(size) if getattr(size, "is_integer", False) and int(size) >= 0 else -1

    def rank(self, name: str) -> int:
        return len(self.var(name).shape)

    # -- outputs --------------------------------------------------------------------------------
    def out_shape(self, index: int = 0) -> tuple[int, ...]:
        """Output `index`'s declared shape (-1 for a dynamic dim), its symbolic dims resolved as
        far as `in_shape` learned them."""
        return self._resolved(self.op.outputs[index].shape)

    def out_dtype(self, index: int = 0) -> np.dtype:
        return self.translator.held_dtype(self.op.outputs[index])

    # -- building helpers -----------------------------------------------------------------------
    def constant(self, value: Any, dtype: Any = None) -> Any:
        array = np.asarray(value, dtype=dtype)
        return adapter.constant(array)

    def scalar(self, value: float, like: Any) -> Any:
        """A rank-0 constant of `like`'s element type."""
        array = np.asarray(value, dtype=numpy_dtype(like))
        return adapter.constant(array.reshape(()) if array.size == 1 else array)

    def reshape(self, value: Any, shape: Sequence[int]) -> Any:
        actual = adapter.shape_of(value)
        if actual == tuple(shape):
            return value
        if any(d < 0 for d in shape):
            # A partly known shape the value's static one agrees with: nothing to reshape.
            if len(actual) == len(shape) and all(a >= 0 and d in (-1, a) for d, a in zip(shape, actual, strict=True)):
                return value
            raise self.fail("a reshape to a dynamic shape is not supported")
        return self.ops.reshape(value, np.asarray(list(shape), np.int32))

    def cast(self, value: Any, dtype: Any) -> Any:
        if numpy_dtype(value) == np.dtype(dtype):
            return value
        return self.ops.cast(value, np.dtype(dtype).type)


_ELEMENT_DTYPES = {"f32": np.float32, "f16": np.float16, "si32": np.int32, "si16": np.int16, "si8": np.int8,
                   "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32, "i1": np.bool_, "si64": np.int64}


def numpy_dtype(value: Any) -> np.dtype:
    name = adapter.dtype_name(value)
    if name not in _ELEMENT_DTYPES:
        raise CoreAITranslationError(f"no numpy dtype for Core AI element type {name}")
    return np.dtype(_ELEMENT_DTYPES[name])
