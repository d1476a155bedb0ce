"""A decoder-sized FLOAT16 program runs through the executor quickly and correctly.

A 4-layer, hidden-256 stack, and the full-size program (16 layers, hidden 1024, seq 128, SwiGLU
2816), which must run in well under a minute on a 2-core machine: measured ~2.7 s on an idle box
(plus ~5-9 s for weights and ~4-12 s for ct.convert).
The bounds are loose because OpenBLAS threads slow down badly when other processes hold the
cores (see docs/milexec.md).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from milexec_decoder import DecoderSpec, build_decoder_program, make_weights, numpy_decoder
from milexec_util import converted

from rlx_mil import milexec

SMALL = DecoderSpec(layers=4, hidden=256, seq=32, heads=4, ffn=704)
FULL = DecoderSpec(layers=16, hidden=1024, seq=128, heads=16, ffn=2816)


def check_decoder(spec: DecoderSpec, tmp_path: Path, seconds: float) -> None:
    weights = make_weights(spec)
    x = np.random.default_rng(1).standard_normal((1, spec.seq, spec.hidden)).astype(np.float32)
    with converted(build_decoder_program(spec, weights), tmp_path, opset="iOS17", fp16=True) as model:
        linear = [op for op in model._mil_program.functions["main"].operations if op.op_type == "linear"]
        assert len(linear) == 7 * spec.layers
        assert all(op.outputs[0].dtype.__name__ == "fp16" for op in linear)
        start = time.perf_counter()
        result = milexec.run(model, {"x": x}, return_all=True)
        elapsed = time.perf_counter() - start
    y = result.outputs["y"]
    assert y.shape == (1, spec.seq, spec.hidden) and y.dtype == np.float32
    assert result.nonfinite_origins == []
    expected = numpy_decoder(x, spec, weights)
    assert np.linalg.norm(y - expected) / np.linalg.norm(expected) < 1e-2
    assert elapsed < seconds, f"{spec} took {elapsed:.1f} s"


def test_small_decoder_runs_fast_and_matches_numpy(tmp_path: Path) -> None:
    check_decoder(SMALL, tmp_path, seconds=10.0)


def test_full_size_decoder_runs_in_well_under_a_minute(tmp_path: Path) -> None:
    check_decoder(FULL, tmp_path, seconds=45.0)
