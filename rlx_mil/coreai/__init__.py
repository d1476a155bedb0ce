"""Apple's Core AI as a second target and a second oracle for rlx_mil's MIL programs.

`translate_program` turns the final MIL program (every function, its states, constexpr
weights and control flow) into a Core AI module, one rule per MIL op type
(`rlx_mil.coreai.registry.RULES`); `run` / `CoreAIProgram` execute a package's program through
`coreai.runtime` (Apple's own kernels, on this Linux CPU too); `crosscheck` compares them with
milexec output by output. Everything that touches `coreai-core` lives in `adapter`.

`coreai-core` is an optional extra (`pip install -e ".[coreai]"`, Python >= 3.11): without it
rlx_mil works as before, and asking for a Core AI feature raises `CoreAIUnavailableError`
saying how to get it.
"""

from __future__ import annotations

from typing import Any

from rlx_mil.coreai.adapter import INSTALL_HINT, PINNED_VERSION, available, require
from rlx_mil.errors import CoreAITranslationError, CoreAIUnavailableError

__all__ = [
    "INSTALL_HINT",
    "PINNED_VERSION",
    "CoreAITranslationError",
    "CoreAIUnavailableError",
    "available",
    "require",
    "run",
]


def run(source: Any, inputs: Any, **kwargs: Any) -> Any:
    """`rlx_mil.coreai.engine.run`: one run of `source`'s program through Core AI's runtime."""
    from rlx_mil.coreai.engine import run as engine_run

    return engine_run(source, inputs, **kwargs)
