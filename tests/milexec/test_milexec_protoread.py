"""Packages read straight from their protobuf (`rlx_mil.milexec.protoread`): the same ops, vars,
const values and run results as coremltools' milproto loader (`load_program`) gives, weights
mapped and shared between functions, and coremltools' loader deciding what the reader declines."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from milexec_catalogue import CASES, Case, Floats
from milexec_util import build_program

from rlx_mil import milexec
from rlx_mil.errors import MilExecError
from rlx_mil.llm.package import convert_llm_checkpoint
from rlx_mil.milexec.light import LightProgram
from rlx_mil.milexec.loader import load_program, mapped_file
from rlx_mil.milexec.prepared import prepare
from rlx_mil.milexec.protoread import read_program
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint


def _dims(var: Any) -> tuple[Any, ...]:
    return tuple(int(d) if isinstance(d, (int, np.integer)) else "?" for d in var.shape)


def _var(var: Any) -> tuple[Any, ...]:
    from coremltools.converters.mil.mil import types

    kind = "state" if types.is_state(var.sym_type) else "tensor" if types.is_tensor(var.sym_type) else "scalar"
    return var.name, types.builtin_to_string(var.dtype), _dims(var), kind


def _made_up(name: str) -> str:
    """A name without the count pymil appends to the names it makes up (counted per process)."""
    return re.sub(r"_\d+$", "", name)


def _names(value: Any) -> Any:
    return tuple(v.name for v in value) if isinstance(value, (list, tuple)) else value.name


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    x, y = np.asarray(a), np.asarray(b)
    return (type(a) is type(b) and x.dtype == y.dtype and x.shape == y.shape
            and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"))


def assert_same_program(pymil: Any, light: LightProgram) -> None:
    """Every function, op (type, definition, inputs, outputs) and const value alike; the names
    pymil makes up (defaults, `write_state`) alike up to their count."""
    assert list(light.functions) == list(pymil.functions) or set(light.functions) == set(pymil.functions)
    assert light.default_function_name == pymil.default_function_name
    for name, theirs in pymil.functions.items():
        ours = light.functions[name]
        assert list(ours.inputs) == list(theirs.inputs)
        assert [_var(v) for v in ours.inputs.values()] == [_var(v) for v in theirs.inputs.values()]
        assert len(ours.operations) == len(theirs.operations)
        for a, b in zip(theirs.operations, ours.operations, strict=True):
            assert (b.op_type, b.op_class.__module__) == (a.op_type, type(a).__module__)
            assert _made_up(b.name) == _made_up(a.name)
            assert {k: _names(v) for k, v in b.inputs.items()} == {k: _names(v) for k, v in a.inputs.items()}, a.name
            assert [_var(v) for v in b.outputs] == [_var(v) for v in a.outputs], a.name
            assert [len(v.child_ops) for v in b.outputs] == [len(v.child_ops) for v in a.outputs], a.name
            if a.op_type == "const":
                assert _same_value(b.outputs[0].val, a.outputs[0].val), a.name
        assert [v.name for v in ours.outputs] == [v.name for v in theirs.outputs]


def _save(case: Case, folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    import coremltools as ct

    feeds, build = case.make(Floats(np.dtype(np.float32)))
    with np.errstate(over="ignore"):
        program = build_program(feeds, build, case.opset)
    path = folder / f"{case.label}.mlpackage"
    # No passes: the package holds the ops as built (defaults given, constexpr ops unfolded).
    ct.convert(program, convert_to="mlprogram", minimum_deployment_target=getattr(ct.target, case.opset),
               pass_pipeline=ct.PassPipeline.EMPTY, skip_model_load=True, package_dir=str(path))
    return path, feeds


def _assert_same_outputs(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key], equal_nan=a[key].dtype.kind == "f"), key


#: Catalogue cases no package can hold (their uint1 mask is a program output).
UNSAVED = {"constexpr_lut_to_sparse", "constexpr_sparse_blockwise_shift_scale"}


@pytest.mark.parametrize("case", [c for c in CASES if c.label not in UNSAVED], ids=lambda c: c.label)
def test_every_catalogue_op_reads_and_runs_as_coremltools_loads_it(case: Case, tmp_path: Path) -> None:
    """One package per catalogue case (every op type with a value_inference, each opset): read
    alike, and prepared runs from either load give the same outputs."""
    path, feeds = _save(case, tmp_path)
    light, pymil = read_program(path), load_program(path)
    if case.op_type == "cond":  # nested blocks: left to coremltools' loader
        assert light is None
        return
    assert light is not None
    assert_same_program(pymil, light)
    with np.errstate(all="ignore"):
        _assert_same_outputs(prepare(path).run(feeds), prepare(pymil).run(feeds))


def test_a_declined_package_loads_through_coremltools(tmp_path: Path) -> None:
    case = next(c for c in CASES if c.op_type == "cond")
    path, feeds = _save(case, tmp_path)
    assert read_program(path) is None
    program = prepare(path)
    assert not isinstance(program.program, LightProgram)
    _assert_same_outputs(program.run(feeds), milexec.run(path, feeds))


@pytest.fixture(scope="module")
def llm_packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("protoread")
    config = dict(TINY_CONFIGS["qwen3"], vocab_size=4096)  # weights past WIDEN_MIN and the map's 1 MiB
    checkpoint = write_random_checkpoint(folder / "qwen3", config, seed=5)
    packages = {}
    for kind, options in {"fp16": {}, "int4": {"compress": "int4"}}.items():
        path = folder / f"{kind}.mlpackage"
        convert_llm_checkpoint(checkpoint, path, max_context=32, prefill=[4], **options)  # type: ignore[arg-type]
        packages[kind] = path
    return packages


@pytest.mark.parametrize("kind", ["fp16", "int4"])
def test_stateful_multifunction_packages_read_alike_and_share_mapped_weights(
    llm_packages: dict[str, Path], kind: str
) -> None:
    path = llm_packages[kind]
    light = read_program(path)
    assert light is not None and set(light.functions) == {"decode", "prefill_4"}
    assert_same_program(load_program(path), light)
    # Weights are views of the mapped weight file (unpacked int4 excepted), one array per blob
    # for both functions.
    weights: dict[str, dict[int, np.ndarray]] = {}
    for name, function in light.functions.items():
        for op in function.operations:
            value = op.outputs[0].val
            if op.op_type == "const" and isinstance(value, np.ndarray) and value.nbytes >= 1 << 10:
                assert value.dtype.metadata is not None or mapped_file(value) is not None, op.name
                weights.setdefault(name, {})[id(value)] = value
    largest = max(weights["decode"].values(), key=lambda v: v.nbytes)
    assert largest.nbytes >= 1 << 17 and id(largest) in weights["prefill_4"]
    assert len(set(weights["decode"]) & set(weights["prefill_4"])) >= len(weights["decode"]) // 2
    assert read_program(path, ["decode"]) is not None and list(read_program(path, ["decode"]).functions) == ["decode"]


@pytest.mark.parametrize("kind", ["fp16", "int4"])
@pytest.mark.parametrize("memory", ["fast", "lean"])
def test_runs_from_either_load_are_equal(llm_packages: dict[str, Path], kind: str, memory: str) -> None:
    path = llm_packages[kind]
    ours = prepare(path, memory=memory)  # type: ignore[arg-type]
    theirs = prepare(load_program(path), memory=memory)  # type: ignore[arg-type]
    assert isinstance(ours.program, LightProgram) and not isinstance(theirs.program, LightProgram)
    mine: dict[str, np.ndarray] = {}
    other: dict[str, np.ndarray] = {}
    calls = [("prefill_4", [5, 17, 300, 4000], 0), ("decode", [9], 4), ("decode", [11], 5)]
    for function, tokens, position in calls:
        feeds = {"input_ids": np.array([tokens], np.int32),
                 "position_ids": np.arange(position, position + len(tokens), dtype=np.int32)[None],
                 "cache_position": np.array([position], np.int32)}
        _assert_same_outputs(ours.run(feeds, function_name=function, states=mine),
                             theirs.run(feeds, function_name=function, states=other))
        _assert_same_outputs(mine, other)


def test_only_the_functions_asked_for_are_read(llm_packages: dict[str, Path]) -> None:
    program = prepare(llm_packages["fp16"], functions=["decode"])
    assert program.functions == ("decode",) and list(program.program.functions) == ["decode"]
    with pytest.raises(MilExecError, match="no prepared function 'prefill_4'"):
        program.run({}, function_name="prefill_4")


def test_plain_runs_of_a_package_read_it_from_the_protobuf(llm_packages: dict[str, Path],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`milexec.run(path)` reads the package itself (every value alike to a run of the pymil
    program); `cross_check` still loads pymil ops, which its value_inference needs."""
    from rlx_mil.milexec import loader

    path = llm_packages["fp16"]
    feeds = {"input_ids": np.array([[5, 17, 300, 4000]], np.int32), "position_ids": np.arange(4, dtype=np.int32)[None],
             "cache_position": np.array([0], np.int32)}
    theirs = milexec.run(load_program(path), feeds, function_name="prefill_4", states={}, return_all=True)

    def refused(*_: Any) -> Any:
        raise AssertionError("loaded through coremltools' milproto loader")

    with monkeypatch.context() as patched:
        patched.setattr(loader, "_program_from_model", refused)
        ours = milexec.run(path, feeds, function_name="prefill_4", states={}, return_all=True)
        with pytest.raises(AssertionError, match="milproto loader"):
            milexec.cross_check(path, feeds, function_name="prefill_4")
    _assert_same_outputs(ours.outputs, theirs.outputs)
    assert list(ours.outputs) == ["logits"] and ours.values.keys() == theirs.values.keys()
    for key, value in theirs.values.items():
        assert np.array_equal(ours.values[key], value, equal_nan=value.dtype.kind == "f"), key
    _assert_same_outputs(ours.states, theirs.states)
