"""Reference kernels of control flow and fused regions (spec part 2, section 7): bodies are
evaluated node by node as any graph is, their Input nodes bound positionally."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import EvaluationError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import (
    BatchElementwiseRegion,
    ChainSource,
    CustomFn,
    ElementwiseRegion,
    If,
    Scan,
    TransformRegion,
    While,
)
from rlx_mil.ir.regions import expand_batch_region, expand_region
from rlx_mil.ir.shape import Shape, Static
from rlx_mil.reference import registry
from rlx_mil.reference.registry import finish, reference_kernel


def run_body(body: object, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    if not isinstance(body, Graph):
        raise EvaluationError(f"a body must be an rlx_mil Graph, got {type(body).__name__}")
    return registry.run_body(body, args)


def _as_shape(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A body result holding the carried value's elements in the carried value's shape."""
    return value.reshape(like.shape) if value.shape != like.shape else value


@reference_kernel(CustomFn)
def _custom_fn(op: CustomFn, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(run_body(op.fwd_body, list(inputs))[0], out)


@reference_kernel(TransformRegion)
def _transform_region(op: TransformRegion, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    done: list[np.ndarray] = []
    for operand in op.steps:
        src = inputs[operand.index] if operand.source is ChainSource.INPUT else done[operand.index]
        done.append(np.repeat(np.repeat(np.asarray(src), 2, axis=2), 2, axis=3))
    return finish(done[-1], out)


@reference_kernel(If)
def _if(op: If, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    pred, captures = np.asarray(inputs[0]), list(inputs[1:])
    truth = pred != 0
    if truth.size == 1:
        branch = op.then_branch if bool(truth.reshape(())) else op.else_branch
        return finish(run_body(branch, captures)[0], out)
    # An element-wise predicate selects per element (both branches are side-effect free).
    then_value = run_body(op.then_branch, captures)[0]
    else_value = run_body(op.else_branch, captures)[0]
    return finish(np.where(truth, then_value, else_value), out)


@reference_kernel(While)
def _while(op: While, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    carried = list(inputs)
    assert op.max_iterations is not None  # the shape rule refuses an unbounded loop
    for _ in range(op.max_iterations):
        if not bool(np.asarray(run_body(op.cond, carried)[0]).reshape(())):
            break
        carried = [_as_shape(v, c) for v, c in zip(run_body(op.body, carried), carried, strict=True)]
    return finish(carried[0], out)


@reference_kernel(Scan)
def _scan(op: Scan, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    carry = inputs[0]
    bcast = list(inputs[1:1 + op.num_bcast])
    xs = list(inputs[1 + op.num_bcast:])
    trajectory = []
    for t in range(op.length):
        carry = _as_shape(run_body(op.body, [carry, *bcast, *(x[t] for x in xs)])[0], carry)
        trajectory.append(carry)
    if not op.save_trajectory:
        return finish(carry, out)
    if not trajectory:
        return np.zeros((0, *carry.shape), carry.dtype)
    return finish(np.stack(trajectory), out)


#: The IR dtype of a kernel input by its NumPy type; float32 reads as F32 (a BF16 input, held
#: in float32, then has its steps rounded once, at the region's end).
_DTYPES = {np.dtype(d.numpy): d for d in reversed(list(DType)) if d not in (DType.C64, DType.C128)}


@reference_kernel(ElementwiseRegion)
def _elementwise_region(op: ElementwiseRegion, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(run_body(expand_region(op, _input_shapes(inputs), out), list(inputs))[0], out)


@reference_kernel(BatchElementwiseRegion)
def _batch_elementwise_region(op: BatchElementwiseRegion, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(run_body(expand_batch_region(op, _input_shapes(inputs), out), list(inputs))[0], out)


def _input_shapes(inputs: Sequence[np.ndarray]) -> list[Shape]:
    shapes = []
    for i, value in enumerate(inputs):
        dtype = _DTYPES.get(np.asarray(value).dtype)
        if dtype is None:
            raise EvaluationError(f"region input {i} has the NumPy type {np.asarray(value).dtype}, no IR dtype")
        shapes.append(Shape(tuple(Static(d) for d in np.shape(value)), dtype))
    return shapes
