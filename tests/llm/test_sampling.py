"""Sampling of the next token: temperature, top-k and the top-p nucleus, in transformers' order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_mil.errors import InvalidOptionError
from rlx_mil.llm.generate import check_sampling, pick_token

PROBS = np.array([0.5, 0.3, 0.15, 0.05])


def _picks(top_k: int | None, top_p: float | None, temperature: float = 1.0, n: int = 400) -> set[int]:
    rng = np.random.default_rng(0)
    return {pick_token(np.log(PROBS), temperature, top_k, rng, top_p) for _ in range(n)}


def test_the_nucleus_is_the_fewest_tokens_reaching_top_p() -> None:
    assert _picks(None, 0.5) == {0}  # 0.5 alone reaches 0.5
    assert _picks(None, 0.7) == {0, 1}  # 0.5 + 0.3 >= 0.7
    assert _picks(None, 0.96) == {0, 1, 2, 3}  # 0.95 < 0.96: the last token is needed too
    assert _picks(2, 0.99) == {0, 1}  # top-k first, then the nucleus of what is left
    assert _picks(None, None, temperature=0.0) == {0}


@settings(max_examples=25, deadline=None)
@given(logits=st.lists(st.floats(-5, 5), min_size=2, max_size=12), top_p=st.floats(0.05, 1.0), seed=st.integers(0, 99))
def test_samples_follow_the_renormalised_nucleus(logits: list[float], top_p: float, seed: int) -> None:
    x = np.asarray(logits)
    p = np.exp(x - x.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    before = np.cumsum(p[order]) - p[order]
    allowed = set(order[before < top_p].tolist())
    rng = np.random.default_rng(seed)
    assert {pick_token(x, 1.0, None, rng, top_p) for _ in range(30)} <= allowed
    again = np.random.default_rng(seed)
    first = np.random.default_rng(seed)
    assert pick_token(x, 1.0, None, first, top_p) == pick_token(x, 1.0, None, again, top_p)  # seeded


@pytest.mark.parametrize(("options", "message"), [
    ((-1, 0.0, None, None), "max_new_tokens"), ((4, -0.5, None, None), "temperature"),
    ((4, 1.0, 0, None), "top_k"), ((4, 1.0, None, 0.0), "top_p"), ((4, 1.0, None, 1.5), "top_p"),
    ((4, 1.0, None, True), "top_p"),
])
def test_bad_options_are_typed_errors(options: tuple[object, object, object, object], message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        check_sampling(*options)
