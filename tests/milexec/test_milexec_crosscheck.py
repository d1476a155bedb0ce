"""The executor agrees with coremltools' value_inference on every op type that has one."""

from __future__ import annotations

import numpy as np
import pytest
from milexec_catalogue import CASES, EXCLUDED, Case, Floats
from milexec_util import build_function

from rlx_mil import milexec
from rlx_mil.errors import MilExecError
from rlx_mil.mil_walk import iter_ops
from rlx_mil.milexec.registry import KERNELS, OpContext

DTYPES = [np.dtype(np.float32), np.dtype(np.float16)]


def _op_types_with_value_inference() -> set[str]:
    from coremltools.converters.mil.mil import Operation
    from coremltools.converters.mil.mil.ops.registry import SSAOpRegistry

    found = set()
    for op_type, versions in SSAOpRegistry.core_ops.items():
        for cls in versions.values():
            if cls.value_inference is not Operation.value_inference or hasattr(
                cls, "materialized_val_inference"
            ):
                found.add(op_type)
    return found


def test_catalogue_covers_every_op_type_with_value_inference() -> None:
    covered = {c.op_type for c in CASES}
    missing = sorted(_op_types_with_value_inference() - covered - set(EXCLUDED))
    assert missing == []
    # Everything the catalogue covers also has a kernel.
    assert sorted(covered - milexec.supported_op_types()) == []


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_kernel_agrees_with_value_inference(case: Case, dtype: np.dtype) -> None:
    feeds, build = case.make(Floats(dtype))
    with np.errstate(
        over="ignore"
    ):  # coremltools folds fp16 range_1d while building; its size check overflows fp16
        function = build_function(feeds, build, case.opset)
    result = milexec.cross_check(function, feeds)
    ops = [op for op in iter_ops(function) if op.op_type == case.op_type]
    assert ops, f"the {case.label} program holds no {case.op_type} op"
    for op in ops:
        assert op.name in result.cross_checked, result.cross_check_skipped.get(op.name)
    assert all(np.all(np.isfinite(v)) for v in result.outputs.values() if v.dtype.kind == "f")


def test_cross_check_names_the_op_whose_kernel_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    from coremltools.converters.mil import Builder as mb

    def off_by_a_bit(ctx: OpContext) -> np.ndarray:
        return ctx.val("x") * 1.01

    feeds = {"x": np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)}
    function = build_function(feeds, lambda v: [mb.exp(x=mb.tanh(x=v["x"], name="squash"), name="grow")])
    assert milexec.cross_check(function, feeds).cross_checked == ["squash", "grow"]
    monkeypatch.setitem(KERNELS, "tanh", off_by_a_bit)
    with pytest.raises(MilExecError, match=r"op 'squash' \(tanh\) output 0 'squash' disagrees"):
        milexec.cross_check(function, feeds)


def test_cross_check_restores_the_program() -> None:
    from coremltools.converters.mil import Builder as mb

    feeds = {"x": np.ones((2, 3), dtype=np.float32)}
    function = build_function(feeds, lambda v: [mb.relu(x=mb.sub(x=v["x"], y=np.float32(2)))])
    before = [(v.name, v.sym_val) for op in function.operations for v in op.outputs if op.op_type != "const"]
    milexec.cross_check(function, feeds)
    after = [(v.name, v.sym_val) for op in function.operations for v in op.outputs if op.op_type != "const"]
    assert before == after == [(name, None) for name, _ in before]


def test_known_value_inference_bugs_are_skipped_not_failed() -> None:
    from coremltools.converters.mil import Builder as mb

    feeds = {"x": np.arange(12, dtype=np.float32).reshape(3, 4)}
    function = build_function(
        feeds,
        lambda v: [
            mb.cumsum(x=v["x"], axis=1, exclusive=True, name="excl"),
            mb.scatter_along_axis(
                data=v["x"],
                indices=np.array([[0], [1], [3]], dtype=np.int32),
                updates=np.ones((3, 1), dtype=np.float32),
                axis=1,
                mode="add",
                name="scat",
            ),
        ],
    )
    result = milexec.cross_check(function, feeds)
    assert set(result.cross_check_skipped) >= {"excl", "scat"}
    x = feeds["x"]
    np.testing.assert_array_equal(
        result.outputs["excl"], np.concatenate([np.zeros((3, 1)), np.cumsum(x, 1)[:, :-1]], 1)
    )
    expected = x.copy()
    expected[[0, 1, 2], [0, 1, 3]] += 1
    np.testing.assert_array_equal(result.outputs["scat"], expected)


def test_symbolic_reference_values_are_skipped_not_counted() -> None:
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Function, get_new_symbol

    with Function({"x": mb.placeholder(shape=(get_new_symbol(), 3))}) as function:
        function.set_outputs([mb.shape(x=function.inputs["x"], name="s")])
    result = milexec.cross_check(function, {"x": np.zeros((5, 3), dtype=np.float32)})
    assert result.outputs["s"].tolist() == [5, 3]
    assert result.cross_checked == []
    assert "symbolic" in result.cross_check_skipped["s"]
