"""What every weights container shares: per-tensor metadata, limits and the lazy Mapping."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from rlx_mil.errors import UnknownTensorError, WeightsFormatError
from rlx_mil.ir.shape import MAX_TENSOR_ELEMENTS

#: NumPy arrays have at most 64 axes; no weight needs more than a handful.
MAX_RANK = 32


@dataclass(frozen=True)
class TensorHeader:
    """A tensor's metadata as its container declares it (validated; data not read)."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    #: The container's own spelling of the dtype: "BF16" (safetensors), "<f4" (.npy).
    format_dtype: str
    #: Byte range of the data: within the data section (safetensors) or the member (.npz).
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def short_repr(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_shape(where: str, shape: object) -> tuple[int, ...]:
    """`shape` as a tuple if it is a list/tuple of non-negative ints within the size limits."""
    if not isinstance(shape, (list, tuple)) or not all(is_int(d) for d in shape):
        raise WeightsFormatError(f"{where}: shape must be a list of non-negative integers, got {short_repr(shape)}")
    dims: Sequence[int] = shape
    if len(dims) > MAX_RANK:
        raise WeightsFormatError(f"{where}: shape has {len(dims)} axes, more than the limit of {MAX_RANK}")
    for dim in dims:
        if dim < 0:
            raise WeightsFormatError(f"{where}: shape {short_repr(list(dims))} has a negative dim")
        if dim > MAX_TENSOR_ELEMENTS:
            raise WeightsFormatError(
                f"{where}: dim {dim} is larger than the tensor size limit of {MAX_TENSOR_ELEMENTS} elements"
            )
    count = math.prod(dims)  # Python ints: no wrap-around
    if count > MAX_TENSOR_ELEMENTS:
        raise WeightsFormatError(
            f"{where}: shape {list(dims)} holds {count} elements, more than the limit of {MAX_TENSOR_ELEMENTS}"
        )
    return tuple(dims)


class LazyTensors(Mapping[str, np.ndarray]):
    """A read-only Mapping from tensor names to arrays, backed by a file.

    The container's metadata was fully validated when it was opened; each tensor is read from
    the file when (and every time) it is accessed, so holding the mapping costs no memory.
    `header(name)`, `shape_of(name)` and `dtype_of(name)` answer without reading data. Close it
    (or use it as a context manager) to release the file early.
    """

    def __init__(self, path: Path, headers: Mapping[str, TensorHeader], metadata: Mapping[str, str]) -> None:
        self.path = path
        self._headers = dict(headers)
        self.metadata: dict[str, str] = dict(metadata)

    # -- Mapping
    def __getitem__(self, name: str) -> np.ndarray:
        return self._read(self.header(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self._headers)

    def __len__(self) -> int:
        return len(self._headers)

    def __contains__(self, name: object) -> bool:
        return name in self._headers

    # -- metadata without reading
    def header(self, name: str) -> TensorHeader:
        try:
            return self._headers[name]
        except (KeyError, TypeError):
            raise UnknownTensorError(f"{self.path}: no tensor named {short_repr(name)}") from None

    def shape_of(self, name: str) -> tuple[int, ...]:
        return self.header(name).shape

    def dtype_of(self, name: str) -> np.dtype[Any]:
        return self.header(name).dtype

    @property
    def nbytes(self) -> int:
        """Bytes of all tensors' data."""
        return sum(h.nbytes for h in self._headers.values())

    # -- lifetime
    def close(self) -> None:
        """Release the file; later reads raise WeightsFormatError."""

    def __enter__(self) -> LazyTensors:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({os.fspath(self.path)!r}, {len(self)} tensors)"

    def _read(self, header: TensorHeader) -> np.ndarray:
        raise NotImplementedError

    def _checked(self, header: TensorHeader, array: np.ndarray) -> np.ndarray:
        """`array` as read, refused if it is not what the validated header promised (the file
        changed underneath) or is a BOOL tensor with bytes other than 0 and 1."""
        if array.dtype != header.dtype or tuple(array.shape) != header.shape:
            raise WeightsFormatError(
                f"{self.path}: tensor {header.name!r}: read {array.dtype}{list(array.shape)} where the header"
                f" declared {header.format_dtype}{list(header.shape)} (did the file change while open?)"
            )
        if array.dtype == np.bool_ and array.size and int(array.view(np.uint8).max()) > 1:
            raise WeightsFormatError(
                f"{self.path}: tensor {header.name!r}: BOOL data holds bytes other than 0 and 1"
            )
        return array
