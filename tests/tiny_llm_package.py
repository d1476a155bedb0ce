"""A tiny stateful LLM package (decode plus one prefill bucket) of a random Llama-style
checkpoint, for the tests that drive packages with hostile inputs. Import from test modules as
``from tiny_llm_package import ...`` (``tests/`` is on ``sys.path``)."""

from __future__ import annotations

import warnings
from pathlib import Path

from rlx_mil.llm.package import convert_llm_checkpoint
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

CFG = TINY_CONFIGS["llama"]
VOCAB: int = CFG["vocab_size"]
MAX_CONTEXT = 16
BUCKET = 4


def tiny_checkpoint(folder: Path, seed: int) -> Path:
    return write_random_checkpoint(folder / "llama", CFG, seed=seed)


def tiny_stateful_package(checkpoint: Path, folder: Path) -> Path:
    """fp32 package with `decode` and `prefill_{BUCKET}`, cache of MAX_CONTEXT tokens (its
    Neural Engine warnings, expected for these sizes, silenced)."""
    out = folder / "llm.mlpackage"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convert_llm_checkpoint(checkpoint, out, max_context=MAX_CONTEXT, prefill=[BUCKET], precision="fp32")
    return out
