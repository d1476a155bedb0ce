"""Kernel registry of the MIL executor: one NumPy kernel per MIL op type.

A kernel receives an :class:`OpContext` and returns one array per output of the op (a single
array, or a tuple for multi-output ops). It computes in float32: `OpContext.val` hands out float
inputs upcast to float32 (fp16 values arrive already rounded to fp16). The executor, not the
kernel, rounds each result to the dtype the program declares for that output.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from rlx_mil.errors import MilExecError
from rlx_mil.milexec.streamed import StreamedWeight, materialize

if TYPE_CHECKING:
    from coremltools.converters.mil.mil import Block, Operation, Var

KernelResult = np.ndarray | tuple[np.ndarray, ...]
Kernel = Callable[["OpContext"], KernelResult]

#: op type -> kernel. Filled by the `kernel` decorator when `rlx_mil.milexec.kernels` is imported.
KERNELS: dict[str, Kernel] = {}

#: fp16 arrays at least this large are widened with `rlx_mil.milexec.fp16.widen` (same values,
#: several times faster than NumPy's cast).
WIDEN_FAST_MIN = 1 << 14

_OPSET_OF_MODULE = re.compile(r"\.iOS(\d+)\.")


def kernel(*op_types: str, replace: bool = False) -> Callable[[Kernel], Kernel]:
    """Register the decorated function as the kernel of each of `op_types`.

    `replace=True` overrides an existing kernel; otherwise registering a type twice is refused,
    so two modules cannot silently fight over one op type.
    """

    def register(fn: Kernel) -> Kernel:
        for op_type in op_types:
            if op_type in KERNELS and not replace:
                raise MilExecError(f"a milexec kernel for op type {op_type!r} is already registered")
            KERNELS[op_type] = fn
        return fn

    return register


class BlockRunner(Protocol):
    """What control-flow kernels need from the executor: run a nested block."""

    def __call__(self, block: Block, block_inputs: Sequence[np.ndarray]) -> list[np.ndarray]: ...


class OpContext:
    """The view a kernel has of one op: its inputs' values, params and declared outputs."""

    def __init__(
        self,
        op: Operation,
        lookup: Callable[[Var], np.ndarray],
        run_block: BlockRunner,
        states: dict[str, np.ndarray],
        donate: Callable[[Operation, Var], bool] | None = None,
        shared_states: frozenset[str] = frozenset(),
        inputs: dict[str, Any] | None = None,
    ) -> None:
        self.op = op
        #: the op's inputs by name (coremltools builds `op.inputs` anew on every access).
        self._inputs = inputs if inputs is not None else op.inputs
        self._lookup = lookup
        self.run_block = run_block
        self.states = states
        self._donate = donate
        #: States whose buffer `read_state` may hand out without a copy (see `Plan`).
        self.shared_states = shared_states

    # -- identity ---------------------------------------------------------------------------
    @property
    def op_type(self) -> str:
        return str(self.op.op_type)

    @property
    def name(self) -> str:
        return str(self.op.name)

    @property
    def opset(self) -> int:
        """iOS version whose op definition this op instantiates (15 for the iOS13-15 opset)."""
        # A light op (`rlx_mil.milexec.protoread`) names the pymil class it instantiates.
        definition = getattr(self.op, "op_class", None) or type(self.op)
        match = _OPSET_OF_MODULE.search(definition.__module__)
        return int(match.group(1)) if match else 15

    def error(self, message: str) -> MilExecError:
        return MilExecError(f"op '{self.name}' ({self.op_type}): {message}")

    # -- inputs -----------------------------------------------------------------------------
    def _var(self, name: str) -> Any:
        return self._inputs.get(name)

    def has(self, name: str) -> bool:
        return self._var(name) is not None

    def raw(self, name: str) -> np.ndarray:
        """The input as stored (declared dtype; fp16 stays fp16)."""
        var = self._var(name)
        if var is None:
            raise self.error(f"required input '{name}' is missing")
        return materialize(self._lookup(var))

    def streamed(self, name: str) -> StreamedWeight | None:
        """Input `name` when a prepared run streams it (`rlx_mil.milexec.streamed`): a kernel
        that reads it a block of rows at a time asks for it here instead of `raw`."""
        var = self._var(name)
        value = self._lookup(var) if var is not None else None
        return value if isinstance(value, StreamedWeight) else None

    def val(self, name: str) -> np.ndarray:
        """The input for computing: fp16 upcast to float32, other dtypes as stored."""
        return as_compute(self.raw(name))

    def donatable(self, name: str) -> bool:
        """True when the kernel may write its result into input `name`'s buffer: this op is
        the input's last use and no other live value, const or caller array shares the buffer."""
        var = self._var(name)
        return self._donate is not None and var is not None and self._donate(self.op, var)

    def opt(self, name: str) -> np.ndarray | None:
        return self.val(name) if self.has(name) else None

    def vals(self, name: str) -> list[np.ndarray]:
        """A tuple input (concat's `values`...), each element as for `val`."""
        var = self._var(name)
        if var is None:
            raise self.error(f"required input '{name}' is missing")
        return [as_compute(materialize(self._lookup(v))) for v in var]

    def param(self, name: str, default: Any = None) -> Any:
        """A (const) parameter as a Python value: str, bool, int, float or nested list."""
        if not self.has(name):
            return default
        value = self.raw(name)
        if isinstance(value, str):
            return value
        arr = np.asarray(value)
        if arr.dtype.kind in "US":
            return str(arr.item())
        return arr.item() if arr.ndim == 0 else arr.tolist()

    def int_list(self, name: str, default: Sequence[int] | None = None) -> list[int]:
        if not self.has(name):
            if default is None:
                raise self.error(f"required input '{name}' is missing")
            return list(default)
        return [int(v) for v in np.asarray(self.raw(name)).reshape(-1)]

    # -- outputs ----------------------------------------------------------------------------
    def out_var(self, index: int = 0) -> Var:
        return self.op.outputs[index]

    def out_dtype(self, index: int = 0) -> np.dtype:
        dtype = declared_dtype(self.out_var(index))
        if dtype is None:
            raise self.error(f"output {index} has no tensor dtype")
        return dtype

    def out_shape(self, index: int = 0) -> tuple[Any, ...]:
        return tuple(self.out_var(index).shape)


def as_compute(value: np.ndarray) -> np.ndarray:
    """fp16 -> float32 (the precision every kernel computes in); anything else unchanged."""
    if isinstance(value, np.ndarray) and value.dtype == np.float16:
        if value.size >= WIDEN_FAST_MIN:
            from rlx_mil.milexec.fp16 import widen

            return widen(value)
        return value.astype(np.float32)
    if isinstance(value, np.float16):
        return np.asarray(value, dtype=np.float32)
    return value


def declared_dtype(var: Var) -> np.dtype | None:
    """The numpy dtype a MIL var is declared with (None for str, list and other non-tensors)."""
    from coremltools.converters.mil.mil import types

    builtin = var.dtype
    if builtin is None or types.is_str(builtin):
        return None
    try:
        nptype = types.nptype_from_builtin(builtin)
    except KeyError:
        return None
    dtype = np.dtype(nptype)
    if dtype.metadata:
        # Sub-byte MIL types (int4, uint1...) carry metadata on an int8/uint8 dtype; the
        # executor stores them unpacked in the plain container dtype.
        dtype = np.dtype(dtype.str)
    if dtype.kind in "USO":
        return None
    return dtype

