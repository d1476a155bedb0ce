"""The table of reference kernels and the numeric conventions every kernel shares.

A kernel takes `(op, inputs, out)`: the op (its attributes), the input arrays (each in its
node's declared dtype, BF16 held as float32) and the node's declared output `Shape` with the
dynamic dims the evaluator could bind already replaced by their sizes. It returns an ndarray
of the declared dtype. Kernels raise GraphError subclasses (without node info; the evaluator
adds it) for graph defects and EvaluationError for bad runtime data (an index out of range).

Math convention (spec section 0): float32 throughout. Float16/BF16 inputs are widened to
float32 and the result rounded to the declared dtype at the end. Float64 inputs, and integer
inputs of 32 bits or more, are computed in float64 so that no precision is invented away.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from rlx_mil.errors import AttributeValueError, ShapeError, UnsupportedOpError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import Op
from rlx_mil.ir.shape import Shape, Static

OpT = TypeVar("OpT", bound=Op)
Kernel = Callable[[Op, Sequence[np.ndarray], Shape], np.ndarray]

_KERNELS: dict[type[Op], Kernel] = {}

#: Runs a control-flow body (its Input nodes bound positionally) through these kernels; the
#: interpreter installs it, so the control kernels need not import the interpreter (bodies nest,
#: which makes the two depend on each other at run time, not at import time).
BodyRunner = Callable[[Graph, Sequence[np.ndarray]], list[np.ndarray]]
_BODY_RUNNER: list[BodyRunner] = []


def install_body_runner(runner: BodyRunner) -> None:
    _BODY_RUNNER[:] = [runner]


def run_body(body: Graph, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The outputs of a control-flow body evaluated on `args` (see `install_body_runner`)."""
    if not _BODY_RUNNER:
        raise UnsupportedOpError("no body runner is installed: import rlx_mil.reference to evaluate bodies")
    return _BODY_RUNNER[0](body, args)


def reference_kernel(op_type: type[OpT]) -> Callable[
    [Callable[[OpT, Sequence[np.ndarray], Shape], np.ndarray]],
    Callable[[OpT, Sequence[np.ndarray], Shape], np.ndarray],
]:
    """Register the NumPy reference of `op_type` (one kernel per op class)."""

    def register(
        fn: Callable[[OpT, Sequence[np.ndarray], Shape], np.ndarray],
    ) -> Callable[[OpT, Sequence[np.ndarray], Shape], np.ndarray]:
        _KERNELS[op_type] = fn  # type: ignore[assignment]
        return fn

    return register


#: Kernels of ops that write a state back into an input (`Op.carried_operands`): they return
#: the node's value and the final states, one per carried operand, in that order.
StateKernel = Callable[[Op, Sequence[np.ndarray], Shape], tuple[np.ndarray, tuple[np.ndarray, ...]]]

_STATE_KERNELS: dict[type[Op], StateKernel] = {}


def state_kernel(op_type: type[OpT]) -> Callable[
    [Callable[[OpT, Sequence[np.ndarray], Shape], tuple[np.ndarray, tuple[np.ndarray, ...]]]],
    Callable[[OpT, Sequence[np.ndarray], Shape], tuple[np.ndarray, tuple[np.ndarray, ...]]],
]:
    """Register the kernel `reference.evaluate` runs for a node of `op_type` that carries state
    (its plain `reference_kernel` still serves nodes without carried operands)."""

    def register(
        fn: Callable[[OpT, Sequence[np.ndarray], Shape], tuple[np.ndarray, tuple[np.ndarray, ...]]],
    ) -> Callable[[OpT, Sequence[np.ndarray], Shape], tuple[np.ndarray, tuple[np.ndarray, ...]]]:
        _STATE_KERNELS[op_type] = fn  # type: ignore[assignment]
        return fn

    return register


def state_kernel_for(op: Op) -> StateKernel:
    kernel = _STATE_KERNELS.get(type(op))
    if kernel is None:
        raise UnsupportedOpError(f"no NumPy reference for the carried state of op {op.type_name}")
    return kernel


def kernel_for(op: Op) -> Kernel:
    """The registered kernel of `op`'s class; UnsupportedOpError if there is none."""
    kernel = _KERNELS.get(type(op))
    if kernel is None:
        raise UnsupportedOpError(f"no NumPy reference kernel for op {op.type_name}")
    return kernel


def registered_op_types() -> tuple[type[Op], ...]:
    return tuple(_KERNELS)


# ------------------------------------------------------------------------------ numerics

_WIDE = (np.dtype(np.float64), np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.uint32))


