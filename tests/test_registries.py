"""The op registries stay complete and mirror each other.

Every IR op has a shape rule, a builder method, a JSON form, a reference kernel, a lowering
rule (or a declared reason why it has none), a catalogue case and a coverage row; its rule and
kernel live in the modules named after its family; and every MIL op its lowering emits has a
milexec kernel. (The package's import structure is checked by tests/test_layering.py.)
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from catalogue import CATALOGUE, CATALOGUE_GROUP, FAMILY_CASES, CatalogueModels

import rlx_mil
from rlx_mil.ir import infer
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import FAMILIES, OP_TYPES, Constant, Input, Op, Param, family_of
from rlx_mil.ir.serde.forms import OP_FORMS
from rlx_mil.lowering.coverage import coverage_markdown
from rlx_mil.lowering.registry import registered_rules
from rlx_mil.milexec import kernels as _kernels  # noqa: F401  (registers every milexec kernel)
from rlx_mil.milexec.registry import KERNELS
from rlx_mil.reference import registry as reference_registry
from rlx_mil.testing import supported_targets

PACKAGE_ROOT = Path(rlx_mil.__file__).parent

#: Ops without a reference kernel, and why.
NO_REFERENCE_KERNEL = {Input: "fed by the evaluator", Param: "bound by the evaluator from params"}
#: Ops the program driver lowers itself instead of a registered rule.
LOWERED_BY_DRIVER = (Input, Param, Constant)
#: Op families with no lowering-rule module (the driver lowers their ops).
DRIVER_FAMILIES = {"leaf"}


def _op_params() -> list[Any]:
    return [pytest.param(cls, id=name) for name, cls in OP_TYPES.items()]


def test_every_family_module_lists_its_ops() -> None:
    for family, module in FAMILIES.items():
        for cls in module.OPS:
            assert family_of(cls) == family, f"{cls.type_name} is listed by {family} but defined elsewhere"
    assert len(OP_TYPES) == sum(len(m.OPS) for m in FAMILIES.values()), "an op type name is used twice"


@pytest.mark.parametrize("op_type", _op_params())
def test_op_has_shape_rule_and_json_form(op_type: type[Op]) -> None:
    assert infer.has_rule(op_type), f"{op_type.type_name} has no shape rule"
    form = OP_FORMS.get(op_type.type_name)
    assert form is not None and form.op_type is op_type, f"{op_type.type_name} has no JSON form"


@pytest.mark.parametrize("op_type", _op_params())
def test_op_has_reference_kernel_in_its_family(op_type: type[Op]) -> None:
    if op_type in NO_REFERENCE_KERNEL:
        return
    kernels = dict(zip(reference_registry.registered_op_types(), map(_kernel_of, reference_registry.registered_op_types()), strict=True))
    assert op_type in kernels, f"{op_type.type_name} has no reference kernel"
    assert kernels[op_type].__module__ == f"rlx_mil.reference.{family_of(op_type)}"


def _kernel_of(op_type: type[Op]) -> Any:
    return reference_registry._KERNELS[op_type]


@pytest.mark.parametrize("op_type", _op_params())
def test_op_has_a_lowering_rule(op_type: type[Op]) -> None:
    if op_type in LOWERED_BY_DRIVER:
        return
    rules = registered_rules()
    assert op_type in rules, f"{op_type.type_name} has no lowering rule"
    assert op_type in reference_registry.registered_op_types(), f"{op_type.type_name} lowers but has no reference"
    info = rules[op_type]
    assert info.family == family_of(op_type)
    assert info.rule.__module__ == f"rlx_mil.lowering.rules.{family_of(op_type)}"


def test_every_family_has_modules_in_each_registry() -> None:
    for family in FAMILIES:
        assert family in FAMILY_CASES, f"no catalogue module tests/catalogue/{family}.py"
        if family not in DRIVER_FAMILIES:
            assert (PACKAGE_ROOT / "lowering" / "rules" / f"{family}.py").is_file(), family
        assert (PACKAGE_ROOT / "reference" / f"{family}.py").is_file(), family


def _builder_methods() -> set[str]:
    return {
        name
        for cls in Graph.__mro__
        if cls.__module__.startswith("rlx_mil.ir.ops.")
        for name, value in vars(cls).items()
        if callable(value) and not name.startswith("_")
    }


def test_every_op_has_a_builder_and_a_catalogue_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the catalogue records which public builder method added each op."""
    builders = _builder_methods()
    built_by: dict[str, set[str]] = {}
    original = Graph.add_node

    def recording(self: Graph, op: Op, *args: Any, **kwargs: Any) -> int:
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_name not in builders:
            frame = frame.f_back  # type: ignore[assignment]
        if frame is not None and frame.f_code.co_filename.startswith(str(PACKAGE_ROOT)):
            built_by.setdefault(op.type_name, set()).add(frame.f_code.co_name)
        return original(self, op, *args, **kwargs)

    monkeypatch.setattr(Graph, "add_node", recording)
    for build in CATALOGUE.values():
        build()
    missing = sorted(set(OP_TYPES) - set(built_by))
    assert not missing, f"ops without a catalogue case built through a builder method: {missing}"


def test_every_op_has_a_coverage_row() -> None:
    rows = {line.split("|")[1].strip() for line in coverage_markdown().splitlines() if line.startswith("| ")}
    assert set(OP_TYPES) <= rows


def _mil_op_types(program: Any) -> Iterator[str]:
    def walk(block: Any) -> Iterator[str]:
        for op in block.operations:
            yield op.op_type
            for inner in op.blocks:
                yield from walk(inner)

    for function in program.functions.values():
        yield from walk(function)


@pytest.mark.xdist_group(CATALOGUE_GROUP)
@pytest.mark.parametrize("case", sorted(CATALOGUE))
def test_executor_runs_every_mil_op_the_lowering_emits(case: str, catalogue_models: CatalogueModels) -> None:
    targets = supported_targets(CATALOGUE[case]())
    assert targets, f"catalogue case {case} does not lower on any target"
    for target in targets:
        for precision in ("fp32", "fp16"):
            lowered = catalogue_models.lowered(case, target, precision)
            missing = sorted({t for t in _mil_op_types(lowered.program) if t != "const" and t not in KERNELS})
            assert not missing, f"{case} on {target.label} {precision}: no milexec kernel for {missing}"
