"""Element types of the RLX IR (spec section 1.3)."""

from __future__ import annotations

import enum

import numpy as np


class DType(enum.Enum):
    """IR element type. The enum value is the upstream JSON spelling."""

    F32 = "F32"
    F16 = "F16"
    BF16 = "BF16"
    F64 = "F64"
    I8 = "I8"
    I16 = "I16"
    I32 = "I32"
    I64 = "I64"
    U8 = "U8"
    U32 = "U32"
    BOOL = "Bool"
    C64 = "C64"
    #: Complex f64 (newest upstream only); parsed, but outside the subset rlx_mil converts.
    C128 = "C128"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F16, DType.BF16, DType.F64)

    @property
    def is_int(self) -> bool:
        return self in (DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U32)

    @property
    def is_complex(self) -> bool:
        return self in (DType.C64, DType.C128)

    @property
    def numpy(self) -> np.dtype:
        """The NumPy dtype holding values of this type.

        BF16 has no NumPy dtype; its values are held as float32 (already rounded to bf16).
        """
        if self.is_complex:
            raise TypeError(f"{self.value} is outside the rlx_mil IR subset")
        return np.dtype(_NUMPY[self])

    @classmethod
    def parse(cls, text: str | DType | np.dtype | type) -> DType:
        """Accept `DType`, the JSON spelling, pyrlx spellings (`f32`, `float16`, `half`...)
        or a NumPy dtype."""
        if isinstance(text, DType):
            return text
        if isinstance(text, str):
            key = text.strip()
            for member in cls:
                if member.value == key:
                    return member
            alias = _ALIASES.get(key.lower())
            if alias is not None:
                return alias
            raise ValueError(f"unknown dtype {text!r}")
        np_dtype = np.dtype(text)
        for member, name in _NUMPY.items():
            if np.dtype(name) == np_dtype and member is not DType.BF16:
                return member
        raise ValueError(f"no IR dtype for NumPy dtype {np_dtype}")


_ITEMSIZE = {
    DType.F32: 4, DType.F16: 2, DType.BF16: 2, DType.F64: 8,
    DType.I8: 1, DType.I16: 2, DType.I32: 4, DType.I64: 8,
    DType.U8: 1, DType.U32: 4, DType.BOOL: 1, DType.C64: 8, DType.C128: 16,
}

_NUMPY = {
    DType.F32: "float32", DType.F16: "float16", DType.BF16: "float32", DType.F64: "float64",
    DType.I8: "int8", DType.I16: "int16", DType.I32: "int32", DType.I64: "int64",
    DType.U8: "uint8", DType.U32: "uint32", DType.BOOL: "bool",
}

_ALIASES = {
    "f32": DType.F32, "float32": DType.F32, "float": DType.F32,
    "f16": DType.F16, "float16": DType.F16, "half": DType.F16,
    "bf16": DType.BF16, "bfloat16": DType.BF16,
    "f64": DType.F64, "float64": DType.F64, "double": DType.F64,
    "i8": DType.I8, "int8": DType.I8, "u8": DType.U8, "uint8": DType.U8,
    "i16": DType.I16, "int16": DType.I16, "i32": DType.I32, "int32": DType.I32,
    "u32": DType.U32, "uint32": DType.U32, "i64": DType.I64, "int64": DType.I64,
    "bool": DType.BOOL,
}
