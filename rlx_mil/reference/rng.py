"""Reference kernels of the random ops: upstream's CPU stream, vectorised (spec part 2, section 8).

`philox_u32(seed, count)` is upstream's Philox4x32-10 variant (multiplier 0xD2561A75, not the
standard 0xD2511F53, section 9 Q39): a 128-bit counter from 0, one block of four u32 per
counter value, consumed in order. RngNormal/RngUniform use `combine_seed(42, key)`; Sample
uses its own `seed` (0 means 0xDEADBEEF) with one stream shared by the rows in order.
`sample_distribution` gives the categorical distribution Sample draws each row from, which is
what a converted model (whose generator differs) can be checked against.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx_mil.ir.ops import RngNormal, RngUniform, Sample
from rlx_mil.ir.ops.rng import GLOBAL_SEED
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import finish, reference_kernel, static_sizes

_MASK = np.uint64(0xFFFFFFFF)
_M0, _M1 = np.uint64(0xD2561A75), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_GOLDEN = 0x9E3779B97F4A7C15
#: Sample's replacement for seed 0.
SAMPLE_DEFAULT_SEED = 0xDEADBEEF


def combine_seed(global_seed: int, key: int) -> int:
    return (global_seed + key * _GOLDEN) % 2**64


def philox_u32(seed: int, count: int) -> np.ndarray:
    """The first `count` u32 of the stream seeded with the u64 `seed`."""
    blocks = -(-count // 4)
    counter = np.arange(blocks, dtype=np.uint64)
    c = [counter & _MASK, counter >> np.uint64(32), np.zeros(blocks, np.uint64), np.zeros(blocks, np.uint64)]
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    for _ in range(10):
        p0 = c[0] * _M0
        p1 = c[2] * _M1
        c = [
            (p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0),
            p1 & _MASK,
            (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1),
            p0 & _MASK,
        ]
        k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
    return np.stack(c, axis=1).reshape(-1)[:count].astype(np.uint32)


def philox_f32(seed: int, count: int) -> np.ndarray:
    """`next_f32` draws: (u32 >> 8) / 2^24 in [0, 1)."""
    return ((philox_u32(seed, count) >> np.uint32(8)).astype(np.float32) / np.float32(2**24)).astype(np.float32)


def philox_normal(seed: int, count: int) -> np.ndarray:
    """Box-Muller from pairs of draws; the sine half is discarded (two draws per sample)."""
    draws = philox_f32(seed, 2 * count).reshape(count, 2)
    u1 = np.maximum(draws[:, 0], np.finfo(np.float32).tiny)
    u2 = draws[:, 1]
    radius = np.sqrt(np.float32(-2.0) * np.log(u1))
    return (radius * np.cos(np.float32(2 * np.pi) * u2)).astype(np.float32)


@reference_kernel(RngNormal)
def _rng_normal(op: RngNormal, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    sizes = static_sizes(out, "RngNormal")
    z = philox_normal(combine_seed(GLOBAL_SEED, op.key), int(np.prod(sizes)))
    return finish((np.float32(op.mean) + np.float32(op.scale) * z).reshape(sizes), out)


@reference_kernel(RngUniform)
def _rng_uniform(op: RngUniform, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    sizes = static_sizes(out, "RngUniform")
    u = philox_f32(combine_seed(GLOBAL_SEED, op.key), int(np.prod(sizes)))
    low, high = np.float32(op.low), np.float32(op.high)
    return finish((low + u * (high - low)).reshape(sizes), out)


def sample_distribution(logits: np.ndarray, *, top_k: int, top_p: float, temperature: float) -> np.ndarray:
    """Per row, the probabilities Sample draws from (`[B, V]`, rows summing to 1)."""
    x = np.asarray(logits, dtype=np.float32)
    x = x[None] if x.ndim == 1 else x
    result = np.zeros(x.shape, np.float32)
    for r, row in enumerate(x):
        with np.errstate(over="ignore", invalid="ignore"):
            z = row / np.float32(max(temperature, 1e-6))
        vocab = z.size
        if 0 < top_k < vocab:
            threshold = np.sort(z)[::-1][top_k - 1]
            z = np.where(z < threshold, np.float32(-np.inf), z)  # ties at the threshold are kept
        p = np.exp(z - z.max())
        p = p / p.sum()
        if top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            keep_n = int(np.searchsorted(np.cumsum(p[order]), np.float32(top_p))) + 1
            keep = np.zeros(vocab, bool)
            keep[order[:keep_n]] = True
            p = np.where(keep, p, 0.0)
            p = p / p.sum()
        result[r] = p
    return result


@reference_kernel(Sample)
def _sample(op: Sample, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    probabilities = sample_distribution(inputs[0], top_k=op.top_k, top_p=op.top_p, temperature=op.temperature)
    draws = philox_f32(SAMPLE_DEFAULT_SEED if op.seed == 0 else op.seed, probabilities.shape[0])
    ids = np.empty(probabilities.shape[0], np.float32)
    for r, (p, u) in enumerate(zip(probabilities, draws, strict=True)):
        hit = np.nonzero(u <= np.cumsum(p))[0]
        ids[r] = hit[0] if hit.size else p.size - 1  # inverse CDF in index order
    return finish(ids, out)
