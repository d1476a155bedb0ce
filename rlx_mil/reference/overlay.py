"""A params mapping with some weights replaced by values computed when read (a compressed
model's dequantized weights, a package's decoded ones), telling every param's shape and dtype
without reading it, so `evaluate` reads each weight at its use and lets it go."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np


class OverlaidParams(Mapping[str, Any]):
    """`params`, with the names `_overlaid` says yes to read through the subclass's
    `__getitem__` (float32, in the param's shape); the rest are `params`' own."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        self._params = params

    def _overlaid(self, name: str) -> bool:
        raise NotImplementedError

    def __contains__(self, name: object) -> bool:  # without decoding the weight (Mapping's would)
        return name in self._params

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def shape_of(self, name: str) -> tuple[int, ...]:
        """A param's shape, nothing read where `params` tells it (a lazy checkpoint or file)."""
        meta = getattr(self._params, "shape_of", None)
        return tuple(int(d) for d in meta(name)) if callable(meta) else tuple(np.shape(self._params[name]))

    def dtype_of(self, name: str) -> np.dtype[Any]:
        """float32 for a replaced weight (what it decodes to), else `params`' dtype."""
        if self._overlaid(name):
            return np.dtype(np.float32)
        meta = getattr(self._params, "dtype_of", None)
        return np.dtype(meta(name)) if callable(meta) else np.asarray(self._params[name]).dtype


class ReplacedParams(OverlaidParams):
    """`params` with some names' values given outright (held as they are: their own shapes and
    dtypes); the rest are `params`' own, told without reading them."""

    def __init__(self, params: Mapping[str, Any], values: Mapping[str, Any]) -> None:
        super().__init__(params)
        self._values = dict(values)

    def _overlaid(self, name: str) -> bool:
        return name in self._values

    def __getitem__(self, name: str) -> Any:
        return self._values[name] if name in self._values else self._params[name]

    def __contains__(self, name: object) -> bool:
        return name in self._values or name in self._params

    def shape_of(self, name: str) -> tuple[int, ...]:
        return tuple(np.shape(self._values[name])) if name in self._values else super().shape_of(name)

    def dtype_of(self, name: str) -> np.dtype[Any]:
        return np.asarray(self._values[name]).dtype if name in self._values else super().dtype_of(name)
