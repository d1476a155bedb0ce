"""Issue done-when: on a tiny decoder checkpoint, the compressed packages' weight bytes against
the fp16 package (int4 <= 0.30x, lut4 <= 0.27x, int8 <= 0.55x), each verified through the
executor on the saved package."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.compress import dequantized_params, report_of
from rlx_mil.lower.target import Precision
from rlx_mil.models.transformer import DecoderConfig, example_inputs, llama_decoder, random_params
from rlx_mil.package_info import package_info
from rlx_mil.testing import DEFAULT_TOLERANCES, compare
from rlx_mil.weights import load_params, save_safetensors

CONFIG = DecoderConfig(hidden=128, heads=4, kv_heads=2, intermediate=256, layers=2, seq=16)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("decoder")
    graph = llama_decoder(CONFIG)
    save_safetensors(random_params(graph, CONFIG), root / "model.safetensors")
    plain = rlx_mil.save(rlx_mil.convert(graph, load_params(root / "model.safetensors")), root / "fp16.mlpackage")
    return root, plain


@pytest.mark.parametrize(("preset", "limit"), [("int4", 0.30), ("lut4", 0.27), ("int8", 0.55)])
def test_compressed_package_size_against_fp16(checkpoint: tuple[Path, Path], preset: str, limit: float) -> None:
    root, plain = checkpoint
    graph = llama_decoder(CONFIG)
    params = load_params(root / "model.safetensors")
    model = rlx_mil.convert(graph, params, compress=preset)
    path = rlx_mil.save(model, root / f"{preset}.mlpackage", overwrite=True)
    ratio = package_info(path).weight_bytes / package_info(plain).weight_bytes
    assert ratio <= limit, f"{preset}: {ratio:.3f}x the fp16 package's weight bytes"
    report = report_of(model)
    assert report is not None and len(report.weights) == 7 * CONFIG.layers
    inputs = example_inputs(CONFIG)
    want = reference.evaluate(graph, inputs, dequantized_params(params, model))["out"]
    ok, _, detail = compare(milexec.run(path, inputs)["out"], want, DEFAULT_TOLERANCES[Precision.FP16])
    assert ok, detail
    # The compression error itself: outputs move, but stay close to the float model's.
    exact = reference.evaluate(graph, inputs, params)["out"]
    rel = float(np.linalg.norm(want - exact) / np.linalg.norm(exact))
    assert 0 < rel < {"int8": 0.02, "int4": 0.3, "lut4": 0.3}[preset], rel
