"""The reference's vectorised Philox stream against a block-by-block formulation of upstream's
generator (spec part 2, section 8.1), and the Sample algorithm's draws."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_mil import reference
from rlx_mil.ir.graph import Graph
from rlx_mil.reference.rng import combine_seed, philox_f32, philox_normal, philox_u32

_MASK = 0xFFFFFFFF


def one_block(counter: int, seed: int) -> list[int]:
    words = [(counter >> (32 * i)) & _MASK for i in range(4)]
    key = [seed & _MASK, seed >> 32 & _MASK]
    for _ in range(10):
        lo_product, hi_product = words[0] * 0xD2561A75, words[2] * 0xCD9E8D57
        words = [
            (hi_product >> 32) ^ words[1] ^ key[0],
            hi_product & _MASK,
            (lo_product >> 32) ^ words[3] ^ key[1],
            lo_product & _MASK,
        ]
        words = [w & _MASK for w in words]
        key = [(key[0] + 0x9E3779B9) & _MASK, (key[1] + 0xBB67AE85) & _MASK]
    return words


@pytest.mark.parametrize("seed", [0, 42, 0xDEADBEEF, 2**64 - 1, combine_seed(42, 1234567)])
def test_stream_matches_block_by_block(seed: int) -> None:
    want = [w for counter in range(5) for w in one_block(counter, seed)]
    np.testing.assert_array_equal(philox_u32(seed, 18), np.array(want[:18], np.uint32))


def test_floats_and_normals_follow_the_stream() -> None:
    u = philox_u32(7, 8)
    np.testing.assert_array_equal(philox_f32(7, 8), (u >> 8).astype(np.float32) / np.float32(2**24))
    f = philox_f32(7, 8).reshape(4, 2)
    want = np.sqrt(-2 * np.log(np.maximum(f[:, 0], np.finfo(np.float32).tiny))) * np.cos(2 * np.pi * f[:, 1])
    np.testing.assert_allclose(philox_normal(7, 4), want, rtol=1e-5, atol=1e-6)
    assert combine_seed(42, 1) == (42 + 0x9E3779B97F4A7C15) % 2**64


def test_rng_normal_uses_the_combined_seed() -> None:
    g = Graph()
    g.set_outputs([g.rng_normal([2, 3], 1.0, 2.0, key=5, name="out")])
    got = reference.evaluate(g, {})["out"]
    np.testing.assert_allclose(got, (1.0 + 2.0 * philox_normal(combine_seed(42, 5), 6)).reshape(2, 3), rtol=1e-6)


def test_sample_draws_one_shared_stream_in_row_order() -> None:
    """Row r uses draw r of Philox(seed) (seed 0 means 0xDEADBEEF); inverse CDF in index order."""
    logits = np.zeros((6, 4), np.float32)  # uniform over 4 tokens
    g = Graph()
    g.set_outputs([g.sample(g.input("l", [6, 4]), seed=0, name="out")])
    got = reference.evaluate(g, {"l": logits})["out"]
    u = philox_f32(0xDEADBEEF, 6)
    np.testing.assert_array_equal(got, np.searchsorted(np.array([0.25, 0.5, 0.75, 1.0]), u, side="left"))
