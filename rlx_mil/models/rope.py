"""Rotary embeddings as transformers configures them: reading both config forms, and the
cos/sin tables the Rope op takes.

A config describes RoPE in one of two forms, which give the same `RopeSpec`:
- transformers < 5: `rope_theta`, `partial_rotary_factor` and `rope_scaling` (`rope_type` or
  `type`, plus that type's keys) at the top level;
- transformers >= 5: `rope_parameters` (`{"rope_type": ..., "rope_theta": ..., ...}`), or one
  such dict per layer type (`{"full_attention": {...}, "sliding_attention": {...}}`).
The standardisation follows transformers' `RotaryEmbeddingConfigMixin` (v5.23.0): values in
the RoPE dict first, then the top-level keys, then the family's defaults; `llama3`, `yarn` and
`longrope` take `original_max_position_embeddings` from the top level when the config has one
there, else from the dict, else `max_position_embeddings`.

The frequencies are those of transformers' `modeling_rope_utils` (v5.23.0) for every
`rope_type` it defines: `default`, `linear`, `dynamic`, `yarn`, `longrope`, `llama3`. `dynamic`
and `longrope` depend on the sequence length a forward sees; a graph's tables have a fixed
number of rows T, so they are computed for T (dynamic NTK rescales the base only beyond
`max_position_embeddings`, which the builders never exceed; longrope uses `long_factor` when
T > `original_max_position_embeddings`, else `short_factor`). `yarn` and `longrope` scale
cos and sin by their attention factor, as transformers does.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_mil.errors import IgnoredConfigKeyWarning, UnsupportedConfigError

#: The rope types transformers defines, with the keys each may carry besides `rope_type`/`type`,
#: `rope_theta` and `partial_rotary_factor` (transformers' `_validate_*_rope_parameters`).
ROPE_TYPE_KEYS: dict[str, frozenset[str]] = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "dynamic": frozenset({"factor", "original_max_position_embeddings"}),
    "yarn": frozenset({"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                       "mscale", "mscale_all_dim", "truncate"}),
    "longrope": frozenset({"short_factor", "long_factor", "original_max_position_embeddings", "attention_factor",
                           "factor"}),
    "llama3": frozenset({"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}),
}
_COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})
_NEEDS_ORIGINAL_MAX = ("llama3", "yarn", "longrope")


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding: frequencies `theta ** (-2i / rotary_dim)`, rescaled per `kind`."""

    theta: float
    rotary_dim: int
    #: "default", "linear", "dynamic", "llama3", "yarn" or "longrope".
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    #: dynamic: the length beyond which the base is rescaled.
    max_position_embeddings: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    #: cos and sin are multiplied by it (yarn, longrope).
    attention_factor: float = 1.0
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    #: Per-frequency divisors (GGUF's `rope_freqs` tensor, how llama.cpp stores Llama 3.1's
    #: scaling): frequency i is `theta ** (-2i / rotary_dim) / freq_factors[i]`.
    freq_factors: tuple[float, ...] | None = None


def inverse_frequencies(rope: RopeSpec, positions: int) -> np.ndarray:
    """`[rotary_dim / 2]` angular frequencies (float64) of a table of `positions` rows."""
    dim = rope.rotary_dim
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim
    inv = rope.theta ** -exponents
    if rope.freq_factors is not None:
        inv = inv / np.asarray(rope.freq_factors, np.float64)
    if rope.kind == "linear":
        return inv / rope.factor
    if rope.kind == "dynamic":
        limit = rope.max_position_embeddings
        if positions <= limit:
            return inv
        base = rope.theta * ((rope.factor * positions / limit) - (rope.factor - 1)) ** (dim / (dim - 2))
        return base ** -exponents
    if rope.kind == "llama3":
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
    if rope.kind == "yarn":
        return _yarn(rope, inv)
    if rope.kind == "longrope":
        ext = rope.long_factor if positions > rope.original_max_position_embeddings else rope.short_factor
        return inv / np.asarray(ext, np.float64)
    return inv


def _yarn(rope: RopeSpec, inv: np.ndarray) -> np.ndarray:
    """YaRN (arXiv 2309.00071): interpolated (÷ factor) below the correction range, extrapolated
    (unchanged) above it, a linear ramp over the dimensions between."""
    dim, base, old = rope.rotary_dim, rope.theta, rope.original_max_position_embeddings

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    return inv / rope.factor * (1 - extrapolation) + inv * extrapolation


