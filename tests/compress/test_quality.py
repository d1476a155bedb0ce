"""The quality metrics against hand-computed values and independent formulas."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_mil.compress import quality as q


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_top1_and_confident_top1_count_by_hand() -> None:
    ref = np.array([[3.0, 0.0, 0.0], [1.0, 0.9, 0.0], [0.0, 0.0, 2.0], [0.0, 5.0, 0.0]])
    got = np.array([[2.0, 0.0, 0.0], [0.8, 0.9, 0.0], [0.0, 3.0, 2.0], [0.0, 5.0, 0.0]])
    assert q.top1_agreement(ref, got) == 0.5  # rows 0 and 3 agree
    # row 1's gap is 0.1: not confident; rows 0, 2, 3 are, and 2 of them agree.
    share, count = q.confident_top1_agreement(ref, got)
    assert count == 3 and share == pytest.approx(2 / 3)
    np.testing.assert_allclose(q.top2_gaps(ref), [3.0, 0.1, 2.0, 5.0])


def test_kl_matches_the_definition_and_is_zero_on_itself() -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 5, 11)) * 3
    got = ref + rng.standard_normal(ref.shape) * 0.5
    p, r = _softmax(ref.reshape(-1, 11)), _softmax(got.reshape(-1, 11))
    want = np.sum(p * np.log(p / r), axis=-1)
    np.testing.assert_allclose(q.kl_per_position(ref, got), want, rtol=1e-10)
    assert q.mean_kl(ref, got) == pytest.approx(want.mean(), rel=1e-10)
    assert q.mean_kl(ref, ref) == 0.0


def test_perplexity_of_uniform_logits_is_the_vocabulary_size() -> None:
    logits = np.zeros((7, 13))
    assert q.perplexity(logits, np.arange(7)) == pytest.approx(13.0)
    sharp = np.zeros((7, 13))
    sharp[np.arange(7), np.arange(7)] = math.log(12.0)  # p(target) = 12/24 = 0.5
    assert q.perplexity(sharp, np.arange(7)) == pytest.approx(2.0)
    assert q.perplexity_ratio(sharp, logits, np.arange(7)) == pytest.approx(6.5)
    with pytest.raises(ValueError, match=r"\d+ targets? for \d+ logit positions?"):
        q.perplexity(logits, np.arange(6))
    with pytest.raises(ValueError, match="target ids"):
        q.perplexity(logits, np.full(7, 13))


def test_cosine_and_psnr_by_hand() -> None:
    a = np.array([1.0, 0.0, -2.0, 2.0])
    assert q.cosine(a, 2 * a) == pytest.approx(1.0)
    assert q.cosine(a, -a) == pytest.approx(-1.0)
    assert q.cosine(np.zeros(3), np.zeros(3)) == 1.0
    assert q.cosine(np.zeros(3), np.ones(3)) == 0.0
    noisy = a + np.array([0.1, -0.1, 0.1, -0.1])  # mse 0.01, peak 2 -> 10 log10(400) dB
    assert q.psnr(a, noisy) == pytest.approx(10 * math.log10(400.0))
    assert q.psnr(a, a) == math.inf
    with pytest.raises(ValueError, match="differ in shape"):
        q.cosine(a, a[:3])


def test_decoder_quality_gates_on_confident_top1_and_kl() -> None:
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((64, 50)) * 4
    close = q.decoder_quality(ref, ref + rng.standard_normal(ref.shape) * 0.01, targets=rng.integers(0, 50, 64))
    assert close.top1 == 1.0 and close.mean_kl < 1e-3 and close.failures() == []
    assert close.perplexity_ratio == pytest.approx(1.0, abs=1e-2)
    assert close.summary().startswith("top-1 100.0 %")
    broken = q.decoder_quality(ref, rng.standard_normal((64, 50)) * 4)
    assert broken.confident_positions >= q.MIN_CONFIDENT_POSITIONS
    fails = broken.failures()
    assert any("confident" in f for f in fails) and any("mean KL" in f for f in fails)
    assert broken.perplexity_ratio is None and "ppl" not in broken.summary()
    d = broken.to_dict()
    assert d["positions"] == 64 and d["perplexity_ratio"] is None


def test_top1_is_not_judged_without_enough_confident_positions() -> None:
    ref = np.zeros((20, 4))
    ref[:, 0] = 0.1  # every gap 0.1: no confident position
    got = np.zeros((20, 4))
    got[:, 1] = 0.1
    res = q.decoder_quality(ref, got)
    assert res.confident_positions == 0 and res.top1 == 0.0 and not res.top1_judged
    assert res.failures() == []  # near-ties: KL is tiny, top-1 measures the ties
    assert res.failures(q.QualityThresholds(max_mean_kl=1e-4)) == [f"mean KL {res.mean_kl:.3g} > 0.0001"]


def test_raw_top1_is_judged_beside_confident_top1() -> None:
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((100, 30)) * 0.01
    ref[:40, 0] = 10.0  # 40 confident positions, the others near-ties
    got = ref.copy()
    got[40:] = rng.standard_normal((60, 30)) * 0.01  # the near-tie positions scrambled
    res = q.decoder_quality(ref, got)
    assert res.top1_judged and res.top1_confident == 1.0 and res.top1 < 0.8
    assert any(f.startswith("top-1 ") for f in res.failures(q.QualityThresholds(max_mean_kl=10.0)))


def test_output_quality_gates_on_cosine() -> None:
    a = np.linspace(-1, 1, 100)
    assert q.output_quality("emb", a, a * 1.01).failures() == []
    bad = q.output_quality("emb", a, a[::-1] * 0.5 + 0.3)
    assert bad.failures() and "cosine" in bad.failures()[0]
    assert bad.summary().startswith("emb cosine")


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.integers(2, 40), st.floats(0.0, 5.0), st.integers(0, 2**31 - 1))
def test_metric_bounds_hold_for_any_logits(rows: int, vocab: int, scale: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal((rows, vocab)) * 10
    got = ref + rng.standard_normal(ref.shape) * scale
    kl = q.kl_per_position(ref, got)
    assert np.all(kl >= 0) and np.all(np.isfinite(kl))
    assert 0.0 <= q.top1_agreement(ref, got) <= 1.0
    assert -1.0 - 1e-12 <= q.cosine(ref, got) <= 1.0 + 1e-12
    ids = rng.integers(0, vocab, rows)
    assert q.perplexity(ref, ids) >= 1.0
    # Adding a constant per position changes no distribution.
    shifted = got + rng.standard_normal((rows, 1)) * 100
    np.testing.assert_allclose(q.kl_per_position(ref, shifted), kl, atol=1e-8)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 140), st.integers(2, 30), st.integers(0, 2**31 - 1))
def test_decoder_quality_in_one_pass_equals_the_separate_metrics(rows: int, vocab: int, seed: int) -> None:
    """decoder_quality reads each side's log-softmax once (chunks of 64 positions): its KL,
    perplexities, top-1 and confident top-1 are the standalone functions' (over all the
    positions at once) over any number of chunks."""
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal((rows, vocab)) * 4
    ref[::4, 1] = ref[::4].max(axis=1) + 0.1  # near-ties: not confident positions
    got = ref + rng.standard_normal(ref.shape)
    ids = rng.integers(0, vocab, rows)
    dq = q.decoder_quality(ref, got, ids)
    assert dq.top1 == q.top1_agreement(ref, got)
    confident, counted = q.confident_top1_agreement(ref, got)
    assert dq.confident_positions == counted == int(np.count_nonzero(q.top2_gaps(ref) >= q.CONFIDENT_GAP))
    assert dq.top1_confident == confident or (math.isnan(confident) and math.isnan(dq.top1_confident))
    kl = q.kl_per_position(ref, got)
    assert dq.mean_kl == pytest.approx(float(np.mean(kl)), rel=1e-12, abs=1e-15)
    assert dq.max_kl == pytest.approx(float(np.max(kl)), rel=1e-12, abs=1e-15)
    assert dq.perplexity_reference == pytest.approx(q.perplexity(ref, ids), rel=1e-12)
    assert dq.perplexity_compressed == pytest.approx(q.perplexity(got, ids), rel=1e-12)
    with pytest.raises(ValueError, match=r"\d+ targets? for \d+ logit positions?"):
        q.decoder_quality(ref, got, ids[:-1] if rows > 1 else np.array([0, 0]))
    with pytest.raises(ValueError, match="must lie in"):
        q.decoder_quality(ref, got, np.full(rows, vocab))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 90), min_size=1, max_size=5), st.integers(2, 20), st.integers(0, 2**31 - 1))
def test_decoder_tally_over_blocks_equals_decoder_quality_at_once(sizes: list[int], vocab: int, seed: int) -> None:
    """What `rlx-mil eval` does to a long text: blocks added one by one give the numbers of one
    decoder_quality call on them all (confident positions, max KL and perplexities included)."""
    rng = np.random.default_rng(seed)
    total = sum(sizes)
    ref = rng.standard_normal((total, vocab)) * 3
    ref[::3, 1] = ref[::3, 0] + 0.01  # near-ties: not confident positions
    got = ref + rng.standard_normal(ref.shape) * 0.5
    ids = rng.integers(0, vocab, total)
    tally = q.DecoderTally()
    bounds = np.cumsum([0, *sizes])
    for start, stop in itertools.pairwise(bounds):
        tally.add(ref[start:stop], got[start:stop], ids[start:stop])
    blocks, once = tally.result(), q.decoder_quality(ref, got, ids)
    assert (blocks.positions, blocks.top1, blocks.confident_positions) == (once.positions, once.top1, once.confident_positions)
    if total:
        assert blocks.top1_confident == once.top1_confident or (math.isnan(blocks.top1_confident) and math.isnan(once.top1_confident))
        assert blocks.mean_kl == pytest.approx(once.mean_kl, rel=1e-12)
        assert blocks.max_kl == once.max_kl
        assert blocks.perplexity_ratio == pytest.approx(once.perplexity_ratio, rel=1e-12)
        assert blocks.perplexity_compressed == pytest.approx(q.perplexity(got, ids), rel=1e-12)
        assert q.total_nll(got, ids) == pytest.approx(total * math.log(q.perplexity(got, ids)), rel=1e-12)
    # One block without targets: no perplexity for the whole (it would cover part of the text).
    tally.add(ref[:1], got[:1])
    assert tally.result().perplexity_ratio is None


def test_a_batch_of_examples_is_judged_by_its_worst_example() -> None:
    """Eight sentence embeddings, one of them damaged: the batch's cosine as one vector stays
    above the 0.95 threshold, the damaged sentence's does not, and the check fails on it."""
    from rlx_mil.compress.quality_check import check_from_dict, judge_outputs

    rng = np.random.default_rng(3)
    want = rng.standard_normal((8, 384))
    got = want + 0.05 * rng.standard_normal((8, 384))
    got[5] = want[5] + 0.45 * rng.standard_normal(384)
    whole, per = q.cosine(want, got), [q.cosine(a, b) for a, b in zip(want, got, strict=True)]
    assert whole > 0.95 > min(per)

    check = judge_outputs({"embeddings": want}, {"embeddings": got}, {}, inputs_label="8 sentences")
    (out,) = check.outputs
    assert out.items == 8 and out.cosine == pytest.approx(min(per), rel=1e-12)
    assert not check.ok and "'embeddings' cosine" in check.failures[0]
    assert "the worst of 8 examples" in check.summary()
    again = check_from_dict(check.to_dict())
    assert again.outputs[0].items == 8 and not again.ok
    # One example (a batch of 1, or the API's default): the cosine of the whole output.
    single = q.output_quality("x", want[:1], got[:1], per_example=True)
    assert single.items == 1 and single.cosine == pytest.approx(q.cosine(want[:1], got[:1]))
    assert q.output_quality("x", want, got).cosine == pytest.approx(whole)


