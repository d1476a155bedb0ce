"""Every IR op converts for every target it supports (and only with that target's opset);
every other target raises a typed error naming the minimum target."""

from __future__ import annotations

import pytest
from catalogue import (
    CATALOGUE,
    CATALOGUE_GROUP,
    CatalogueModels,
    all_op_type_names,
    covered_op_types,
    random_leaves,
)

import rlx_mil
from rlx_mil.coreml.package_info import SPEC_VERSION_TARGETS
from rlx_mil.errors import UnsupportedOpError
from rlx_mil.lowering.target import Target
from rlx_mil.testing import supported_targets


def test_catalogue_covers_every_op_type() -> None:
    assert covered_op_types() == all_op_type_names()


@pytest.mark.xdist_group(CATALOGUE_GROUP)
@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize("target", list(Target), ids=lambda t: t.label)
@pytest.mark.parametrize("case", sorted(CATALOGUE))
def test_converts_on_supported_targets_only(
    case: str, target: Target, precision: str, catalogue_models: CatalogueModels,
) -> None:
    graph = CATALOGUE[case]()
    _, params = random_leaves(graph)
    if target not in supported_targets(graph):
        with pytest.raises(UnsupportedOpError, match=f"{target.label}"):
            rlx_mil.convert(graph, params, target=target, precision=precision)
        return
    spec = catalogue_models.model(case, target, precision).get_spec()
    # Core ML bumps the specification version when any op needs a newer opset.
    assert SPEC_VERSION_TARGETS[spec.specificationVersion] == target.label
    assert [f.name for f in spec.description.output] == list(catalogue_models.lowered(case, target, "fp16").outputs)
