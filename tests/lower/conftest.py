"""Shared helpers for the lowering tests.

Test modules in this package import them relatively::

    from .conftest import convert_and_cleanup, emitted_ops, run_model

* `convert_and_cleanup(graph, params=None, **convert_kwargs)`: `rlx_mil.convert`, whose
  temporary .mlpackage is removed when the test session ends (models stay usable until then).
* `emitted_ops(model)`: the MIL op types of the converted program, in order.
* `ops_outside_opset(model, target)`: emitted op types that the target's opset lacks.
* `run_model(model, inputs, engine=, kernels=)`: run a converted model on Linux (keyed by IR
  names) through `rlx_mil.milexec.run`, or through coremltools' own per-op `value_inference`
  (plus NumPy kernels for ops that lack one); `kernels` swap in other behaviours of an op, to
  show a lowering does not depend on how a compute unit resolves a corner case.
* `check_against_reference(graph, inputs, params, target=, precision=)`: convert, run and
  compare every output with `rlx_mil.reference.evaluate` within `TOLERANCES[precision]`.
"""

from __future__ import annotations

import atexit
import json
import shutil
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pytest

import rlx_mil
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.naming import IO_NAMES_METADATA_KEY

_CONVERTED_PACKAGES: list[str] = []


def _remove_converted_packages() -> None:
    while _CONVERTED_PACKAGES:
        shutil.rmtree(_CONVERTED_PACKAGES.pop(), ignore_errors=True)


# Also on interpreter exit, for models converted outside a pytest session (e.g. at import).
atexit.register(_remove_converted_packages)


def convert_and_cleanup(graph: Graph, params: Mapping[str, Any] | None = None, **convert_kwargs: Any) -> Any:
    """`rlx_mil.convert(graph, params, **convert_kwargs)`; the model's package is deleted at the
    end of the test session."""
    model = rlx_mil.convert(graph, params, **convert_kwargs)
    path = getattr(model, "package_path", None)
    if path:
        _CONVERTED_PACKAGES.append(str(path))
    return model


def emitted_ops(model: Any) -> list[str]:
    """Op types of the converted model's main function, in program order, nested blocks
    included (after Core ML's passes, consts are mostly folded away but still listed)."""
    program = model._mil_program if hasattr(model, "_mil_program") else model
    types: list[str] = []

    def walk(block: Any) -> None:
        for op in block.operations:
            types.append(op.op_type)
            for inner in op.blocks:
                walk(inner)

    walk(program.functions["main"])
    return types


def _silu(op: Any) -> np.ndarray:
    x = op.x.val
    wide = x.astype(np.float32)
    return (wide / (np.float32(1) + np.exp(-wide))).astype(x.dtype)


def _cumsum(op: Any) -> np.ndarray:
    # coremltools 9.0's cumsum value_inference crashes on exclusive=True (np.zeros misuse).
    x, axis = op.x.val, int(op.axis.val)
    if op.reverse.val:
        x = np.flip(x, axis)
    total = np.cumsum(x, axis=axis, dtype=x.dtype)
    if op.exclusive.val:
        total = total - x
    return np.flip(total, axis) if op.reverse.val else total


#: NumPy kernels for MIL ops whose coremltools value_inference is missing or broken.
FALLBACK_KERNELS: dict[str, Callable[[Any], Any]] = {"silu": _silu, "cumsum": _cumsum}


def run_program_with_value_inference(
    program: Any,
    feeds: Mapping[str, np.ndarray],
    kernels: Mapping[str, Callable[[Any], Any]] | None = None,
) -> dict[str, np.ndarray]:
    """Evaluate the main function of a MIL program by attaching values to its vars and calling
    each op's `value_inference`; the program is left as it was. `feeds` and the result are keyed
    by the MIL input/output names. `kernels` (op type -> fn(op) returning the output value(s))
    replace value_inference for those op types, e.g. to mimic another compute unit."""
    func = program.functions["main"]
    table = {**FALLBACK_KERNELS, **(kernels or {})}
    saved: list[tuple[Any, Any]] = []

    def put(var: Any, value: Any) -> None:
        saved.append((var, var._sym_val))
        holder = var.sym_type()
        holder.val = value
        var._sym_val = holder

    try:
        for name, var in func.inputs.items():
            put(var, np.asarray(feeds[name]))
        with np.errstate(all="ignore"):
            for op in func.operations:
                if op.op_type == "const":
                    continue
                if op.op_type.startswith("constexpr_"):
                    out = op.materialized_val_inference()
                elif op.op_type in table:
                    out = table[op.op_type](op)
                else:
                    out = op.value_inference()
                values = out if isinstance(out, (tuple, list)) else (out,)
                for var, value in zip(op.outputs, values, strict=True):
                    put(var, value)
            return {var.name: np.array(var.val) for var in func.outputs}
    finally:
        for var, old in reversed(saved):
            var._sym_val = old


def model_io_names(model: Any) -> dict[str, dict[str, str]]:
    """{"inputs": {mil: ir}, "outputs": {mil: ir}} from the model metadata."""
    return json.loads(model.user_defined_metadata[IO_NAMES_METADATA_KEY])


