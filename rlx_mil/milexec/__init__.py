"""milexec: a NumPy executor for Core ML MIL programs, to check converted models on Linux.

`run(source, inputs)` executes a MIL Function op by op with one NumPy kernel per op type
(`rlx_mil.milexec.registry.KERNELS`, extended with the `@kernel("op_type")` decorator).
`source` is a converted `ct.models.MLModel`, a MIL `Program` or `Function`, or the path of a
saved `.mlpackage` (reloaded with `load_program`).

Precision model
---------------
``precision_model="declared"`` (default) mirrors what the program says about each tensor:

* Every value is stored in the dtype the program declares for its var. An fp16 var (what
  coremltools' FP16 pass produces) holds an fp16 array: the result of the op that produces it is
  rounded to fp16 right there, so overflow to inf, underflow to 0 and NaN appear at the op where
  they would on device, and the next op sees the rounded values.
* Each op computes internally in float32 from those stored values: matmul / linear / conv
  products, reductions, softmax and the norms accumulate in float32, as the GPU and ANE do (and
  fp16 matmul runs as float32 BLAS on the fp16-rounded operands, then rounds once).
* Integer and bool vars hold their declared dtypes; `cast` is the rounding/truncation to the
  declared dtype.

``precision_model="float32"`` keeps fp16-declared vars in float32 (no fp16 rounding anywhere),
which separates conversion bugs from fp16 precision loss.

Coremltools' own `value_inference` (used by ``cross_check=True``) computes fp16 ops in numpy fp16
arithmetic, rounding every intermediate; results therefore differ from this executor by a few
fp16 ulps, and the cross-check compares fp16 outputs with an fp16-sized tolerance.

Interface names
---------------
Outputs are keyed by the function's output var names, unless the model metadata holds
`rlx_mil.ir.naming.IO_NAMES_METADATA_KEY`; then outputs are keyed by the IR names and inputs may be
given under either name. Inputs are cast to each placeholder's dtype (fp16 placeholders round).
Float outputs come back as float32, bools as bool, ints as int32 (int64 if declared so).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any, Literal, overload

import numpy as np

from rlx_mil.milexec.crosscheck import DEFAULT_TOLERANCES, Tolerance
from rlx_mil.milexec.executor import PRECISION_MODELS, ExecutionResult, PrecisionModel, execute
from rlx_mil.milexec.loader import IONames, load_program
from rlx_mil.milexec.registry import KERNELS, OpContext, kernel

__all__ = [
    "DEFAULT_TOLERANCES",
    "KERNELS",
    "PRECISION_MODELS",
    "ExecutionResult",
    "IONames",
    "OpContext",
    "PrecisionModel",
    "Tolerance",
    "cross_check",
    "execute",
    "kernel",
    "load_program",
    "run",
    "supported_op_types",
]


@overload
def run(
    source: Any,
    inputs: Mapping[str, Any],
    *,
    function_name: str | None = ...,
    states: MutableMapping[str, np.ndarray] | None = ...,
    precision_model: PrecisionModel = ...,
    cross_check: bool = ...,
    cross_check_tolerances: Mapping[Any, Tolerance] | None = ...,
    return_all: Literal[False] = ...,
    io_names: Mapping[str, Any] | IONames | None = ...,
) -> dict[str, np.ndarray]: ...


@overload
def run(
    source: Any,
    inputs: Mapping[str, Any],
    *,
    function_name: str | None = ...,
    states: MutableMapping[str, np.ndarray] | None = ...,
    precision_model: PrecisionModel = ...,
    cross_check: bool = ...,
    cross_check_tolerances: Mapping[Any, Tolerance] | None = ...,
    return_all: Literal[True],
    io_names: Mapping[str, Any] | IONames | None = ...,
) -> ExecutionResult: ...


def run(
    source: Any,
    inputs: Mapping[str, Any],
    *,
    function_name: str | None = None,
    states: MutableMapping[str, np.ndarray] | None = None,
    precision_model: PrecisionModel = "declared",
    cross_check: bool = False,
    cross_check_tolerances: Mapping[Any, Tolerance] | None = None,
    return_all: bool = False,
    io_names: Mapping[str, Any] | IONames | None = None,
) -> dict[str, np.ndarray] | ExecutionResult:
    """Execute a MIL program with NumPy and return its outputs.

    Args:
        source: `ct.models.MLModel` (its in-memory `_mil_program` when present, else reloaded
            from its package), MIL `Program` or `Function`, or a `.mlpackage` path.
        inputs: one array per model input, keyed by interface (MIL) name or, when the model
            carries the IO-name metadata, by IR name. Missing, extra, duplicate or mis-shaped
            inputs raise `MilExecError` listing every problem.
        function_name: function of a multifunction program (default: the program's default).
        states: state values by state name; missing states start as zeros. The mapping is
            updated in place with the values the program writes (fp16, as declared; float32
            under precision_model="float32", which rounds nothing).
        precision_model: "declared" (fp16 vars rounded to fp16) or "float32"; see the module doc.
        cross_check: also evaluate each op with coremltools' value_inference (or
            materialized_val_inference for constexpr ops) and raise `MilExecError` naming the
            first op that disagrees beyond the dtype's tolerance.
        cross_check_tolerances: per-dtype overrides of `DEFAULT_TOLERANCES`.
        return_all: return an `ExecutionResult` holding every var's value, the states, the ops
            where inf/NaN first appeared and per-op-type timings, instead of the output dict.
        io_names: interface-name mapping to use instead of the model metadata's.
    """
    result = execute(
        source,
        inputs,
        function_name=function_name,
        states=states,
        precision_model=precision_model,
        cross_check=cross_check,
        cross_check_tolerances=cross_check_tolerances,
        keep_values=return_all,
        io_names=io_names,
    )
    return result if return_all else result.outputs


def cross_check(
    source: Any,
    inputs: Mapping[str, Any],
    *,
    function_name: str | None = None,
    states: MutableMapping[str, np.ndarray] | None = None,
    precision_model: PrecisionModel = "declared",
    tolerances: Mapping[Any, Tolerance] | None = None,
    io_names: Mapping[str, Any] | IONames | None = None,
) -> ExecutionResult:
    """Run with every op checked against coremltools; see `ExecutionResult.cross_checked` and
    `cross_check_skipped` for what was compared. Raises `MilExecError` on a disagreement."""
    return execute(
        source,
        inputs,
        function_name=function_name,
        states=states,
        precision_model=precision_model,
        cross_check=True,
        cross_check_tolerances=tolerances,
        io_names=io_names,
    )


def supported_op_types() -> frozenset[str]:
    """Every MIL op type the executor can run (const is read directly, without a kernel)."""
    import rlx_mil.milexec.kernels  # noqa: F401

    return frozenset(KERNELS) | {"const"}
