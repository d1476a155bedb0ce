"""Weights read as `x @ W^T` are stored transposed at translation time (`rlx_mil.coreai.
weight_layout`: Apple's Linux runtime runs `x @ W` about 6x faster than `W @ x^T`): a
`linear` and a `matmul(transpose_y=True)` on a constant, an int4 shift-scale weight and a
4-bit lookup-table weight give NumPy's numbers with no transpose per call, and a tied
embedding (one weight read by `gather` and by `linear`) is still stored once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("coreai", reason="needs the coreai extra: pip install -e \".[coreai]\" (Python >= 3.11)")

import coremltools as ct
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from rlx_mil.coreai import adapter
from rlx_mil.coreai.translate import translate_program

VOCAB, HIDDEN, OUT, BLOCK, ROWS = 256, 64, 96, 16, 3


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    return {
        "embedding": rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32),
        "dense": rng.standard_normal((OUT, HIDDEN)).astype(np.float32),
        "codes": rng.integers(-8, 8, (OUT, HIDDEN)).astype(np.int8),
        "scales": (rng.random((OUT, HIDDEN // BLOCK)) * 0.1 + 0.01).astype(np.float32),
        "indices": rng.integers(0, 16, (OUT, HIDDEN)).astype(np.uint8),
        "lut": rng.standard_normal((OUT // 8, 1, 16, 1)).astype(np.float32),
    }


def _program(w: dict[str, np.ndarray]) -> object:
    @mb.program(input_specs=[mb.TensorSpec((ROWS,), dtype=types.int32)], opset_version=ct.target.iOS18)
    def program(ids: object) -> object:
        table = mb.const(val=w["embedding"], name="embedding")
        h = mb.gather(x=table, indices=ids, axis=0, name="h")
        logits = mb.linear(x=h, weight=table, name="logits")  # tied: the same var
        dense = mb.matmul(x=h, y=mb.const(val=w["dense"]), transpose_y=True, name="dense")
        shift_scale = mb.constexpr_blockwise_shift_scale(
            data=mb.const(val=w["codes"].astype(types.np_int4_dtype)), scale=w["scales"], name="w_int4")
        int4 = mb.linear(x=h, weight=shift_scale, name="int4")
        table4 = mb.constexpr_lut_to_dense(indices=mb.const(val=w["indices"].astype(types.np_uint4_dtype)),
                                           lut=w["lut"], name="w_lut4")
        lut4 = mb.linear(x=h, weight=table4, name="lut4")
        return logits, dense, int4, lut4

    return program


def test_x_at_w_transposed_weights_run_without_per_call_transposes(tmp_path: Path) -> None:
    w = _weights()
    translation = translate_program(_program(w))
    text = translation.builder.text()
    # One transpose: the tied embedding's gathered columns back to rows. The old form
    # ((W @ x^T)^T) had two per linear and one per matmul: seven.
    assert text.count("coreai.transpose") == 1, text.count("coreai.transpose")
    asset = tmp_path / "layout.aimodel"
    translation.builder.save(asset)
    stored = (asset / "main.mlirb").stat().st_size
    one_copy = w["embedding"].nbytes + w["dense"].nbytes + OUT * HIDDEN // 2 * 2 + w["scales"].nbytes + w["lut"].nbytes
    assert stored < one_copy + 20_000, (stored, one_copy)  # a second embedding copy would add 65,536
    ids = np.array([3, 0, VOCAB - 1], np.int32)
    with adapter.LoadedAsset(asset) as loaded:
        got = loaded.call("main", {"ids": ids})
    h = w["embedding"][ids].astype(np.float64)
    int4_weight = w["codes"] * np.repeat(w["scales"], BLOCK, axis=1)
    lut4_weight = w["lut"][np.arange(OUT)[:, None] // 8, 0, w["indices"], 0]
    want = {"logits": h @ w["embedding"].T, "dense": h @ w["dense"].T, "int4": h @ int4_weight.T,
            "lut4": h @ lut4_weight.T}
    for name, value in want.items():
        scale = float(np.max(np.abs(value)))
        assert float(np.max(np.abs(got[name] - value))) <= 1e-5 * scale, name
