"""RoPE cos/sin tables for the Rope op, with the rope_scaling kinds the configs name."""

from __future__ import annotations

import math

import numpy as np

from rlx_mil.models.hf_config import RopeSpec


def inverse_frequencies(rope: RopeSpec) -> np.ndarray:
    """`[rotary_dim / 2]` angular frequencies (float64), after rope_scaling."""
    inv = rope.theta ** (-np.arange(0, rope.rotary_dim, 2, dtype=np.float64) / rope.rotary_dim)
    if rope.freq_factors is not None:
        inv = inv / np.asarray(rope.freq_factors, np.float64)
    if rope.scaling == "linear":
        return inv / rope.factor
    if rope.scaling == "llama3":
        # Llama 3.1: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
        old = rope.original_max_position_embeddings
        low_wavelen = old / rope.low_freq_factor
        high_wavelen = old / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / rope.factor, inv)
        smooth = (old / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, blended, scaled)
    return inv


def rope_tables(rope: RopeSpec, head_dim: int, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin `[positions, head_dim / 2]` float32 for positions 0..positions-1.

    Columns beyond `rotary_dim / 2` (partial rotary) are never read by the Rope op; they hold
    the identity rotation.
    """
    angles = np.arange(positions, dtype=np.float64)[:, None] * inverse_frequencies(rope)[None, :]
    cos = np.ones((positions, head_dim // 2), np.float64)
    sin = np.zeros((positions, head_dim // 2), np.float64)
    cos[:, : angles.shape[1]] = np.cos(angles)
    sin[:, : angles.shape[1]] = np.sin(angles)
    return cos.astype(np.float32), sin.astype(np.float32)
