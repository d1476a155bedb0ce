"""Audio front ends: LogMel (part-2 spec section 5.12)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import DTypeError, ShapeError
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import BinaryArityOp, collect_ops
from rlx_mil.ir.serde.codecs import unit_form
from rlx_mil.ir.serde.versions import NEWEST
from rlx_mil.ir.shape import Shape, Static
from rlx_mil.ir.shape_checks import require_rank


@dataclass(frozen=True)
class LogMel(BinaryArityOp):
    """Whisper-style log-mel features of an FFT in RLX block layout.

    `spectrum [..., 2 * n_fft]` holds the real parts of all n_fft bins, then the imaginary
    parts; `filters [n_mels, n_fft / 2 + 1]`. Per frame: power of the one-sided bins, mel
    projection, `log10(max(mel, 1e-10))`, clamped at the FRAME's max - 8 (upstream's rule,
    part-2 spec 9 Q31; Whisper clamps at the whole spectrogram's max), then `(l + 4) / 4`.
    """

    type_name: ClassVar[str] = "LogMel"

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("spectrum", "filters")


@shape_rule(LogMel)
def _log_mel(op: LogMel, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    spectrum, filters = ins
    for shape, operand in ((spectrum, "spectrum"), (filters, "filters")):
        if shape.dtype is not DType.F32:
            raise DTypeError(f"{operand} must be F32 (as upstream requires), got {shape.dtype.value}", operand=operand)
    require_rank(spectrum, "spectrum", minimum=1)
    require_rank(filters, "filters", exact=(2,))
    width = spectrum.dims[-1]
    if not isinstance(width, Static) or width.size < 2 or width.size % 2:
        raise ShapeError(
            f"spectrum's last dim must be a static, even 2 * n_fft >= 2 (real parts, then imaginary), got {spectrum}",
            operand="spectrum",
        )
    bins = width.size // 4 + 1
    if filters.dims[1] != Static(bins):
        raise ShapeError(
            f"filters must be [n_mels, n_fft / 2 + 1 = {bins}] for n_fft = {width.size // 2}, got {filters}",
            operand="filters",
        )
    return Shape((*spectrum.dims[:-1], filters.dims[0]), DType.F32)


class AudioBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def log_mel(self, spectrum: int, filters: int, *, name: str | None = None) -> int:
        """Log-mel features (Whisper scaling, per-frame max - 8 clamp) of a block-layout FFT."""
        return self.add_node(LogMel(), [spectrum, filters], name=name)


#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (newest upstream only).
JSON_FORMS = (unit_form(LogMel, since=NEWEST),)
