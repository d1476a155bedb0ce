"""Re-quantizing a GGUF file's quantized tensors with one of rlx_mil's compression schemes:
for a device whose weight form is not the file's (the Neural Engine's per-channel forms,
`convert-gguf --deploy ane`: `ANE_SCHEME`) or for a smaller package (`--requantize Q6_K=lut6`).

A re-quantized tensor is decoded exactly as llama.cpp decodes it (`gguf.quants.dequantize`)
a slab of rows at a time, when the compressor reads those rows, and encoded by
`rlx_mil.compress` (`palettize` / `quantize_linear`): one tensor is in float at a time, never
the model, and never the whole tensor unless its scheme needs it (a per-tensor LUT). The
report gives its error against llama.cpp's decode (`max.err`), as for the kept codes.

`requantize` specs: a scheme alone (`"lut4"`: every quantized tensor), or `TYPE=SCHEME` pairs
joined by commas (`"Q6_K=lut6,Q5_K=lut6"`), or a mapping type -> scheme; schemes as
`compress=` writes them (docs/compression.md), types as llama.cpp names them. The scheme
`"compress"` (`COMPRESS`, alone or for a type) hands those tensors to the conversion's own
`compress=` as float weights instead: llama.cpp's decode of each, made when the compressor
reads it (one tensor at a time), planned like any checkpoint's float weight — what
`convert-gguf --deploy ane` does with the measured `auto4` plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx_mil.compress.code_store import WriterFactory, release_pages
from rlx_mil.compress.fit import fit_to_shape
from rlx_mil.compress.linear import LinearCodes, quantize_linear
from rlx_mil.compress.palette import PaletteCodes, palettize
from rlx_mil.compress.schemes import LinearScheme, PaletteScheme, Scheme, parse_scheme
from rlx_mil.errors import InvalidOptionError
from rlx_mil.lowering.target import Target

#: Rows decoded at a time are bounded by this many elements.
SLAB_ELEMENTS = 1 << 20
#: `requantize` scheme handing a type's tensors to the conversion's `compress=` as float weights.
COMPRESS = "compress"
#: The fixed per-type Neural Engine scheme `convert-gguf --deploy ane` used before it planned
#: with `auto4` (`--requantize` still takes it). What it re-quantizes each type to, in the forms the Neural Engine holds (per output
#: channel, no per-block ints): types of 5 bits or more to int8 per output channel (about the
#: source's own error), 4 bits and fewer to one table on max-normalised rows with a per-channel
#: scale (`lut4-scaled`). Measured on SmolLM2-135M-Instruct's Q4_1 / Q8_0 file (docs/compression.md,
#: "Devices"): teacher-forced top-1 0.52 (perplexity x1.96), where `lut4` for every tensor kept
#: 0.15 (perplexity x18).
ANE_SCHEME = ("Q8_0=int8,Q6_K=int8,Q5_0=int8,Q5_1=int8,Q5_K=int8,"
              "Q4_0=lut4-scaled,Q4_1=lut4-scaled,Q4_K=lut4-scaled,IQ4_NL=lut4-scaled,IQ4_XS=lut4-scaled,"
              "Q3_K=lut4-scaled,Q2_K=lut4-scaled")


def parse_requantize(spec: str | Mapping[str, str] | None, types: frozenset[str]) -> dict[str, Scheme]:
    """GGUF type -> scheme from a `requantize` spec (see the module doc); `types` are the
    quantized types a file can hold. Types given to `COMPRESS` are not in it
    (`compressed_types`). A bad type or scheme is an `InvalidOptionError` naming `requantize`."""
    return {kind: _scheme(written, where) for kind, (written, where) in _written(spec, types).items()
            if written != COMPRESS}


def compressed_types(spec: str | Mapping[str, str] | None, types: frozenset[str]) -> frozenset[str]:
    """The GGUF types a `requantize` spec hands to the conversion's `compress=` (`COMPRESS`)."""
    return frozenset(kind for kind, (written, _) in _written(spec, types).items() if written == COMPRESS)