def rope_tables(rope: RopeSpec, head_dim: int, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin `[positions, head_dim / 2]` float32 for positions 0..positions-1, scaled by
    the attention factor.

    Columns beyond `rotary_dim / 2` (partial rotary) are never read by the Rope op; they hold
    the identity rotation.
    """
    angles = np.arange(positions, dtype=np.float64)[:, None] * inverse_frequencies(rope, positions)[None, :]
    cos = np.ones((positions, head_dim // 2), np.float64)
    sin = np.zeros((positions, head_dim // 2), np.float64)
    cos[:, : angles.shape[1]] = np.cos(angles) * rope.attention_factor
    sin[:, : angles.shape[1]] = np.sin(angles) * rope.attention_factor
    return cos.astype(np.float32), sin.astype(np.float32)


def plain_rope_tables(positions: int, head_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """Unscaled NeoX RoPE tables `[positions, head_dim / 2]` (cos, sin)."""
    return rope_tables(RopeSpec(base, head_dim), head_dim, positions)


# ---------------------------------------------------------------------------- config reading
def config_refusal(source: str, family: str, field: str, value: object, why: str) -> UnsupportedConfigError:
    """The typed refusal of one config field's value, naming the file, field and value."""
    return UnsupportedConfigError(f"{source}: {field} = {json.dumps(value)} is not supported for {family}: {why}",
                                  field=field, value=value)


class RopeReader:
    """Reads the RoPE of one config (both forms) for a family whose defaults are given."""

    def __init__(self, config: Mapping[str, Any], source: str, family: str, *, partial: bool = False) -> None:
        self.config = config
        self.source = source
        self.family = family
        #: whether the family's transformers model rotates part of each head (Phi-3, Qwen3.5);
        #: the others rotate every dimension whatever `partial_rotary_factor` says.
        self.partial = partial

    def refuse(self, field: str, value: object, why: str) -> UnsupportedConfigError:
        return config_refusal(self.source, self.family, field, value, why)

    def parameters(self, layer_types: tuple[str, ...] = ()) -> tuple[str, dict[str, Any] | dict[str, dict[str, Any]]]:
        """(the config field read, its RoPE dict), flat or nested by layer type, before standardisation.

        transformers reads `rope_scaling` in preference to `rope_parameters` when both are given."""
        scaling = self.config.get("rope_scaling")
        params = self.config.get("rope_parameters")
        field = "rope_scaling" if scaling else "rope_parameters"
        chosen = scaling or params
        if chosen is None:
            return field, {}
        if not isinstance(chosen, dict):
            raise self.refuse(field, chosen, "expected an object or null")
        nested = [k for k in chosen if k in layer_types]
        if nested and len(nested) != len(chosen):
            extra = sorted(k for k in chosen if k not in layer_types)
            raise self.refuse(field, chosen, f"mixes per-layer-type entries with {extra}")
        return field, dict(chosen)

    def spec(self, params: Mapping[str, Any], field: str, *, head_dim: int, default_theta: float,
             max_position_embeddings: int, partial_default: float = 1.0) -> RopeSpec:
        """The RopeSpec of one standardised RoPE dict `params` (read from config field `field`)."""
        if not isinstance(params, Mapping):
            raise self.refuse(field, params, "expected an object")
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in ROPE_TYPE_KEYS:
            raise self.refuse(f"{field}.rope_type", kind, f"implemented rope types are {sorted(ROPE_TYPE_KEYS)}")
        unknown = sorted(set(params) - _COMMON_KEYS - ROPE_TYPE_KEYS[kind])
        if unknown:
            # transformers' rope validation logs these keys as unused and loads the model (published
            # checkpoints carry e.g. "factor" under type "default"): warn likewise.
            warnings.warn(f"{self.source}: {field} keys {unknown} are not keys of rope type {kind!r}; unused,"
                          " as transformers leaves them", IgnoredConfigKeyWarning, stacklevel=2)
        sub = _Numbers(params, field, self)
        theta = sub.number("rope_theta", self._top("rope_theta", default_theta))
        partial = sub.number("partial_rotary_factor", self._top("partial_rotary_factor", partial_default))
        rotary_dim = int(head_dim * partial)
        if not 0 < partial <= 1 or rotary_dim % 2:
            raise self.refuse("partial_rotary_factor", partial, f"needs an even rotary width <= head_dim {head_dim}")
        if partial != 1 and not self.partial:
            where = f"{field}.partial_rotary_factor" if "partial_rotary_factor" in params else "partial_rotary_factor"
            raise self.refuse(where, partial, f"transformers' {self.family} rotates every head dimension (its"
                              " default RoPE ignores the factor, the scaled types fail on it)")
        if kind == "default":
            return RopeSpec(theta, rotary_dim)
        if kind == "linear":
            return RopeSpec(theta, rotary_dim, "linear", factor=sub.number("factor"))
        if kind == "dynamic":
            return RopeSpec(theta, rotary_dim, "dynamic", factor=sub.number("factor"),
                            max_position_embeddings=max_position_embeddings)
        original = self._original_max(params, sub, max_position_embeddings)
        if kind == "llama3":
            low, high = sub.number("low_freq_factor"), sub.number("high_freq_factor")
            if high <= low:
                raise self.refuse(f"{field}.high_freq_factor", high, "llama3 scaling needs high_freq_factor > low_freq_factor")
            return RopeSpec(theta, rotary_dim, "llama3", factor=sub.number("factor"), low_freq_factor=low,
                            high_freq_factor=high, original_max_position_embeddings=original)
        if kind == "yarn":
            return self._yarn(params, sub, theta, rotary_dim, original, max_position_embeddings)
        return self._longrope(params, sub, theta, rotary_dim, original, max_position_embeddings, field)

    def _top(self, key: str, default: float) -> float:
        value = self.config.get(key)
        return default if value is None else value

    def _original_max(self, params: Mapping[str, Any], sub: _Numbers, max_positions: int) -> int:
        top = self.config.get("original_max_position_embeddings")
        if top is not None:
            return _Numbers(self.config, "", self).integer("original_max_position_embeddings")
        if params.get("original_max_position_embeddings") is not None:
            return sub.integer("original_max_position_embeddings")
        return max_positions

    def _yarn(self, params: Mapping[str, Any], sub: _Numbers, theta: float, rotary_dim: int, original: int,
              max_positions: int) -> RopeSpec:
        factor = sub.number("factor", max_positions / original)

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention = params.get("attention_factor")
        if attention is None:
            m, m_all = params.get("mscale"), params.get("mscale_all_dim")
            if m and m_all:
                attention = mscale(factor, sub.number("mscale")) / mscale(factor, sub.number("mscale_all_dim"))
            else:
                attention = mscale(factor)
        else:
            attention = sub.number("attention_factor")
        truncate = params.get("truncate", True)
        if not isinstance(truncate, bool):
            raise self.refuse("truncate", truncate, "expected true or false")
        return RopeSpec(theta, rotary_dim, "yarn", factor=factor, original_max_position_embeddings=original,
                        beta_fast=sub.number("beta_fast", 32.0, falsy_default=True),
                        beta_slow=sub.number("beta_slow", 1.0, falsy_default=True),
                        truncate=truncate, attention_factor=float(attention))

    def _longrope(self, params: Mapping[str, Any], sub: _Numbers, theta: float, rotary_dim: int, original: int,
                  max_positions: int, field: str) -> RopeSpec:
        factors = {}
        for key in ("short_factor", "long_factor"):
            value = params.get(key)
            if not isinstance(value, list) or len(value) != rotary_dim // 2 or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in value):
                raise self.refuse(f"{field}.{key}", value, f"expected a list of {rotary_dim // 2} positive numbers")
            factors[key] = tuple(float(v) for v in value)
        factor = sub.number("factor", max_positions / original)
        attention = params.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        else:
            attention = sub.number("attention_factor")
        return RopeSpec(theta, rotary_dim, "longrope", factor=factor, original_max_position_embeddings=original,
                        attention_factor=float(attention), short_factor=factors["short_factor"],
                        long_factor=factors["long_factor"])


class _Numbers:
    """Typed numbers of a RoPE dict; every refusal names the key."""

    def __init__(self, params: Mapping[str, Any], field: str, reader: RopeReader) -> None:
        self.params = params
        self.prefix = f"{field}." if field else ""
        self.reader = reader

    def number(self, key: str, default: float | None = None, *, falsy_default: bool = False) -> float:
        value = self.params.get(key)
        if value is None or (falsy_default and not value):
            value = default
        if value is None:
            raise UnsupportedConfigError(f"{self.reader.source}: required field {self.prefix}{key!r} is missing",
                                         field=key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise self.reader.refuse(f"{self.prefix}{key}", value, "expected a positive finite number")
        return float(value)

    def integer(self, key: str) -> int:
        value = self.params.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.reader.refuse(f"{self.prefix}{key}", value, "expected an integer >= 1")
        return value
