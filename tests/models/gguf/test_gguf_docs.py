"""docs/gguf.md's architectures x types table is generated from the registries."""

from __future__ import annotations

from pathlib import Path

from rlx_mil.models.gguf.codes import FORMATS
from rlx_mil.models.gguf.metadata import ARCHITECTURES
from rlx_mil.models.gguf.support import DOC_PATH, render, support_markdown

ROOT = Path(__file__).resolve().parents[3]


def test_doc_table_is_current() -> None:
    doc = (ROOT / DOC_PATH).read_text(encoding="utf-8")
    assert render(doc) == doc, "docs/gguf.md is stale: run python -m rlx_mil.models.gguf.support --write"


def test_table_lists_every_architecture_and_type() -> None:
    text = support_markdown()
    for arch in ARCHITECTURES:
        assert f"| `{arch}` |" in text
    for name in FORMATS:
        assert f"| {name} |" in text