def _written(spec: str | Mapping[str, str] | None, types: frozenset[str]) -> dict[str, tuple[str, str]]:
    """GGUF type -> (its scheme as written, where the spec says it), every type checked."""
    if spec is None:
        return {}
    if isinstance(spec, str):
        pairs = [p.strip() for p in spec.split(",") if p.strip()]
        if not pairs:
            return {}
        if len(pairs) == 1 and "=" not in pairs[0]:  # one scheme for every type
            if pairs[0] != COMPRESS:
                _scheme(pairs[0], pairs[0])
            return dict.fromkeys(sorted(types), (pairs[0], pairs[0]))
        mapping: dict[str, str] = {}
        for pair in pairs:
            kind, sep, written = pair.partition("=")
            if not sep:
                raise InvalidOptionError(f"requantize: {pair!r} is not TYPE=SCHEME (e.g. 'Q6_K=lut6'), nor one scheme alone")
            mapping[kind.strip()] = written.strip()
    else:
        mapping = {str(k): str(v) for k, v in spec.items()}
    out: dict[str, tuple[str, str]] = {}
    for kind, written in mapping.items():
        if kind not in types:
            raise InvalidOptionError(f"requantize: {kind!r} is not a quantized GGUF type rlx_mil reads"
                                     f" ({', '.join(sorted(types))})")
        if written != COMPRESS:
            _scheme(written, f"{kind}={written}")
        out[kind] = (written, f"{kind}={written}")
    return out


def _scheme(written: str, where: str) -> Scheme:
    try:
        scheme = parse_scheme(written)
    except InvalidOptionError as err:
        raise InvalidOptionError(f"requantize {where}: {err}") from None
    if not isinstance(scheme, LinearScheme | PaletteScheme):
        raise InvalidOptionError(f"requantize {where}: give a scheme (e.g. lut4, lut6, int8-block32)"
                                 f" or {COMPRESS!r} (the conversion's compress= plans them), not 'none'")
    return scheme


class DecodedRows:
    """A quantized GGUF tensor `[N, K]` whose rows are decoded (float32, llama.cpp's decode)
    when sliced; what the compress encoders read instead of a float array."""

    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(self, raw_rows: np.ndarray, type_name: str, shape: tuple[int, int]) -> None:
        self._raw = raw_rows
        self._type_name = type_name
        self.shape = shape

    def reshape(self, *shape: Any) -> DecodedRows:
        wanted = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else tuple(shape)
        if wanted not in (self.shape, (self.shape[0], -1)):
            raise ValueError(f"a decoded GGUF tensor {list(self.shape)} is read as rows only, not as {list(wanted)}")
        return self

    def __getitem__(self, rows: slice) -> np.ndarray:
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import dequantize

        raw = np.ascontiguousarray(self._raw[rows])
        values = dequantize(raw, GGMLQuantizationType[self._type_name])
        return np.asarray(values, np.float32).reshape(-1, self.shape[1])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[0:self.shape[0]]
        return out if dtype is None else out.astype(dtype)


def _max_error(codes: LinearCodes | PaletteCodes, rows: DecodedRows) -> float:
    """max |decoded codes - llama.cpp's decode|, a slab of rows at a time for palettes. The
    code store's pages the comparison read are dropped again (they would stay resident)."""
    try:
        return _worst(codes, rows)
    finally:
        release_pages(codes.data if isinstance(codes, LinearCodes) else codes.indices)


def _worst(codes: LinearCodes | PaletteCodes, rows: DecodedRows) -> float:
    n, k = rows.shape
    if isinstance(codes, LinearCodes):
        return float(np.max(np.abs(codes.dequantize().reshape(n, k) - np.asarray(rows)))) if n * k else 0.0
    per_group = n // codes.lut.shape[0]
    step = max(per_group, SLAB_ELEMENTS // max(k, 1) // per_group * per_group)
    lut = codes.lut.astype(np.float32)
    worst = 0.0
    for r0 in range(0, n, step):
        idx = np.asarray(codes.indices[r0:r0 + step]).astype(np.int64)
        group = (np.arange(r0, r0 + idx.shape[0]) // per_group)[:, None]
        values = lut[group, idx]
        if codes.channel_scale is not None:  # `lutN-scaled`: the table's values times the row's scale
            values = values * codes.channel_scale[r0:r0 + idx.shape[0], None].astype(np.float32)
        worst = max(worst, float(np.max(np.abs(values - rows[r0:r0 + step]))))
    return worst


def requantized(raw_rows: np.ndarray, type_name: str, shape: tuple[int, int], scheme: Scheme,
                store: type[np.floating[Any]], code_writer: WriterFactory, name: str) -> LinearCodes | PaletteCodes:
    """The codes of GGUF tensor `name` (`raw_rows`: its blocks as `[N, row bytes]`) re-quantized
    with `scheme` (fitted to its shape), with their max error against llama.cpp's decode."""
    rows = DecodedRows(raw_rows, type_name, shape)
    fitted, _ = fit_to_shape(scheme, shape, Target.IOS18)
    weight: Any = rows
    if isinstance(fitted, PaletteScheme):
        palette = palettize(weight, fitted, store, name, code_writer, slab_elements=SLAB_ELEMENTS)
        palette.max_error = _max_error(palette, rows)
        return palette
    assert isinstance(fitted, LinearScheme)
    linear = quantize_linear(weight, fitted, store, name, code_writer)
    linear.max_error = _max_error(linear, rows)
    return linear
