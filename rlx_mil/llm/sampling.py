"""Sampling options beyond temperature, top-k and top-p: the repetition penalty (llama.cpp's and
transformers' `repetition_penalty`) and its checks; `min_p` is applied in `pick_token`."""

from __future__ import annotations

import math
from collections.abc import Set
from typing import Any

import numpy as np

from rlx_mil.errors import InvalidOptionError


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
