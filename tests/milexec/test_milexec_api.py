"""run() plumbing: sources, interface names, input validation, dtypes, states, functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from milexec_util import build_function, build_program, converted

from rlx_mil import milexec
from rlx_mil.errors import MilExecError, RlxMilError
from rlx_mil.ir.naming import IO_NAMES_METADATA_KEY


def mb() -> Any:
    from coremltools.converters.mil import Builder

    return Builder


W = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)


def affine_program(opset: str = "iOS17") -> Any:
    feeds = {"x_in": np.zeros((2, 4), dtype=np.float32)}
    return build_program(feeds, lambda v: [mb().linear(x=v["x_in"], weight=W, name="y_out")], opset)


def test_runs_program_function_model_and_saved_package(tmp_path: Path) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    expected = x @ W.T
    program = affine_program()
    np.testing.assert_allclose(milexec.run(program, {"x_in": x})["y_out"], expected, rtol=1e-6)
    np.testing.assert_allclose(
        milexec.run(program.functions["main"], {"x_in": x})["y_out"], expected, rtol=1e-6
    )
    with converted(program, tmp_path, opset="iOS17") as model:
        from_model = milexec.run(model, {"x_in": x})
        np.testing.assert_allclose(from_model["y_out"], expected, rtol=1e-6)
        package = tmp_path / "saved.mlpackage"
        model.save(str(package))
    import coremltools as ct

    reopened = ct.models.MLModel(str(package), skip_model_load=True)
    assert getattr(reopened, "_mil_program", None) is None
    np.testing.assert_array_equal(milexec.run(reopened, {"x_in": x})["y_out"], from_model["y_out"])
    np.testing.assert_array_equal(milexec.run(package, {"x_in": x})["y_out"], from_model["y_out"])
    np.testing.assert_array_equal(milexec.run(str(package), {"x_in": x})["y_out"], from_model["y_out"])


def test_every_input_problem_is_reported_at_once() -> None:
    feeds = {
        "a": np.zeros((2, 3), dtype=np.float32),
        "b": np.zeros((3,), dtype=np.float32),
        "c": np.zeros((1,), dtype=np.int32),
    }
    function = build_function(
        feeds, lambda v: [mb().add(x=v["a"], y=v["b"]), mb().add(x=v["c"], y=np.int32(1))]
    )
    with pytest.raises(MilExecError) as info:
        milexec.run(function, {"a": np.zeros((2, 4)), "c": np.array([1.5]), "zz": np.zeros(1)})
    text = str(info.value)
    assert "unexpected input 'zz'" in text
    assert "missing input 'b'" in text
    assert "input 'a': shape (2, 4), expected (2, 3)" in text
    assert "input 'c': holds non-integer values but the model input is int32" in text
    assert isinstance(info.value, RlxMilError)


def test_symbolic_dims_accept_any_size_but_must_agree() -> None:
    from coremltools.converters.mil.mil import Function, get_new_symbol

    seq = get_new_symbol()
    inputs = {"a": mb().placeholder(shape=(seq, 2)), "b": mb().placeholder(shape=(seq, 2))}
    with Function(inputs) as function:
        function.set_outputs([mb().add(x=function.inputs["a"], y=function.inputs["b"], name="s")])
    for n in (1, 5):
        a = np.ones((n, 2), dtype=np.float32)
        np.testing.assert_array_equal(milexec.run(function, {"a": a, "b": a})["s"], 2 * a)
    with pytest.raises(MilExecError, match="same symbolic dim"):
        milexec.run(function, {"a": np.ones((3, 2)), "b": np.ones((4, 2))})


def test_io_name_metadata_maps_inputs_and_outputs(tmp_path: Path) -> None:
    x = np.ones((2, 4), dtype=np.float32)
    names = {"inputs": {"x_in": "x.in"}, "outputs": {"y_out": "y/out"}}
    with converted(affine_program(), tmp_path) as model:
        model.user_defined_metadata[IO_NAMES_METADATA_KEY] = json.dumps(names)
        by_ir = milexec.run(model, {"x.in": x})
        by_mil = milexec.run(model, {"x_in": x})
        assert list(by_ir) == list(by_mil) == ["y/out"]
        np.testing.assert_array_equal(by_ir["y/out"], by_mil["y/out"])
        with pytest.raises(MilExecError, match=r"input 'x_in' given twice \(as 'x.in' and 'x_in'\)"):
            milexec.run(model, {"x.in": x, "x_in": x})
        with pytest.raises(MilExecError, match=r"missing input 'x.in' \(model input 'x_in'\)"):
            milexec.run(model, {})
        package = tmp_path / "named.mlpackage"
        model.save(str(package))
    assert list(milexec.run(package, {"x.in": x})) == ["y/out"]
    # An explicit mapping works for a bare Program too.
    assert list(milexec.run(affine_program(), {"x.in": x}, io_names=names)) == ["y/out"]


def test_bad_io_name_metadata_is_a_typed_error() -> None:
    with pytest.raises(MilExecError, match="must map interface names"):
        milexec.run(affine_program(), {"x_in": np.ones((2, 4))}, io_names={"inputs": {"x_in": 3}})


def test_fp16_io_is_rounded_on_the_way_in_and_float32_on_the_way_out(tmp_path: Path) -> None:
    from coremltools.converters.mil.mil import types

    inputs = {"x": mb().placeholder(shape=(4,), dtype=types.fp16)}
    from coremltools.converters.mil.mil import Function, Program

    with Function(inputs, opset_version=__import__("coremltools").target.iOS16) as function:
        function.set_outputs([mb().mul(x=function.inputs["x"], y=np.float16(1), name="y")])
    program = Program()
    program.add_function("main", function)
    x = np.array([1 + 2**-12, 70000.0, 1e-8, -3.0], dtype=np.float32)
    with converted(program, tmp_path, opset="iOS16", fp16=True) as model:
        assert model.get_spec().description.input[0].type.multiArrayType.dataType == 65552  # FLOAT16
        out = milexec.run(model, {"x": x})["y"]
    assert out.dtype == np.float32
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out, x.astype(np.float16).astype(np.float32))
    assert np.isinf(out[1]) and out[0] == 1.0 and out[2] == 0.0


def test_output_dtypes_for_the_caller() -> None:
    x = np.array([[0.5, -2.0, 3.0]], dtype=np.float32)
    function = build_function(
        {"x": x},
        lambda v: [
            mb().reduce_argmax(x=v["x"], axis=-1, name="arg"),
            mb().greater(x=v["x"], y=np.float32(0), name="pos"),
            mb().cast(x=v["x"], dtype="fp16", name="half"),
            mb().cast(x=v["x"], dtype="int8", name="small"),
        ],
    )
    out = milexec.run(function, {"x": x})
    assert out["arg"].dtype == np.int32 and out["arg"].tolist() == [2]
    assert out["pos"].dtype == np.bool_ and out["pos"].tolist() == [[True, False, True]]
    assert out["half"].dtype == np.float32
    assert out["small"].dtype == np.int32 and out["small"].tolist() == [[0, -2, 3]]


def test_missing_kernels_are_reported_with_their_ops_before_running() -> None:
    shape = np.array([2], dtype=np.int32)
    function = build_function(
        {},
        lambda v: [
            mb().random_bernoulli(shape=shape, name="noise"),
            mb().random_bernoulli(shape=shape, name="b2"),
            mb().resize_bilinear(x=mb().random_bernoulli(shape=np.array([1, 1, 2, 2], dtype=np.int32), name="b3"),
                                 target_size_height=4, target_size_width=4, name="big"),
        ],
    )
    with pytest.raises(MilExecError) as info:
        milexec.run(function, {})
    assert "op type 'random_bernoulli' (ops 'noise', 'b2', 'b3')" in str(info.value)
    assert "op type 'resize_bilinear' (op 'big')" in str(info.value)


def test_kernel_failure_is_wrapped_with_the_op_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_mil.milexec.registry import KERNELS

    def broken(ctx: Any) -> np.ndarray:
        raise ZeroDivisionError("boom")

    monkeypatch.setitem(KERNELS, "exp", broken)
    function = build_function({"x": np.ones(2, dtype=np.float32)}, lambda v: [mb().exp(x=v["x"], name="e")])
    with pytest.raises(
        MilExecError, match=r"op 'e' \(exp\) failed in its milexec kernel: ZeroDivisionError: boom"
    ):
        milexec.run(function, {"x": np.ones(2)})


def test_wrong_shape_from_a_kernel_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_mil.milexec.registry import KERNELS

    monkeypatch.setitem(KERNELS, "exp", lambda ctx: np.ones(3, dtype=np.float32))
    function = build_function({"x": np.ones(2, dtype=np.float32)}, lambda v: [mb().exp(x=v["x"], name="e")])
    with pytest.raises(
        MilExecError,
        match=r"op 'e' \(exp\): computed shape \(3,\) for 'e' does not match its declared shape \(2\)",
    ):
        milexec.run(function, {"x": np.ones(2)})


def kv_cache_program() -> Any:
    import coremltools as ct
    from coremltools.converters.mil.mil import Function, Program, types

    inputs = {
        "row": mb().placeholder(shape=(1, 4), dtype=types.fp16),
        "pos": mb().placeholder(shape=(1,), dtype=types.int32),
        "cache": mb().state_tensor_placeholder(shape=(3, 4), dtype=types.fp16),
    }
    with Function(inputs, opset_version=ct.target.iOS18) as function:
        current = mb().read_state(input=function.inputs["cache"])
        pos = function.inputs["pos"]
        begin = mb().concat(values=[pos, np.array([0], dtype=np.int32)], axis=0)
        end = mb().concat(values=[mb().add(x=pos, y=np.int32(1)), np.array([4], dtype=np.int32)], axis=0)
        updated = mb().slice_update(x=current, update=function.inputs["row"], begin=begin, end=end)
        written = mb().coreml_update_state(state=function.inputs["cache"], value=updated)
        function.set_outputs([mb().reduce_sum(x=written, axes=[0], name="colsum")])
    program = Program()
    program.add_function("main", function)
    return program


def test_states_start_at_zero_and_are_updated_in_place(tmp_path: Path) -> None:
    rows = np.arange(12, dtype=np.float32).reshape(3, 1, 4)
    with converted(kv_cache_program(), tmp_path, opset="iOS18", fp16=True) as model:
        states: dict[str, np.ndarray] = {}
        for step in range(3):
            out = milexec.run(
                model, {"row": rows[step], "pos": np.array([step], dtype=np.int32)}, states=states
            )
            np.testing.assert_array_equal(out["colsum"], rows[: step + 1, 0].sum(axis=0))
        assert states["cache"].dtype == np.float16
        np.testing.assert_array_equal(states["cache"], rows[:, 0])
        # A given state is used as is; an unknown or mis-shaped one is refused.
        preset = {"cache": np.ones((3, 4), dtype=np.float32)}
        out = milexec.run(model, {"row": rows[0], "pos": np.array([1], dtype=np.int32)}, states=preset)
        np.testing.assert_array_equal(out["colsum"], 2 + rows[0, 0])
        with pytest.raises(MilExecError, match=r"state 'cache': shape \(2, 4\), expected \(3, 4\)"):
            milexec.run(
                model,
                {"row": rows[0], "pos": np.array([0], dtype=np.int32)},
                states={"cache": np.ones((2, 4))},
            )
        with pytest.raises(MilExecError, match="unexpected state 'other'"):
            milexec.run(
                model, {"row": rows[0], "pos": np.array([0], dtype=np.int32)}, states={"other": np.ones(1)}
            )


def test_function_name_selects_a_function() -> None:
    from coremltools.converters.mil.mil import Program

    x = np.ones((2,), dtype=np.float32)
    program = Program()
    program.add_function(
        "double", build_function({"x": x}, lambda v: [mb().mul(x=v["x"], y=np.float32(2), name="y")])
    )
    program.add_function(
        "negate", build_function({"x": x}, lambda v: [mb().mul(x=v["x"], y=np.float32(-1), name="y")])
    )
    assert milexec.run(program, {"x": x}, function_name="negate")["y"].tolist() == [-1, -1]
    assert milexec.run(program, {"x": x}, function_name="double")["y"].tolist() == [2, 2]
    with pytest.raises(MilExecError, match="has no function 'main'"):
        milexec.run(program, {"x": x})


def test_multifunction_package_runs_the_default_or_the_named_function(tmp_path: Path) -> None:
    import coremltools as ct

    x = np.ones((2,), dtype=np.float32)
    packages = []
    for name, factor in (("double", 2.0), ("negate", -1.0)):
        program = build_program({"x": x}, lambda v, f=factor: [mb().mul(x=v["x"], y=np.float32(f), name="y")])
        with converted(program, tmp_path, name=name) as model:
            path = tmp_path / f"{name}_kept.mlpackage"
            model.save(str(path))
            packages.append((name, path))
    descriptor = ct.utils.MultiFunctionDescriptor()
    for name, path in packages:
        descriptor.add_function(str(path), src_function_name="main", target_function_name=name)
    descriptor.default_function_name = "negate"
    combined = tmp_path / "combined.mlpackage"
    ct.utils.save_multifunction(descriptor, str(combined))
    assert milexec.run(combined, {"x": x})["y"].tolist() == [-1, -1]
    assert milexec.run(combined, {"x": x}, function_name="double")["y"].tolist() == [2, 2]
    model = ct.models.MLModel(str(combined), skip_model_load=True, function_name="double")
    result = milexec.run(model, {"x": x}, return_all=True)
    assert result.function_name == "double" and result.outputs["y"].tolist() == [2, 2]


def test_load_program_makes_bool_consts_python_bools(tmp_path: Path) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    program = build_program(
        {"x": x}, lambda v: [mb().reduce_mean(x=v["x"], axes=[1], keep_dims=True, name="m")]
    )
    with converted(program, tmp_path, fp16=False):
        loaded = milexec.load_program(tmp_path / "model.mlpackage")
        keep = next(
            op for op in loaded.functions["main"].operations if op.op_type == "reduce_mean"
        ).keep_dims.val
        assert keep is True
        result = milexec.cross_check(loaded, {"x": x})
    assert result.cross_checked and not result.cross_check_skipped
    np.testing.assert_allclose(result.outputs["m"], x.mean(axis=1, keepdims=True))


def test_load_program_rejects_what_is_not_a_package(tmp_path: Path) -> None:
    with pytest.raises(MilExecError, match="no model package"):
        milexec.load_program(tmp_path / "absent.mlpackage")
    with pytest.raises(MilExecError, match="cannot run a int"):
        milexec.run(3, {})


def test_return_all_exposes_every_value_and_timings() -> None:
    x = np.array([1.0, 2.0], dtype=np.float32)
    function = build_function(
        {"x": x}, lambda v: [mb().exp(x=mb().mul(x=v["x"], y=np.float32(3), name="tripled"), name="e")]
    )
    result = milexec.run(function, {"x": x}, return_all=True)
    assert isinstance(result, milexec.ExecutionResult)
    np.testing.assert_array_equal(result.values["tripled"], [3.0, 6.0])
    np.testing.assert_allclose(result.outputs["e"], np.exp([3.0, 6.0]), rtol=1e-6)
    assert set(result.seconds_by_op_type) == {"mul", "exp"}
    assert result.function_name == "main" and result.precision_model == "declared"


def test_unknown_precision_model_is_refused() -> None:
    with pytest.raises(MilExecError, match="unknown precision_model 'fp8'"):
        milexec.run(affine_program(), {"x_in": np.ones((2, 4))}, precision_model="fp8")  # type: ignore[call-overload]


def test_kernels_register_once_unless_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_mil.milexec.registry import KERNELS

    monkeypatch.setitem(KERNELS, "exp", KERNELS["exp"])
    with pytest.raises(MilExecError, match="already registered"):
        milexec.kernel("exp")(lambda ctx: ctx.val("x"))

    @milexec.kernel("exp", replace=True)
    def doubled(ctx: Any) -> np.ndarray:
        return 2 * ctx.val("x")

    function = build_function({"x": np.ones(2, dtype=np.float32)}, lambda v: [mb().exp(x=v["x"], name="e")])
    assert milexec.run(function, {"x": np.ones(2)})["e"].tolist() == [2.0, 2.0]