def compute_dtype(*arrays: np.ndarray) -> np.dtype:
    """float64 when any operand would lose precision in float32, else float32."""
    for a in arrays:
        if a.dtype in _WIDE:
            return np.dtype(np.float64)
    return np.dtype(np.float32)


def as_float(a: np.ndarray, dtype: np.dtype | None = None) -> np.ndarray:
    """The values of `a` as float32 (or `dtype`); bool becomes 0/1."""
    return np.asarray(a).astype(dtype if dtype is not None else np.float32, copy=False)


def round_to_bf16(a: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), held as float32."""
    f = np.ascontiguousarray(a, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = rounded.view(np.float32).copy()
    nan = np.isnan(f)
    out[nan] = f[nan]  # rounding a NaN payload could carry into an infinity
    return out.reshape(f.shape)


_INT_LIMITS = {
    DType.I8: (-(2**7), 2**7 - 1), DType.I16: (-(2**15), 2**15 - 1),
    DType.I32: (-(2**31), 2**31 - 1), DType.I64: (-(2**63), 2**63 - 1),
    DType.U8: (0, 2**8 - 1), DType.U32: (0, 2**32 - 1),
}


def to_dtype(a: np.ndarray, dtype: DType) -> np.ndarray:
    """Convert values to `dtype` with the IR's Cast semantics (spec 4.2).

    float -> int truncates toward zero and saturates at the type's range; NaN becomes 0
    (Rust `as` semantics: NumPy leaves these cases undefined). int -> int wraps. -> Bool is
    `x != 0`.
    -> F16 rounds to nearest even; -> BF16 rounds to the nearest bfloat16 held as float32.
    """
    a = np.asarray(a)
    if dtype is DType.BOOL:
        return a != 0
    if dtype is DType.BF16:
        return round_to_bf16(a.astype(np.float32))
    target = dtype.numpy
    if dtype.is_int and a.dtype.kind == "f":
        lo, hi = _INT_LIMITS[dtype]
        with np.errstate(invalid="ignore"):
            t = np.trunc(a.astype(np.float64))
            t = np.where(np.isnan(t), 0.0, t)
            # float64(2**63 - 1) rounds up to 2**63, which would wrap; clip just below it.
            hi_f = np.nextafter(np.float64(hi), -np.inf) if dtype is DType.I64 else np.float64(hi)
            t = np.clip(t, np.float64(lo), hi_f)
        return t.astype(target)
    # int -> narrower int wraps (two's complement truncation), as Rust `as` and C++ casts do.
    # A value already of the dtype is returned as it is: every kernel's result passes through
    # here, and copying each (a model's activations, node after node) cost a reference run a
    # fifth of its time. Kernels never write into their operands.
    with np.errstate(over="ignore", invalid="ignore"):
        return a.astype(target, copy=False)


def sizes_of(shape: Shape) -> tuple[int | None, ...]:
    """Declared sizes, None where a dim is still dynamic."""
    return tuple(d.size if isinstance(d, Static) else None for d in shape.dims)


def static_sizes(shape: Shape, what: str) -> tuple[int, ...]:
    sizes = sizes_of(shape)
    if any(s is None for s in sizes):
        raise ShapeError(f"{what} needs a static declared shape, got {shape}")
    return tuple(s for s in sizes if s is not None)


def finish(value: np.ndarray, out: Shape) -> np.ndarray:
    """Cast a kernel's result to the declared dtype."""
    return to_dtype(np.asarray(value), out.dtype)


# ------------------------------------------------------------------------------ shared by kernels


def float_operands(*arrays: np.ndarray) -> list[np.ndarray]:
    dt = compute_dtype(*arrays)
    return [as_float(a, dt) for a in arrays]


def broadcast_sizes(shapes: Sequence[tuple[int, ...]], names: Sequence[str]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        listed = ", ".join(f"{n} {list(s)}" for n, s in zip(names, shapes, strict=True))
        raise ShapeError(f"operands do not broadcast: {listed}", operand=names[-1]) from None


def signed_axis(axis: int, rank: int, what: str = "axis") -> int:
    """An i32 axis attribute (may be negative), normalised."""
    if not -rank <= axis < max(rank, 1):
        raise AttributeValueError(f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def unsigned_axis(axis: int, rank: int, what: str = "axis") -> int:
    """A usize axis attribute: 0 <= axis < rank."""
    if not 0 <= axis < rank:
        raise AttributeValueError(f"{what} {axis} is out of range for rank {rank} (must be 0..{rank - 1})")
    return axis


def as_vector(a: np.ndarray, length: int, operand: str, dtype: np.dtype) -> np.ndarray:
    if a.size != length:
        raise ShapeError(f"{operand} must hold {length} values, got shape {list(a.shape)}", operand=operand)
    return as_float(a, dtype).reshape(length)

