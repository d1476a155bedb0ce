"""Generated documentation must be current."""

from __future__ import annotations

from pathlib import Path

from rlx_mil.lowering.coverage import DOC_PATH, coverage_markdown

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_op_coverage_doc_is_generated_from_the_registry() -> None:
    doc = REPO_ROOT / DOC_PATH
    assert doc.is_file(), "docs/op-coverage.md is missing: run python -m rlx_mil.lowering.coverage --write"
    assert doc.read_text() == coverage_markdown(), (
        "docs/op-coverage.md is stale: run python -m rlx_mil.lowering.coverage --write"
    )


def test_op_coverage_doc_lists_every_op() -> None:
    from rlx_mil.ir.ops import OP_TYPES

    text = coverage_markdown()
    for name in OP_TYPES:
        assert f"| {name} |" in text


def test_every_upstream_kind_is_lowered_or_refused_with_its_reason() -> None:
    from rlx_mil.ir.serde.forms import UNSUPPORTED_UPSTREAM_OPS
    from rlx_mil.ir.serde.upstream_kinds import UPSTREAM_OP_KINDS
    from rlx_mil.lowering.upstream_coverage import BY_NAME, REFUSED, lowered_kinds

    lowered = lowered_kinds()
    unlowered = set(UPSTREAM_OP_KINDS) - lowered
    assert len(UPSTREAM_OP_KINDS) == 187
    assert unlowered == set(REFUSED) | set(BY_NAME), (
        f"without a reason: {sorted(unlowered - set(REFUSED) - set(BY_NAME))}; lowered but still given a reason: "
        f"{sorted((set(REFUSED) | set(BY_NAME)) - unlowered)}"
    )
    assert not set(REFUSED) & set(BY_NAME)
    assert UNSUPPORTED_UPSTREAM_OPS <= unlowered
    text = coverage_markdown()
    for kind in UPSTREAM_OP_KINDS:
        label = "lowered" if kind in lowered else "by name" if kind in BY_NAME else "refused"
        assert f"| {kind} | {label} |" in text
