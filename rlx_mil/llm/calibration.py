"""The built-in calibration text for autoN when the user gives none.

A decoder checkpoint with a tokenizer is calibrated on the built-in English text's
*calibration* part (`rlx_mil.compress.builtin_text`; the quality check measures on the other,
held-out part): its token ids run through the checkpoint's plain (stateless) graph, whatever
graph the conversion builds (a stateful decode step takes one token), so autoN's sensitivities
are the mean KL of real next-token distributions and its activation statistics those of text,
not of generated token ids.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

#: Calibration tokens autoN's measurements run over (each measurement is one reference run).
CALIBRATION_TOKENS = 128


def builtin_calibration(
    model_dir: str | os.PathLike[str], tokens: int = CALIBRATION_TOKENS, loader: Any = None,
) -> tuple[dict[str, np.ndarray], Any, Any] | None:
    """(calibration inputs, the plain graph they feed, its params) for the decoder checkpoint
    in `model_dir`: the built-in calibration text tokenized by its tokenizer (at most `tokens`
    ids) and its stateless graph over them (`loader`, default `from_pretrained`; of its params
    only those shaped for its length, the RoPE tables, are read: the conversion's own weights
    are measured). None without a tokenizer, when the checkpoint has no plain token graph, or
    when the graph has no logits output."""
    from rlx_mil.compress.builtin_text import builtin_text
    from rlx_mil.llm.text import TextTokenizer

    if not (Path(model_dir) / "tokenizer.json").is_file():
        return None
    ids = TextTokenizer(model_dir).encode(builtin_text("calibration"))[:tokens]
    if len(ids) < 2:
        return None
    if loader is None:
        from rlx_mil.models.pretrained import from_pretrained as loader
    from rlx_mil.errors import RlxMilError

    try:
        graph, params = loader(model_dir, "prefill", seq_len=len(ids))
    except RlxMilError:  # not a checkpoint with a plain token graph (e.g. a vision model): as before
        return None
    from rlx_mil.ir.naming import output_names

    if not any("logits" in name for name in output_names(graph)):
        return None
    row = np.asarray([ids], np.int32)
    return {"input_ids": row, "attention_mask": np.ones_like(row), "token_type_ids": np.zeros_like(row)}, graph, params
