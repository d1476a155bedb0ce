"""What docs/coreai.md says Core AI cannot run here, for the tests that hold it to the truth."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "coreai.md"


def documented_cannot_run() -> dict[str, set[str]]:
    """kind ('catalogue case', 'upstream fixture') -> the names docs/coreai.md lists between its
    `coreai-cannot-run` markers, one `* <kind> `name`: why` line each."""
    text = DOC.read_text()
    block = text.split("<!-- coreai-cannot-run -->", 1)[1].split("<!-- /coreai-cannot-run -->", 1)[0]
    listed: dict[str, set[str]] = {"catalogue case": set(), "upstream fixture": set()}
    for kind, name in re.findall(r"^\* (catalogue case|upstream fixture) `([^`]+)`:", block, re.MULTILINE):
        listed[kind].add(name)
    return listed

