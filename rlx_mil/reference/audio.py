"""Reference kernel of LogMel (part-2 spec 5.12)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import ShapeError
from rlx_mil.ir.ops import LogMel
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import finish, float_operands, reference_kernel

#: Floor of the mel energies before the log (Whisper's).
MEL_FLOOR = 1e-10
#: Dynamic range kept below each frame's peak, in decades.
DYNAMIC_RANGE = 8.0


def log_mel(spectrum: np.ndarray, filters: np.ndarray) -> np.ndarray:
    spec, bank = float_operands(spectrum, filters)
    n_fft = spec.shape[-1] // 2
    bins = n_fft // 2 + 1
    if spec.shape[-1] % 2 or n_fft < 1 or bank.ndim != 2 or bank.shape[1] != bins:
        raise ShapeError(
            f"spectrum [..., 2 * n_fft] {list(spec.shape)} needs filters [n_mels, {bins}], got {list(bank.shape)}",
            operand="filters",
        )
    dt = spec.dtype.type
    real, imag = spec[..., :bins], spec[..., n_fft:n_fft + bins]
    with np.errstate(all="ignore"):
        mel = (real * real + imag * imag) @ bank.T
        levels = np.log10(np.maximum(mel, dt(MEL_FLOOR)))
        # Clamped per frame (upstream's rule; Whisper clamps at the whole spectrogram's max).
        levels = np.maximum(levels, levels.max(axis=-1, keepdims=True) - dt(DYNAMIC_RANGE))
        return (levels + dt(4)) / dt(4)


@reference_kernel(LogMel)
def _log_mel(op: LogMel, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(log_mel(inputs[0], inputs[1]), out)
