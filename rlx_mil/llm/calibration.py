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

#: Calibration tokens autoN's measurements score (each measurement is one reference run).
CALIBRATION_TOKENS = 128


def calibration_tokens(config: Any) -> int:
    """The built-in calibration's length for `config` (a `CompressionConfig` as its deployment
    form makes it; None: none): `CALIBRATION_TOKENS`, and as many again before them when autoN
    fits codes (`fit=`): the fit sees those, the measurements score the others
    (`rlx_mil.compress.sensitivity.held_apart`)."""
    from rlx_mil.compress.sensitivity import FIT_SHARE

    if config is not None and config.auto is not None and config.fit not in (None, "off"):
        return round(CALIBRATION_TOKENS / (1 - FIT_SHARE))
    return CALIBRATION_TOKENS


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


def gguf_calibration(
    path: str | os.PathLike[str], text: str | None = None, tokens: int = CALIBRATION_TOKENS,
) -> tuple[dict[str, np.ndarray], Any, Any] | None:
    """`builtin_calibration` for a GGUF file: `text` (else the built-in calibration text)
    tokenized by the tokenizer the file carries, at most `tokens` ids, and the file's plain
    graph over them (its quantized tensors read as float weights, `requantize="compress"`: of
    its params only the RoPE tables are read). None when the file has no tokenizer or the text
    gives fewer than 2 tokens."""
    import tempfile

    from rlx_mil.compress.builtin_text import builtin_text
    from rlx_mil.coreml.scratch import scratch_dir
    from rlx_mil.llm.text import TextTokenizer
    from rlx_mil.models.gguf import from_gguf
    from rlx_mil.models.gguf.reader import GGUFFile
    from rlx_mil.models.gguf.requantize import COMPRESS
    from rlx_mil.models.gguf.tokenizer import has_tokenizer, write_tokenizer_files

    file = GGUFFile(path)
    if not has_tokenizer(file):
        return None
    with tempfile.TemporaryDirectory(prefix="rlx_mil_calibration_", dir=scratch_dir()) as folder:
        write_tokenizer_files(file, folder)
        ids = TextTokenizer(folder).encode(builtin_text("calibration") if text is None else text)[:tokens]
    if len(ids) < 2:
        return None
    graph, params = from_gguf(path, "prefill", seq_len=len(ids), requantize=COMPRESS)
    row = np.asarray([ids], np.int32)
    return {"input_ids": row, "attention_mask": np.ones_like(row), "token_type_ids": np.zeros_like(row)}, graph, params


def gguf_compress(compress: Any, path: str | os.PathLike[str], *, deploy: str = "plain", text: str | None = None) -> Any:
    """`compress` (any form `rlx_mil.convert` takes; `4bit` / `auto4` as `deploy`'s) with the
    GGUF file's calibration (`gguf_calibration`) when it measures or fits codes (`autoN`,
    `fit=`) and brings none of its own: with `from_gguf(path, ..., requantize="compress")`,
    `convert(graph, params, deploy="ane", compress=gguf_compress("auto4", path, deploy="ane"))`
    is `convert-gguf --deploy ane`. Without such a need (or a tokenizer in the file) the config
    is returned without calibration."""
    import dataclasses

    from rlx_mil.compress import parse_compress
    from rlx_mil.coreml.deploy import DeployForm
    from rlx_mil.coreml.deploy.compression import form_compression

    config = parse_compress(form_compression(compress, DeployForm.parse(deploy)))
    if config is None or config.calibration is not None or (config.auto is None and config.fit in (None, "off")):
        return config
    found = gguf_calibration(path, text, calibration_tokens(config))
    if found is None:
        return config
    return dataclasses.replace(config, calibration=found[0], calibration_graph=found[1], calibration_params=found[2])
