"""`rlx-mil eval`'s LLM metrics are `rlx_mil.compress.quality`'s: the same numbers as the
conversion's quality check (`decoder_quality`) on the same logits, and hand-computed values
where near-ties decide top-1 and the KL's direction matters."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_mil.compress.quality import decoder_quality
from rlx_mil.errors import RlxMilError
from rlx_mil.llm.evaluate import BLOCK_POSITIONS, LogitSource, evaluate_text, windows


def _sources(ids: Sequence[int], window: int, ref_rows: np.ndarray, pkg_rows: np.ndarray) -> tuple[LogitSource, LogitSource]:
    """Two logit sources serving the given rows, position after position, window after window
    (each source serves the windows once, in order, as one `evaluate_text` call asks them)."""
    parts = windows(ids, window)
    starts = np.cumsum([0] + [len(part) - 1 for part in parts])
    assert starts[-1] == len(ref_rows) == len(pkg_rows)

    def source(rows: np.ndarray) -> LogitSource:
        served = 0

        def serve(part: Sequence[int]) -> Iterator[np.ndarray]:
            nonlocal served
            assert list(part) == parts[served]
            first, served = int(starts[served]), served + 1
            yield from rows[first:first + len(part) - 1]

        return serve

    return source(ref_rows), source(pkg_rows)


def _targets(ids: Sequence[int], window: int) -> np.ndarray:
    return np.concatenate([part[1:] for part in windows(ids, window)])


def _near_tie_logits(rng: np.random.Generator, positions: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference logits whose best two differ by 0.001..2 (many below the 0.5 'confident' gap),
    and package logits that perturb them enough to flip many of the near-ties."""
    ref = rng.standard_normal((positions, vocab)).astype(np.float32) * 2
    best = np.argmax(ref, axis=-1)
    second = (best + 1 + rng.integers(0, vocab - 1, positions)) % vocab
    gap = np.exp(rng.uniform(math.log(1e-3), math.log(2.0), positions)).astype(np.float32)
    rows = np.arange(positions)
    ref[rows, second] = ref[rows, best] - gap
    pkg = (ref + rng.standard_normal(ref.shape).astype(np.float32) * 0.3).astype(np.float32)
    return ref, pkg


@pytest.mark.parametrize("window", [2, 7, BLOCK_POSITIONS, BLOCK_POSITIONS + 1, 150])
def test_eval_numbers_are_the_quality_checks_on_the_same_logits(window: int) -> None:
    """Across windows and blocks of positions, eval reports exactly what decoder_quality (the
    conversion's check, the speech eval) measures on all scored positions at once."""
    rng = np.random.default_rng(window)
    vocab = 40
    ids = [int(i) for i in rng.integers(0, vocab, 301)]
    targets = _targets(ids, window)
    ref, pkg = _near_tie_logits(rng, len(targets), vocab)
    ref_src, pkg_src = _sources(ids, window, ref, pkg)

    got = evaluate_text(pkg_src, ids, window, ref_src, "ref")
    want = decoder_quality(ref, pkg, targets)

    assert got.scored == want.positions == len(targets)
    assert 0.1 < want.top1 < 0.95  # the near-ties really flip: top-1 is not trivially 0 or 1
    assert got.top1_agreement == want.top1  # a count over the same positions: exact
    # confident top-1: only where the reference's best logit beats its second by >= 0.5
    top2 = np.sort(ref, axis=-1)[:, -2:]
    confident = top2[:, 1] - top2[:, 0] >= 0.5
    assert 0 < got.confident_positions == int(confident.sum()) == want.confident_positions < len(targets)
    same = ref.argmax(-1) == pkg.argmax(-1)
    assert got.confident_top1_agreement == pytest.approx(float(same[confident].mean()), rel=1e-12)
    assert got.mean_kl == pytest.approx(want.mean_kl, rel=1e-12)
    assert got.perplexity == pytest.approx(want.perplexity_compressed, rel=1e-12)
    assert got.reference_perplexity == pytest.approx(want.perplexity_reference, rel=1e-12)
    assert got.perplexity_ratio == pytest.approx(want.perplexity_ratio, rel=1e-12)
    assert got.mean_nll == pytest.approx(math.log(want.perplexity_compressed or 0.0), rel=1e-12)
    # Without a reference the package's perplexity is the same number.
    alone = evaluate_text(_sources(ids, window, ref, pkg)[1], ids, window)
    assert alone.perplexity == pytest.approx(got.perplexity, rel=1e-12) and alone.mean_kl is None


