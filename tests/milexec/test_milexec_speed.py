"""A decoder-sized FLOAT16 program runs through the executor correctly, and prepared runs do no
more widening work than their memory mode says.

The work is counted, not timed: wall-clock bounds fail on a machine whose cores other
processes hold (benchmarks/executor_bench.py measures speed, with the machine's load).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from milexec_decoder import DecoderSpec, build_decoder_program, make_weights, numpy_decoder
from milexec_util import converted

from rlx_mil import milexec
from rlx_mil.milexec import fp16, prepared
from rlx_mil.milexec.kernels import linalg

SMALL = DecoderSpec(layers=4, hidden=256, seq=32, heads=4, ffn=704)


def test_small_decoder_matches_numpy(tmp_path: Path) -> None:
    weights = make_weights(SMALL)
    x = np.random.default_rng(1).standard_normal((1, SMALL.seq, SMALL.hidden)).astype(np.float32)
    with converted(build_decoder_program(SMALL, weights), tmp_path, opset="iOS17", fp16=True) as model:
        linear = [op for op in model._mil_program.functions["main"].operations if op.op_type == "linear"]
        assert len(linear) == 7 * SMALL.layers
        assert all(op.outputs[0].dtype.__name__ == "fp16" for op in linear)
        result = milexec.run(model, {"x": x}, return_all=True)
        y = result.outputs["y"]
        assert y.shape == (1, SMALL.seq, SMALL.hidden) and y.dtype == np.float32
        assert result.nonfinite_origins == []
        expected = numpy_decoder(x, SMALL, weights)
        assert np.linalg.norm(y - expected) / np.linalg.norm(expected) < 1e-2
        for ratio, memory in ((2.0, "fast"), (1.5, "fast"), (0.0, "lean")):
            _check_widening(model, x, y, ratio, memory, weights)


def _check_widening(model: object, x: np.ndarray, y: np.ndarray, ratio: float, memory: str,
                    weights: list[dict[str, np.ndarray]]) -> None:
    """A prepared run gives the plain run's output and widens exactly the weights its budget
    did not cache, each once."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prepared, "FAST_CACHE_RATIO", ratio)
        program = prepared.prepare(model, memory=memory)  # type: ignore[arg-type]
        widened: list[int] = []
        shapes = {w.shape for layer in weights for w in layer.values() if w.ndim == 2}
        for module in (fp16, linalg):
            patch.setattr(module, "widen_into", _counting(module.widen_into, widened, shapes))
        got = program.run({"x": x})["y"]
    np.testing.assert_array_equal(got, y)
    matrices = sum(w.size for layer in weights for name, w in layer.items() if w.ndim == 2)
    assert program.prepared_bytes <= ratio * 2 * matrices
    # Each weight not held as float32 is widened once by the run.
    assert sum(widened) == matrices - program.prepared_bytes // 4
    if ratio == 2.0:
        assert widened == [] and program.prepared_bytes == 4 * matrices


def _counting(widen_into: Callable[[np.ndarray, np.ndarray], np.ndarray], counts: list[int],
              shapes: set[tuple[int, ...]]) -> Callable[..., np.ndarray]:
    """`widen_into` counting the elements of the weights (2-D sources of a weight's shape, or
    row blocks of one) it widens; activations are 3-D here."""
    def counted(source: np.ndarray, out: np.ndarray) -> np.ndarray:
        if source.ndim == 2 and any(source.shape[1] == shape[1] for shape in shapes):
            counts.append(int(source.size))
        return widen_into(source, out)

    return counted
