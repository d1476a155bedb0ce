"""The weights a compressed model computes with, for the reference evaluator: each compressed
weight decoded from the conversion's own codes (or encoded again from its report entry)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx_mil.compress.code_store import CodeWriter, WriterFactory
from rlx_mil.compress.linear import LinearCodes, quantize_linear
from rlx_mil.compress.lowrank import CorrectedCodes, check_rank_fits, correct
from rlx_mil.compress.palette import PaletteCodes, palettize
from rlx_mil.compress.prequantized import LutScaleCodes, carried_weights
from rlx_mil.compress.report import CompressionReport, WeightReport
from rlx_mil.compress.schemes import LinearScheme, Scheme, parse_scheme
from rlx_mil.errors import CompressionError
from rlx_mil.lowering.target import Precision, Target
from rlx_mil.reference.overlay import OverlaidParams


def store_dtype(precision: Precision) -> type[np.floating[Any]]:
    return np.float16 if precision is Precision.FP16 else np.float32


def encode(storage: np.ndarray, scheme: Scheme, precision: Precision, name: str,
           code_writer: WriterFactory = CodeWriter) -> LinearCodes | PaletteCodes | CorrectedCodes:
    """`scheme`'s codes of `storage` encoded plainly (a low-rank correction fitted unweighted:
    no calibration input here)."""
    if not scheme.rank:
        return plain_encode(storage, scheme, precision, name, code_writer)
    check_rank_fits(scheme, tuple(int(d) for d in np.shape(storage)), name)
    base = plain_encode(storage, scheme, precision, name, code_writer)
    return correct(base, storage, scheme, store_dtype(precision), name)


def plain_encode(storage: np.ndarray, scheme: Scheme, precision: Precision, name: str,
                 code_writer: WriterFactory = CodeWriter) -> LinearCodes | PaletteCodes:
    """`scheme`'s codes of `storage` encoded plainly, without any low-rank correction it names."""
    quantize: Any = quantize_linear if isinstance(scheme, LinearScheme) else palettize
    return quantize(storage, dataclasses.replace(scheme, rank=0) if scheme.rank else scheme, store_dtype(precision), name,
                    code_writer)


class DequantizedParams(OverlaidParams):
    """`params` with every compressed weight replaced by its dequantized values (float32, in
    the Param's shape), computed when read: what the compressed model computes with, for the
    reference evaluator."""

    def __init__(
        self, params: Mapping[str, Any], report: CompressionReport,
        codes: Mapping[str, LinearCodes | PaletteCodes | LutScaleCodes | CorrectedCodes] | None = None,
        remember: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(params)
        #: Codes encoded here go into `remember` (and are decoded from it next time): a weight
        #: read twice (the reference reads each param more than once per run, and --verify
        #: builds a new graph per step) is encoded once. Codes are a fraction of the weight.
        self._remember = remember if remember is not None else {}
        self._codes = codes if codes is not None else self._remember
        self._prequantized = carried_weights(params)
        self._precision = Precision.parse(report.precision)
        self._target = Target.parse(report.target)
        self._entries: dict[str, WeightReport] = {}
        for w in report.weights:
            prev = self._entries.get(w.name)
            if prev is not None and (prev.scheme, prev.layout) != (w.scheme, w.layout):
                raise CompressionError(
                    f"weight {w.name!r} is compressed in two layouts ({prev.layout}, {w.layout}); its dequantized"
                    " values differ per use"
                )
            self._entries[w.name] = w

    def __getitem__(self, name: str) -> np.ndarray:
        entry = self._entries.get(name)
        held = self._codes.get(name) if entry is not None else None
        if entry is not None and held is not None:  # the conversion's own codes: decoded, not encoded again
            back = held.dequantize()
            shape_of = getattr(self._params, "shape_of", None)  # a GGUF file's: without decoding the tensor
            shape = tuple(shape_of(name)) if shape_of is not None else np.shape(self._params[name])
            return (back.reshape(back.shape[-2:]).T if entry.layout == "kn" else back).reshape(shape)
        source = self._prequantized.get(name)
        if entry is not None and source is not None and entry.scheme == source.label:
            return source.encode(store_dtype(self._precision), CodeWriter, self._target).dequantize()
        value = self._params[name]
        if entry is None:
            return np.asarray(value) if not isinstance(value, np.ndarray) else value
        scheme = parse_scheme(entry.scheme)
        assert scheme is not None
        arr = np.asarray(value)
        codes = encode(arr.reshape(arr.shape[-2:]).T if entry.layout == "kn" else arr, scheme, self._precision, name)
        self._remember[name] = codes
        back = codes.dequantize()
        return back.T.reshape(arr.shape) if entry.layout == "kn" else back

    def _overlaid(self, name: str) -> bool:
        return name in self._entries
