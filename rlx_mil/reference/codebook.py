"""Reference kernels of SynthMatMul and SynthReconstruct: the weight rebuilt from the codebook,
then (SynthMatMul) `x @ W^T` in float32."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import EvaluationError
from rlx_mil.ir.ops.codebook import SynthKind, SynthMatMul, SynthReconstruct
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import finish, float_operands, reference_kernel


def synth_weight(kind: SynthKind, indices: np.ndarray, codebook: np.ndarray) -> np.ndarray:
    """`W [n, k]` with `W[j, b*entry_dim + t] = codebook[indices[j, b], t]`."""
    idx = np.asarray(indices)
    if idx.dtype.kind == "f":
        if not np.isfinite(idx).all():
            raise EvaluationError("SynthMatMul indices must be finite", ["NaN/inf index"])
        idx = np.trunc(idx)
    idx = idx.astype(np.int64)
    bad = (idx < 0) | (idx >= kind.num_entries)
    if bad.any():
        raise EvaluationError("codebook index out of range",
                              [f"{int(bad.sum())} indices outside [0, {kind.num_entries}), e.g. {int(idx[bad][0])}"])
    return np.asarray(codebook)[idx].reshape(idx.shape[0], idx.shape[1] * kind.entry_dim)


@reference_kernel(SynthMatMul)
def _synth_matmul(op: SynthMatMul, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x, indices, codebook = inputs
    xv, cb = float_operands(x, codebook)
    return finish(xv @ synth_weight(op.kind, indices, cb).T, out)


@reference_kernel(SynthReconstruct)
def _synth_reconstruct(op: SynthReconstruct, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    indices, codebook = inputs
    return finish(synth_weight(op.kind, indices, codebook), out)