@pytest.mark.parametrize("mask_row", [None, [1, 1, 1, 1, 1, 0, 0], [1, 1, 0, 1, 1, 1, 1]])
def test_judge_outputs_judges_the_positions_with_a_next_token(mask_row: list[int] | None) -> None:
    """Teacher-forced logits `[batch, seq, vocab]`: every position but each row's last (and
    any whose token or next token is masked) against its next id, whether those positions are
    the first n (judged in place) or scattered (copied)."""
    from rlx_mil.compress.quality_check import judge_outputs

    rng = np.random.default_rng(3)
    batch, seq, vocab = (1, 7, 13) if mask_row is None else (2, 7, 13)
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    want = (rng.standard_normal((batch, seq, vocab)) * 3).astype(np.float32)
    got = want + rng.standard_normal(want.shape).astype(np.float32)
    feeds: dict[str, np.ndarray] = {"input_ids": ids}
    keep = np.ones((batch, seq), bool)
    keep[:, -1] = False
    if mask_row is not None:
        mask = np.array([[1] * seq, mask_row], np.int32)
        feeds["attention_mask"] = mask
        keep &= (mask != 0) & (np.roll(mask, -1, axis=-1) != 0)
    targets = np.roll(ids, -1, axis=-1)
    check = judge_outputs({"logits": want}, {"logits": got}, feeds, inputs_label="ids")
    by_hand = q.decoder_quality(want[keep], got[keep], targets[keep])
    assert check.decoder == by_hand
    assert check.decoder is not None and check.decoder.positions == int(keep.sum())
