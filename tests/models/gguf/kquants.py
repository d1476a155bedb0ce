"""Bit-level block writers for the llama.cpp types `gguf.quants.quantize` cannot make (the
K-quants and IQ4_NL / IQ4_XS), written from the block layouts in llama.cpp's `ggml-common.h`.

They do not search for the best codes: every field of every block (codes, sub-block scales
and mins, high bits) is drawn at random — so every bit pattern occurs, zero sub-scales with
non-zero mins included — and the super-block scales `d` / `dmin` are chosen so the decoded
weights have about the spread of the float weights they stand for. What a model computes
with is then the `gguf` package's decode of these bytes, which the tests take as the truth.
"""

from __future__ import annotations

import zlib

import numpy as np

#: type -> (bytes per 256-or-32-element block, elements, [(byte offset of an f16 scale,
#: its size relative to the weights' spread)], the rest random).
LAYOUTS: dict[str, tuple[int, int, list[tuple[int, float]]]] = {
    # block_q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin
    "Q2_K": (84, 256, [(80, 1 / 45), (82, 1 / 15)]),
    # block_q3_K: hmask[32], qs[64], scales[12] (6-bit, minus 32), d
    "Q3_K": (110, 256, [(108, 1 / 128)]),
    # block_q4_K: d, dmin, scales[12] (6-bit scales and mins), qs[128]
    "Q4_K": (144, 256, [(0, 1 / 945), (2, 1 / 63)]),
    # block_q5_K: d, dmin, scales[12], qh[32], qs[128]
    "Q5_K": (176, 256, [(0, 1 / 1953), (2, 1 / 63)]),
    # block_q6_K: ql[128], qh[64], scales[16] (int8), d
    "Q6_K": (210, 256, [(208, 1 / 4096)]),
    # block_iq4_nl: d, qs[16] (indices into the 16-value code book)
    "IQ4_NL": (18, 32, [(0, 1 / 127)]),
    # block_iq4_xs: d, scales_h (u16), scales_l[4], qs[128]
    "IQ4_XS": (136, 256, [(0, 1 / 4064)]),
}


def encode(values: np.ndarray, type_name: str, seed: int = 0) -> np.ndarray:
    """Blocks of `type_name` for a `[rows, K]` weight of about `values`' spread."""
    if type_name not in LAYOUTS:
        raise NotImplementedError(type_name)
    nbytes, elems, scales = LAYOUTS[type_name]
    rows, k = values.shape
    rng = np.random.default_rng([seed, zlib.crc32(np.ascontiguousarray(values).tobytes())])
    blocks = rng.integers(0, 256, (rows * (k // elems), nbytes), dtype=np.uint8)
    spread = 3.0 * float(np.std(values)) or 1.0
    for offset, factor in scales:
        d = (spread * factor * rng.uniform(0.5, 1.5, blocks.shape[0])).astype("<f2")
        blocks[:, offset:offset + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)
