"""Every IR op converts for every target it supports (and only with that target's opset);
every other target raises a typed error naming the minimum target. On every target it converts
for, the converted program, run by the executor on the case's random leaves, gives the
reference's numbers within the row's tolerance, or differs exactly where the row says it does
(and why). Every upstream op kind rlx_mil lowers is in some case, so each is checked so."""

from __future__ import annotations

import pytest
from catalogue import (
    CATALOGUE,
    CATALOGUE_GROUP,
    ROWS,
    CatalogueModels,
    all_op_type_names,
    covered_op_types,
    random_leaves,
)

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.coreml.package_info import SPEC_VERSION_TARGETS
from rlx_mil.errors import RlxMilError, UnsupportedOpError
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Precision, Target
from rlx_mil.testing import compare, supported_targets


def test_catalogue_covers_every_op_type() -> None:
    assert covered_op_types() == all_op_type_names()


def test_every_lowered_upstream_kind_is_in_a_catalogue_case() -> None:
    """The 187 upstream kinds: each one rlx_mil lowers is a node of some case (whose numbers the
    test below checks on every target that converts it); the others are refused with a reason
    (tests/test_docs.py)."""
    from rlx_mil.ir.serde.upstream_kinds import UPSTREAM_OP_KINDS
    from rlx_mil.lowering.upstream_coverage import lowered_kinds

    lowered = [kind for kind in UPSTREAM_OP_KINDS if kind in lowered_kinds()]
    assert lowered and not set(lowered) - covered_op_types()


@pytest.mark.xdist_group(CATALOGUE_GROUP)
@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize("target", list(Target), ids=lambda t: t.label)
@pytest.mark.parametrize("case", sorted(CATALOGUE))
def test_converts_on_supported_targets_only(
    case: str, target: Target, precision: str, catalogue_models: CatalogueModels,
) -> None:
    row = ROWS[case]
    graph = row.build()
    inputs, params = random_leaves(graph)
    supported = supported_targets(graph)
    assert supported and supported[0] is row.min_target, f"{case} converts from {supported[:1]}, its row says {row.min_target}"
    if target not in supported:
        with pytest.raises(UnsupportedOpError, match=f"{target.label}"):
            rlx_mil.convert(graph, params, target=target, precision=precision)
        return
    model = catalogue_models.model(case, target, precision)
    spec = model.get_spec()
    # Core ML bumps the specification version when any op needs a newer opset.
    assert SPEC_VERSION_TARGETS[spec.specificationVersion] == target.label
    assert [f.name for f in spec.description.output] == list(catalogue_models.lowered(case, target, "fp16").outputs)
    # Every target: older ones hold other forms (decoded weights, no vector LUT, no fused attention).
    _check_numbers(case, graph, model, inputs, params, Precision.parse(precision))


def _check_numbers(case: str, graph: Graph, model: object, inputs: dict, params: dict, precision: Precision) -> None:
    row = ROWS[case]
    got = milexec.run(model, inputs)
    try:
        want = reference.evaluate(graph, inputs, params)
    except RlxMilError as err:
        assert precision in row.differs, f"{case}: the reference refuses the random leaves: {err}"
        return
    problems = []
    for name, value in want.items():
        ok, _, detail = compare(got[name], value, row.tolerances[precision])
        if not ok:
            problems.append(f"{name}: {detail}")
    if precision in row.differs:
        assert problems, f"{case} {precision.value}: the numbers now match; drop the row's reason ({row.differs[precision]})"
    else:
        assert not problems, f"{case} {precision.value}: " + "; ".join(problems)
