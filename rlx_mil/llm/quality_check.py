"""Quality of a compressed decoder package against the original model, measured once per
conversion on text (docs/compression.md, "Quality check").

The checkpoint's plain prefill graph runs in the NumPy reference over the check text twice:
with the original weights (a Hugging Face checkpoint's float weights; for a GGUF file, the
float model its own codes decode to) and with the weights the package computes with (its
compression report's codes, decoded). `rlx_mil.compress.quality_check.judge_outputs` then
gives teacher-forced top-1, mean KL and perplexity ratio. The text is the user's
(``--compress-calibration`` text), else the built-in held-out English text, tokenized with the
model's own tokenizer; a model without one is checked on generated token ids.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.compress.builtin_text import CHECK_TOKENS, builtin_text
from rlx_mil.compress.quality import DEFAULT_THRESHOLDS, QualityThresholds
from rlx_mil.compress.quality_check import QualityCheck, judge_outputs, warn_below_threshold
from rlx_mil.errors import RlxMilError
from rlx_mil.units import counted

#: (source, variant, **build options) -> (graph, params), as `from_pretrained` / `from_gguf`.
Loader = Callable[..., tuple[Any, Any]]


def check_text_ids(tokenizer_folder: str | os.PathLike[str] | None, text: str | None = None,
                   max_tokens: int = CHECK_TOKENS) -> tuple[list[int], str] | None:
    """(token ids, how the check names them): `text` (else the built-in held-out text)
    encoded by the tokenizer in `tokenizer_folder`, at most `max_tokens`; None without a
    tokenizer there."""
    from rlx_mil.llm.text import TextTokenizer

    if tokenizer_folder is None or not (Path(tokenizer_folder) / "tokenizer.json").is_file():
        return None
    tokenizer = TextTokenizer(tokenizer_folder)
    ids = tokenizer.encode(text if text is not None else builtin_text("heldout"))[:max_tokens]
    where = "the given text" if text is not None else "the built-in held-out English text"
    return ids, f"{counted(len(ids), 'token')} of {where}"


def gguf_check_text_ids(path: str | os.PathLike[str], text: str | None = None) -> tuple[list[int], str] | None:
    """`check_text_ids` with the tokenizer a GGUF file carries (None when it has none)."""
    from rlx_mil.coreml.scratch import scratch_dir
    from rlx_mil.models.gguf.reader import GGUFFile
    from rlx_mil.models.gguf.tokenizer import has_tokenizer, write_tokenizer_files

    file = GGUFFile(path)
    if not has_tokenizer(file):
        return None
    with tempfile.TemporaryDirectory(prefix="rlx_mil_check_text_", dir=scratch_dir()) as folder:
        write_tokenizer_files(file, folder)
        return check_text_ids(folder, text)


def generated_ids(vocab: int, count: int = 64, seed: int = 0) -> tuple[list[int], str]:
    """Token ids drawn uniformly below `vocab` (a model without a tokenizer)."""
    rng = np.random.default_rng(seed)
    return [int(i) for i in rng.integers(0, vocab, count)], f"{count} generated token ids (no tokenizer)"


def measure_decoder_quality(
    source: str | os.PathLike[str],
    compression: Any,
    ids: Sequence[int],
    inputs_label: str,
    *,
    loader: Loader,
    compared_with: str = "the float checkpoint",
    text: bool = True,
    codes: Any = None,
    thresholds: QualityThresholds = DEFAULT_THRESHOLDS,
    stored: Any = None,
) -> QualityCheck:
    """The compressed weights (`compression`: the package's `CompressionReport`) against the
    original ones, teacher-forced over `ids` in the NumPy reference. `loader(source, "prefill",
    seq_len=...)` gives the plain graph and the original weights (a GGUF file's params read as
    the float its codes decode to, whatever they were re-quantized to). The compressed side
    computes with `stored` (a saved package's `StoredWeights`: its own codes, decoded) when
    given, else with `codes` (the conversion's, by weight name) decoded, the others encoded
    again."""
    from rlx_mil.compress import dequantized_params
    from rlx_mil.compress.report import worst_weights
    from rlx_mil.reference import evaluate

    if len(ids) < 2:
        raise RlxMilError(f"the quality check needs at least 2 tokens of text, got {len(ids)}")
    feeds = {"input_ids": np.asarray([list(ids)], np.int32)}
    graph, params = loader(source, "prefill", seq_len=len(ids))
    want = np.asarray(evaluate(graph, feeds, params)["logits"], np.float32)
    if stored is not None:
        from rlx_mil.milexec.stored_weights import PackageParams

        compressed: Any = PackageParams(params, stored)
    else:
        compressed = dequantized_params(params, compression, codes)
    got = np.asarray(evaluate(graph, feeds, compressed)["logits"], np.float32)
    return judge_outputs({"logits": want}, {"logits": got}, feeds, compared_with=compared_with, inputs_label=inputs_label,
                         worst=worst_weights(compression), text=text, thresholds=thresholds)


def check_and_warn(check: QualityCheck) -> QualityCheck:
    """`check`, after warning when it crossed a threshold."""
    warn_below_threshold(check, stacklevel=3)
    return check