def _kl(p: Sequence[float], q: Sequence[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))


def test_eval_matches_hand_computed_kl_direction_and_near_tie_top1() -> None:
    """Three kinds of position, values worked out by hand: an asymmetric pair (KL(ref || pkg)
    and KL(pkg || ref) differ, so the direction shows), a near-tie the package flips (top-1
    disagrees though the reference was nearly indifferent), and an identical row (KL exactly 0,
    never a rounding -1e-17)."""
    p = [0.5, 0.3, 0.1, 0.1]
    q = [0.4, 0.3, 0.1, 0.2]  # the same top token, another distribution
    tie_ref = [1.0, 0.999, -3.0, -3.0]
    tie_pkg = [0.999, 1.0, -3.0, -3.0]
    same = [0.3, -1.7, 2.2, 0.05]
    ref_rows = np.array([np.log(p), tie_ref, same] * 3, np.float64)
    pkg_rows = np.array([np.log(q), tie_pkg, same] * 3, np.float64)
    ids = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]  # one window of 10: 9 scored positions
    ref_src, pkg_src = _sources(ids, 10, ref_rows, pkg_rows)

    got = evaluate_text(pkg_src, ids, 10, ref_src, "ref")

    def softmax(row: Sequence[float]) -> list[float]:
        e = [math.exp(v) for v in row]
        return [v / sum(e) for v in e]

    forward = _kl(p, q)
    assert forward != pytest.approx(_kl(q, p), rel=1e-3)  # the direction is observable
    kl_tie = _kl(softmax(tie_ref), softmax(tie_pkg))
    assert got.mean_kl == pytest.approx((forward + kl_tie) / 3, rel=1e-12)
    assert got.top1_agreement == pytest.approx(2 / 3)  # the asymmetric and identical rows agree
    nll_pkg = -sum(math.log(softmax(list(pkg_rows[i]))[t]) for i, t in enumerate(ids[1:]))
    nll_ref = -sum(math.log(softmax(list(ref_rows[i]))[t]) for i, t in enumerate(ids[1:]))
    assert got.perplexity == pytest.approx(math.exp(nll_pkg / 9), rel=1e-12)
    assert got.perplexity_ratio == pytest.approx(math.exp((nll_pkg - nll_ref) / 9), rel=1e-12)

    ref_src, same_src = _sources(ids, 10, ref_rows, ref_rows)
    identical = evaluate_text(same_src, ids, 10, ref_src, "itself")
    assert identical.mean_kl == 0.0 and identical.top1_agreement == 1.0 and identical.perplexity_ratio == 1.0


def test_eval_keeps_its_typed_errors_for_bad_ids_and_vocabularies() -> None:
    ids = [0, 1, 2, 9]
    rows = np.zeros((3, 5), np.float32)
    ref_src, pkg_src = _sources(ids, 4, rows, rows)
    with pytest.raises(RlxMilError, match="token id 9 is outside the package's vocabulary of 5"):
        evaluate_text(pkg_src, ids, 4, ref_src, "ref")
    ids = [0, 1, 2, 3]
    wide_src, pkg_src = _sources(ids, 4, np.zeros((3, 6), np.float32), rows)
    with pytest.raises(RlxMilError, match=r"reference's vocabulary \(6\) differs from the package's \(5\)"):
        evaluate_text(pkg_src, ids, 4, wide_src, "ref")


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 200), st.integers(2, 130), st.integers(2, 12), st.integers(0, 2**31 - 1))
def test_eval_equals_decoder_quality_for_any_text_and_window(length: int, window: int, vocab: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids = [int(i) for i in rng.integers(0, vocab, length)]
    targets = _targets(ids, window)
    if not len(targets):
        return
    ref, pkg = _near_tie_logits(rng, len(targets), vocab)
    ref_src, pkg_src = _sources(ids, window, ref, pkg)
    got = evaluate_text(pkg_src, ids, window, ref_src, "ref")
    want = decoder_quality(ref, pkg, targets)
    assert got.top1_agreement == want.top1
    assert got.confident_positions == want.confident_positions
    assert got.confident_top1_agreement == want.top1_confident or want.confident_positions == 0
    assert got.mean_kl == pytest.approx(want.mean_kl, rel=1e-12, abs=1e-300)
    assert got.perplexity_ratio == pytest.approx(want.perplexity_ratio, rel=1e-12)
