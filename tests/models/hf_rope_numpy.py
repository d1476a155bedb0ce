"""Independent NumPy RoPE frequencies, written from transformers' `modeling_rope_utils` and
`RotaryEmbeddingConfigMixin` (v5.23.0) and the YaRN / LongRoPE papers, in float64.

`rope_dicts(cfg)` standardises a config's RoPE the way transformers does (both forms, per layer
type when nested); `inv_freq(params, cfg, head_dim, seq_len)` gives the frequencies and the
attention factor cos/sin are multiplied by.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def rope_dicts(cfg: Mapping[str, Any], default_theta: float = 10000.0) -> dict[str, dict[str, Any]] | dict[str, Any]:
    """The standardised RoPE dict of `cfg`: flat, or keyed by layer type when nested."""
    raw = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    types = set(cfg.get("layer_types") or ())
    if raw and all(k in types for k in raw):
        return {k: _standard(dict(v), cfg, default_theta) for k, v in raw.items()}
    return _standard(dict(raw), cfg, default_theta)


def _standard(params: dict[str, Any], cfg: Mapping[str, Any], default_theta: float) -> dict[str, Any]:
    params.setdefault("rope_type", params.pop("type", "default"))
    params.setdefault("rope_theta", cfg.get("rope_theta", default_theta))
    params.setdefault("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if params["rope_type"] in ("llama3", "yarn", "longrope"):
        if cfg.get("original_max_position_embeddings") is not None:
            params["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
        params.setdefault("original_max_position_embeddings", cfg["max_position_embeddings"])
    return params


def inv_freq(params: Mapping[str, Any], cfg: Mapping[str, Any], head_dim: int, seq_len: int) -> tuple[Any, float]:
    """(inverse frequencies `[rotary_dim / 2]`, attention factor) for a forward over `seq_len` positions."""
    import numpy as np

    base = params["rope_theta"]
    dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    kind = params["rope_type"]
    inv = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    if kind == "linear":
        return inv / params["factor"], 1.0
    if kind == "dynamic":  # NTK-aware base, only beyond max_position_embeddings
        limit = cfg["max_position_embeddings"]
        if seq_len <= limit:
            return inv, 1.0
        factor = params["factor"]
        scaled = base * ((factor * seq_len / limit) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / scaled ** (np.arange(0, dim, 2) / dim), 1.0
    if kind == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old = params["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        out = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        return np.where(medium, smoothed, out), 1.0
    if kind == "yarn":
        factor = params["factor"]
        old = params["original_max_position_embeddings"]

        def get_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention = params.get("attention_factor")
        if attention is None:
            if params.get("mscale") and params.get("mscale_all_dim"):
                attention = get_mscale(factor, params["mscale"]) / get_mscale(factor, params["mscale_all_dim"])
            else:
                attention = get_mscale(factor)
        beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

        def find_dim(rotations: float) -> float:
            return (dim * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = find_dim(beta_fast), find_dim(beta_slow)
        if params.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
        extrapolation_factor = 1 - ramp
        interpolation = inv / factor
        return interpolation * (1 - extrapolation_factor) + inv * extrapolation_factor, attention
    if kind == "longrope":
        old = params["original_max_position_embeddings"]
        factor = params.get("factor") or cfg["max_position_embeddings"] / old
        attention = params.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old))
        ext = params["long_factor"] if seq_len > old else params["short_factor"]
        return 1.0 / (np.asarray(ext, np.float64) * base ** (np.arange(0, dim, 2) / dim)), attention
    assert kind == "default", kind
    return inv, 1.0
