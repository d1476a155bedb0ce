"""Issue done-when: on a tiny decoder checkpoint (Hugging Face layout, bfloat16), the compressed
packages' weight bytes against the fp16 package (int4 <= 0.30x, lut4 <= 0.27x, int8 <= 0.55x),
each saved package verified through the executor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.compress import dequantized_params, report_of
from rlx_mil.coreml.package_info import package_info
from rlx_mil.lowering.target import Precision
from rlx_mil.models.pretrained import from_pretrained
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint
from rlx_mil.testing import DEFAULT_TOLERANCES, compare

CONFIG = {**TINY_CONFIGS["llama"], "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
          "num_attention_heads": 4, "num_key_value_heads": 2}
SEQ = 8


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("decoder")
    folder = write_random_checkpoint(root / "llama", CONFIG, dtype="bfloat16")
    graph, params = from_pretrained(folder, seq_len=SEQ)
    plain = rlx_mil.save(rlx_mil.convert(graph, params), root / "fp16.mlpackage")
    return folder, plain


def _inputs() -> dict[str, Any]:
    ids = np.random.default_rng(3).integers(0, CONFIG["vocab_size"], size=(1, SEQ)).astype(np.int32)
    return {"input_ids": ids}


@pytest.mark.parametrize(("preset", "limit"), [("int4", 0.30), ("lut4", 0.27), ("int8", 0.55)])
def test_compressed_package_size_against_fp16(checkpoint: tuple[Path, Path], preset: str, limit: float) -> None:
    folder, plain = checkpoint
    graph, params = from_pretrained(folder, seq_len=SEQ)
    model = rlx_mil.convert(graph, params, compress=preset)
    path = rlx_mil.save(model, folder.parent / f"{preset}.mlpackage", overwrite=True)
    ratio = package_info(path).weight_bytes / package_info(plain).weight_bytes
    assert ratio <= limit, f"{preset}: {ratio:.3f}x the fp16 package's weight bytes"
    report = report_of(model)
    # Every projection, the embedding table and the LM head (2 layers x 7 + 2).
    assert report is not None and len(report.weights) == 2 * 7 + 2
    inputs = _inputs()
    want = reference.evaluate(graph, inputs, dequantized_params(params, model))["logits"]
    ok, _, detail = compare(milexec.run(path, inputs)["logits"], want, DEFAULT_TOLERANCES[Precision.FP16])
    assert ok, detail
    # The compression error itself: logits move, but stay close to the float model's.
    exact = reference.evaluate(graph, inputs, params)["logits"]
    rel = float(np.linalg.norm(want - exact) / np.linalg.norm(exact))
    assert 0 < rel < {"int8": 0.03, "int4": 0.4, "lut4": 0.4}[preset], rel
