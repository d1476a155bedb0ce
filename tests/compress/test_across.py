"""One autoN plan across graphs (`rlx_mil.compress.across`): one budget over every graph's
weights, each graph's loss counted against its own target, in its own unit."""

from __future__ import annotations

import re
import warnings

import pytest

from rlx_mil.compress.across import PlanPart, part_of_plan, plan_across
from rlx_mil.compress.auto import Option, choose
from rlx_mil.compress.schemes import parse_scheme
from rlx_mil.errors import CompressionError, CompressionWarning


def _opt(text: str, error: float, size: int) -> Option:
    scheme = parse_scheme(text)
    assert scheme is not None
    return Option(scheme, error, size)


def _ladder() -> list[Option]:
    # fp16 bytes 400 per weight: lut4 0.25x, int8 0.5x
    return [_opt("lut4", 0.1, 100), _opt("int8", 0.01, 200)]


def _part(name: str, prefix: str, count: int, sensitivity: float, target: float, unit: str = "mean KL") -> PlanPart:
    options = {f"{prefix}.{i}": _ladder() for i in range(count)}
    return PlanPart(name, options, {n: sensitivity for n in options}, unit, target, 0, 400 * count)


def _fraction(plan_schemes: dict, part: PlanPart) -> float:
    used = sum(o.bytes for n, opts in part.options.items() for o in opts if o.scheme == plan_schemes[n])
    return used / part.total_bytes


def test_the_budget_goes_to_the_part_that_feels_it() -> None:
    # An encoder whose loss its target barely allows and a decoder with room: with one budget
    # of 0.35x over both, the encoder takes more than 0.35x of its own bytes and the decoder
    # less. A plan per part at 0.35x each (what a budget per package gives) cannot do that.
    encoder = _part("AudioEncoder", "enc", 4, sensitivity=2.0, target=0.02, unit="squared output error")
    decoder = _part("TextDecoder", "dec", 8, sensitivity=1.0, target=0.05)
    plan = plan_across(4, [encoder, decoder], budget=0.35)
    enc, dec = _fraction(plan.schemes, encoder), _fraction(plan.schemes, decoder)
    assert enc == pytest.approx(0.5) and dec == pytest.approx(0.25)
    assert (enc * encoder.total_bytes + dec * decoder.total_bytes) / (encoder.total_bytes + decoder.total_bytes) <= 0.35
    for part in (encoder, decoder):  # the per-part plans the budget per package gave
        _, _, reached = choose(part.options, part.sensitivities, 0, part.total_bytes, 4, 0.35, None)
        assert reached <= 0.35 < enc
    assert "AudioEncoder 0.500x" in plan.summary and "TextDecoder 0.250x" in plan.summary
    assert "widened: among the largest losses removed per byte, across packages" in plan.notes["enc.0"]
    assert "the narrowest start" in plan.notes["dec.0"]


def test_units_count_against_each_part_s_target() -> None:
    # The same sensitivities; only the targets differ: the part with the tighter target gets the bytes.
    a = _part("A", "a", 2, sensitivity=1.0, target=0.001)
    b = _part("B", "b", 2, sensitivity=1.0, target=1.0)
    plan = plan_across(4, [a, b], budget=0.375)
    assert _fraction(plan.schemes, a) == pytest.approx(0.5) and _fraction(plan.schemes, b) == pytest.approx(0.25)
    plan = plan_across(4, [_part("A", "a", 2, 1.0, 1.0), _part("B", "b", 2, 1.0, 0.001)], budget=0.375)
    assert plan.schemes["a.0"].label.startswith("lut4") and plan.schemes["b.0"].label.startswith("int8")


def test_a_target_search_stops_when_every_part_meets_its_target() -> None:
    encoder = _part("AudioEncoder", "enc", 2, sensitivity=1.0, target=0.015)  # 2 * 0.01 > 0.015: one widening
    decoder = _part("TextDecoder", "dec", 2, sensitivity=1.0, target=0.05)  # met at the start
    plan = plan_across(4, [encoder, decoder], budget=1.0, search=True)
    assert sum(s.label.startswith("int8") for s in plan.schemes.values()) == 1
    assert _fraction(plan.schemes, decoder) == pytest.approx(0.25)


def test_a_budget_too_small_for_the_target_says_which_budget_would() -> None:
    encoder = _part("AudioEncoder", "enc", 2, sensitivity=1.0, target=0.0005)
    decoder = _part("TextDecoder", "dec", 2, sensitivity=1.0, target=0.05)
    with pytest.warns(CompressionWarning) as caught:
        plan = plan_across(4, [encoder, decoder], budget=0.3, search=True)
    message = str(caught[0].message)
    # both encoder weights must go to int8: (200 + 200 + 100 + 100) / 1600 = 0.375
    assert re.search(r"AudioEncoder mean KL 0\.0\d+ \(target mean KL 0\.0005\); a budget of 0\.375 is predicted", message)
    assert "a budget of 0.375" in plan.summary
    with pytest.warns(CompressionWarning, match="cannot be met by any mix"):
        plan_across(4, [_part("A", "a", 2, 1.0, 1e-6), decoder], budget=0.3, search=True)
    with pytest.warns(CompressionWarning, match=r"the budget 0\.2x cannot be met: the narrowest mix takes 0\.250x"):
        plan_across(4, [encoder, decoder], budget=0.2)


def test_without_a_target_asked_for_the_summary_claims_no_failure() -> None:
    # The same parts and budget as above: with a target asked for, the encoder's misses it and
    # the plan warns. Without one, the targets are the plan's defaults: the summary says what
    # each part is predicted to reach against them, and nothing fails or warns.
    encoder = _part("AudioEncoder", "enc", 2, sensitivity=1.0, target=0.0005)
    decoder = _part("TextDecoder", "dec", 2, sensitivity=1.0, target=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = plan_across(4, [encoder, decoder], budget=0.3).summary
    assert "cannot be met" not in summary and "predicted to meet it" not in summary
    found = re.search(r"AudioEncoder 0\.\d+x, predicted mean KL (0\.0\d+) \(default target mean KL 0\.0005\)", summary)
    assert found is not None and float(found.group(1)) > 0.0005, summary
    assert "TextDecoder 0.250x, predicted mean KL 0.02 (default target mean KL 0.05)" in summary
    # with the search, a part whose target is the plan's own default still says so
    encoder.default = True
    with pytest.warns(CompressionWarning, match=r"AudioEncoder mean KL \S+ \(default target mean KL 0\.0005\)"):
        summary = plan_across(4, [encoder, decoder], budget=0.3, search=True).summary
    assert "TextDecoder 0.250x, predicted mean KL 0.02 (target mean KL 0.05)" in summary


def test_bad_parts_are_refused_by_name() -> None:
    with pytest.raises(CompressionError, match=r"'enc\.0' is in two parts"):
        plan_across(4, [_part("A", "enc", 1, 1.0, 1.0), _part("B", "enc", 1, 1.0, 1.0)], budget=0.3)
    with pytest.raises(CompressionError, match="part 'A': a plan target must be positive"):
        plan_across(4, [_part("A", "a", 1, 1.0, 0.0)], budget=0.3)
    plan = plan_across(4, [_part("A", "a", 2, 1.0, 1.0)], budget=0.3)
    assert set(part_of_plan(plan, ["a.1"], "g").schemes) == {"a.1"}
    with pytest.raises(CompressionError, match=r"no scheme for 1 weight.* of graph 'g': x"):
        part_of_plan(plan, ["a.0", "x"], "g")