def _as_placeholder_shapes(model: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rank-0 inputs travel as [1] (Core ML has no rank-0 model inputs): reshape such feeds."""
    io = model_io_names(model)
    placeholders = model._mil_program.functions["main"].inputs
    shapes = {ir: tuple(placeholders[mil].shape) for mil, ir in io["inputs"].items() if mil in placeholders}
    out = {}
    for name, value in inputs.items():
        arr = np.asarray(value)
        want = shapes.get(name)
        if want is not None and arr.shape != want and arr.size == int(np.prod(want)):
            arr = arr.reshape(want)
        out[name] = arr
    return out


def run_model(
    model: Any,
    inputs: Mapping[str, np.ndarray],
    *,
    engine: str = "auto",
    kernels: Mapping[str, Callable[[Any], Any]] | None = None,
) -> dict[str, np.ndarray]:
    """Run a converted model on `inputs` (keyed by IR Input names); returns outputs keyed by IR
    output names. `engine`: "auto" (milexec when available), "milexec" or "value_inference".
    `kernels` (value_inference only) override how given MIL op types compute."""
    if engine not in ("auto", "milexec", "value_inference"):
        raise ValueError(f"unknown engine {engine!r}")
    if kernels and engine == "milexec":
        raise ValueError("kernel overrides need engine='value_inference'")
    if engine == "auto" and kernels:
        engine = "value_inference"
    inputs = _as_placeholder_shapes(model, inputs)
    if engine != "value_inference":
        try:
            from rlx_mil.milexec import run as milexec_run  # type: ignore[attr-defined]
        except ImportError:
            if engine == "milexec":
                raise
        else:
            return dict(milexec_run(model, inputs))
    io = model_io_names(model)
    ir_to_mil = {ir: mil for mil, ir in io["inputs"].items()}
    feeds = {ir_to_mil[name]: np.asarray(value, dtype=np.int32 if np.asarray(value).dtype.kind in "iu" else np.float32)
             for name, value in inputs.items()}
    raw = run_program_with_value_inference(model._mil_program, feeds, kernels)
    return {io["outputs"][mil]: value for mil, value in raw.items()}


def ops_outside_opset(model: Any, target: str) -> list[str]:
    """Op types of the converted program that do not exist in `target`'s opset."""
    import coremltools as ct
    from coremltools.converters.mil.mil.ops.registry import SSAOpRegistry

    opset = getattr(ct.target, target)
    missing = []
    for op_type in sorted(set(emitted_ops(model))):
        versions = SSAOpRegistry.core_ops.get(op_type)
        if versions is None:
            continue  # dialect ops are rewritten before serialisation
        if not any(v is None or v <= opset for v in versions):
            missing.append(op_type)
    return missing


TARGETS = ("iOS15", "iOS16", "iOS17", "iOS18")
PRECISIONS = ("fp32", "fp16")
#: Default output tolerances: fp32 programs agree with the float32 reference to a few ulps of
#: accumulated rounding; fp16 programs round every intermediate to fp16 (2^-11 relative).
TOLERANCES = {"fp32": {"rtol": 2e-5, "atol": 2e-5}, "fp16": {"rtol": 1e-2, "atol": 1e-2}}


def as_program_sees(values: Mapping[str, Any] | None, precision: str) -> dict[str, Any]:
    """Float arrays rounded the way a program of `precision` holds them (fp16 programs cast
    float inputs and weights to fp16), so a reference computed on them isolates the op's own
    error from input rounding."""
    out: dict[str, Any] = {}
    for name, value in (values or {}).items():
        arr = np.asarray(value)
        if precision == "fp16" and arr.dtype.kind == "f":
            with np.errstate(over="ignore"):
                arr = arr.astype(np.float16).astype(arr.dtype)
        out[name] = arr
    return out


def check_against_reference(
    graph: Graph,
    inputs: Mapping[str, Any],
    params: Mapping[str, Any] | None = None,
    *,
    target: str,
    precision: str,
    rtol: float | None = None,
    atol: float | None = None,
    engine: str = "auto",
) -> Any:
    """Convert `graph`, run it on `inputs` and assert every output matches
    `rlx_mil.reference.evaluate` (on the inputs as the program holds them) within the
    precision's tolerance (or `rtol`/`atol`); NaNs must match NaNs. Returns the model."""
    from rlx_mil.reference import evaluate

    model = convert_and_cleanup(graph, params, target=target, precision=precision)
    got = run_model(model, inputs, engine=engine)
    want = evaluate(graph, as_program_sees(inputs, precision), as_program_sees(params, precision))
    tol = dict(TOLERANCES[precision])
    if rtol is not None:
        tol["rtol"] = rtol
    if atol is not None:
        tol["atol"] = atol
    for name, expected in want.items():
        expected = np.asarray(expected)
        actual = np.asarray(got[name])
        assert actual.size == expected.size, f"{name}: shape {actual.shape} vs reference {expected.shape}"
        np.testing.assert_allclose(
            actual.astype(np.float64).reshape(expected.shape), expected.astype(np.float64),
            equal_nan=True, err_msg=f"output {name!r} ({target}, {precision})", **tol,
        )
    return model


@pytest.fixture(scope="session", autouse=True)
def _cleanup_converted_models() -> Iterator[None]:
    yield
    _remove_converted_packages()
