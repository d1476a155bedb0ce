"""Deployment targets and compute precision."""

from __future__ import annotations

import enum
from typing import Any

from rlx_mil.errors import InvalidOptionError


class Target(enum.IntEnum):
    """Minimum deployment target. The value orders targets (iOS15 < iOS16 < ... < iOS26).

    iOS26 (Core ML specification 10, coremltools 9.0's `ct.target.iOS26`) has iOS18's op set;
    what differs is how Core ML runs it: a `constexpr_lut_to_dense` feeding a
    `constexpr_blockwise_shift_scale` keeps that order (coremltools re-orders it before iOS26,
    `canonicalize_quantized_lut_pattern`), which GGUF codes use (`rlx_mil.models.gguf.codes`).
    """

    IOS15 = 15
    IOS16 = 16
    IOS17 = 17
    IOS18 = 18
    IOS26 = 26

    @property
    def label(self) -> str:
        return f"iOS{self.value}"

    @property
    def ct_target(self) -> Any:
        import coremltools as ct

        return getattr(ct.target, self.label)

    @staticmethod
    def parse(value: str | int | Target | Any) -> Target:
        if isinstance(value, Target):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and value in {t.value for t in Target}:
            return Target(value)
        text = str(getattr(value, "name", value)).strip().lower()
        for t in Target:
            if text in (t.label.lower(), t.name.lower(), str(t.value)):
                return t
        raise InvalidOptionError(f"unknown target {value!r}; choose one of {', '.join(t.label for t in Target)}")


class Precision(enum.Enum):
    FP16 = "fp16"
    FP32 = "fp32"

    @property
    def ct_precision(self) -> Any:
        import coremltools as ct

        return ct.precision.FLOAT16 if self is Precision.FP16 else ct.precision.FLOAT32

    @staticmethod
    def parse(value: str | Precision) -> Precision:
        if isinstance(value, Precision):
            return value
        text = str(value).strip().lower()
        aliases = {"fp16": Precision.FP16, "float16": Precision.FP16, "f16": Precision.FP16,
                   "fp32": Precision.FP32, "float32": Precision.FP32, "f32": Precision.FP32}
        if text not in aliases:
            raise InvalidOptionError(f"unknown precision {value!r}; choose 'fp16' or 'fp32'")
        return aliases[text]
