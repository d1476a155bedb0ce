"""Picking the next token: greedy, or sampled with temperature, top-k, top-p and min-p; the
repetition penalty (transformers' `repetition_penalty`); the checks of their options."""

from __future__ import annotations

import math
from collections.abc import Set
from typing import Any

import numpy as np

from rlx_mil.errors import InvalidOptionError, RlxMilError


class GenerationError(RlxMilError):
    """A generation request the package cannot serve (context full, bad token ids...)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_penalties(repeat_penalty: Any, min_p: Any) -> None:
    """Typed errors for a bad `repeat_penalty` (a finite number > 0) or `min_p` (in [0, 1])."""
    if isinstance(repeat_penalty, bool) or not isinstance(repeat_penalty, (int, float)) \
            or not math.isfinite(repeat_penalty) or repeat_penalty <= 0:
        raise InvalidOptionError(f"repeat_penalty must be a finite number > 0, got {repeat_penalty!r}")
    if min_p is not None and (isinstance(min_p, bool) or not isinstance(min_p, (int, float)) or not 0 <= min_p <= 1):
        raise InvalidOptionError(f"min_p must be in [0, 1], got {min_p!r}")


def penalize(logits: np.ndarray, seen: Set[int], penalty: float) -> np.ndarray:
    """The logits with every token already seen (prompt and generated) made less likely: a
    positive logit divided by `penalty`, a negative one multiplied (transformers'
    `RepetitionPenaltyLogitsProcessor`). A penalty of 1 returns `logits` unchanged."""
    if penalty == 1.0 or not seen:
        return logits
    scores = np.array(logits, np.float64).reshape(-1)
    ids = np.fromiter((t for t in seen if 0 <= t < scores.size), np.int64)
    picked = scores[ids]
    scores[ids] = np.where(picked > 0, picked / penalty, picked * penalty)
    return scores


def check_sampling(max_new_tokens: Any, temperature: Any, top_k: Any, top_p: Any, seed: Any = None) -> None:
    """Typed errors for bad generation options (which would otherwise fail deep inside NumPy)."""
    if not _is_int(max_new_tokens) or max_new_tokens < 0:
        raise InvalidOptionError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.integer, np.floating)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise InvalidOptionError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise InvalidOptionError(f"top_k must be an int >= 1, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise InvalidOptionError(f"top_p must be in (0, 1], got {top_p!r}")
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise InvalidOptionError(f"seed must be an int >= 0 (or None), got {seed!r}")


def pick_token(
    logits: np.ndarray, temperature: float, top_k: int | None, rng: np.random.Generator, top_p: float | None = None,
    min_p: float | None = None,
) -> int:
    """Greedy argmax at temperature 0, else a sample from the tempered softmax restricted to
    the `top_k` most likely tokens and then to the `top_p` nucleus (the fewest most likely
    tokens whose probabilities sum to at least `top_p`), as transformers orders them, and to
    the tokens at least `min_p` times as likely as the most likely one."""
    scores = np.asarray(logits, np.float64).reshape(-1)
    if np.isnan(scores).any():
        raise GenerationError(f"the model produced NaN logits ({int(np.isnan(scores).sum())} of {scores.size}); no token to pick")
    if temperature == 0:
        return int(np.argmax(scores))
    scores = scores / temperature
    if top_k is not None and top_k < scores.size:
        cutoff = np.partition(scores, -top_k)[-top_k]
        scores = np.where(scores >= cutoff, scores, -np.inf)
    probs = np.exp(scores - np.max(scores))
    probs /= probs.sum()
    if top_p is not None and top_p < 1:
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]  # mass of the more likely tokens
        keep = np.zeros(probs.size, bool)
        keep[order[before < top_p]] = True
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum()
    if min_p:
        probs = np.where(probs >= min_p * probs.max(), probs, 0.0)
        probs /= probs.sum()
    return int(rng.choice(scores.size, p=probs))
