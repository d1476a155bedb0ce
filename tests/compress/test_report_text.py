"""The compression report's text: counts in words that agree with them, and for a source that
held codes of its own (a GGUF file) what each weight was in the file beside what it became."""

from __future__ import annotations

import numpy as np

from rlx_mil.compress.across import PlanPart, plan_across
from rlx_mil.compress.auto import Option, plan_auto
from rlx_mil.compress.report import CompressionReport, WeightReport, source_summary
from rlx_mil.compress.schemes import parse_scheme
from rlx_mil.llm.generation_stats import GenerationStats
from rlx_mil.lowering.target import Target
from rlx_mil.units import counted


def _weight(name: str, scheme: str, source: str = "") -> WeightReport:
    return WeightReport(name=name, role="weight", scheme=scheme, layout="dense", shape=[4, 8], bytes_before=64,
                        bytes_after=16, relative_error=0.01, source=source)


def test_counts_agree_with_their_nouns() -> None:
    assert (counted(0, "weight"), counted(1, "weight"), counted(2, "weight"), counted(1234, "weight")) == (
        "0 weights", "1 weight", "2 weights", "1,234 weights")
    assert (counted(1, "entry", "entries"), counted(2, "entry", "entries"), counted(1, "token id")) == (
        "1 entry", "2 entries", "1 token id")
    one = CompressionReport(config="int8", target="iOS18", precision="fp16", weights=[_weight("w", "int8-sym-channel")],
                            kept={"norm.weight": "norm"})
    text = one.to_text()
    assert "\n  1 weight: 64 B -> 16 B (0.250x)\n" in text
    assert "kept in float: 1 weight (norm)" in text
    assert "1 weights" not in text
    two = CompressionReport(config="int8", target="iOS18", precision="fp16",
                            weights=[_weight("a", "int8-sym-channel"), _weight("b", "int8-sym-channel")],
                            kept={"n1": "norm", "n2": "bias/vector"})
    assert "  2 weights: 128 B -> 32 B" in two.to_text() and "kept in float: 2 weights (bias/vector, norm)" in two.to_text()
    # A float checkpoint's report has no source column.
    assert "source" not in two.to_text().splitlines()[2]


def test_the_source_type_is_shown_beside_the_scheme() -> None:
    weights = [_weight("blk.0.down", "lut4-tensor-scaled", "Q4_K"), _weight("blk.1.down", "int8-sym-channel", "Q4_K"),
               _weight("blk.2.down", "lut4-tensor-scaled", "Q4_K"), _weight("embed", "int8-sym-channel", "Q8_0"),
               _weight("blk.0.v", "gguf-Q6_K", "Q6_K")]
    assert source_summary(weights) == ("Q4_K (3) -> lut4-tensor-scaled 2, int8-sym-channel 1; Q6_K (1) -> gguf-Q6_K 1;"
                                       " Q8_0 (1) -> int8-sym-channel 1")
    report = CompressionReport(config="auto4", target="iOS18", precision="fp16", weights=weights)
    lines = report.to_text().splitlines()
    assert lines[2] == "  from the file's types: " + source_summary(weights)
    header, rows = lines[3], lines[4:9]
    assert header.split()[:3] == ["weight", "source", "scheme"]
    assert [row.split()[:3] for row in rows] == [[w.name, w.source, w.scheme] for w in weights]
    # Reports written before the field existed read back with no source.
    old = report.to_json().replace(',"source":"Q4_K"', "").replace(',"source":"Q8_0"', "").replace(',"source":"Q6_K"', "")
    assert "source" not in old
    assert {w.source for w in CompressionReport.from_json(old).weights} == {""}
    assert CompressionReport.from_json(report.to_json()).weights == weights


def _plan_of(count: int) -> tuple[str, str]:
    """The summaries of an auto4 plan over `count` weights: one graph's, and one across packages."""
    rng = np.random.default_rng(0)
    arrays = {f"layers.{i}.w": rng.standard_normal((64, 64)).astype(np.float32) for i in range(count)}
    storages = {n: (lambda n=n: arrays[n]) for n in arrays}
    alone = plan_auto(4, storages, {}, Target.IOS18, np.float16, 0, count * 64 * 64 * 2, 1.0, None,
                      candidates=("int4", "int8"), measure=lambda name, scheme: 0.01,
                      sample=list(arrays)[:1], loss_unit="mean KL")
    lut4, int8 = parse_scheme("lut4"), parse_scheme("int8")
    assert lut4 is not None and int8 is not None
    options = {n: [Option(lut4, 0.1, 100), Option(int8, 0.01, 200)] for n in arrays}
    part = PlanPart("TextDecoder", options, {n: 1.0 for n in options}, "mean KL", 0.05, 0, 400 * count)
    return alone.summary, plan_across(4, [part], budget=0.25).summary


def test_plan_summaries_count_in_the_singular_and_the_plural() -> None:
    one, across_one = _plan_of(1)
    assert "auto4: 1 of 1 weight widened" in one and "(1 of 1 weight measured, the rest by kind)" in one, one
    assert across_one.startswith("auto4 across 1 package: 0 of 1 weight widened"), across_one
    three, across_three = _plan_of(3)
    assert "auto4: 3 of 3 weights widened" in three and "(1 of 3 weights measured" in three, three
    assert across_three.startswith("auto4 across 1 package: 0 of 3 weights widened"), across_three
    for text in (one, across_one, three, across_three):
        assert "1 weights" not in text and "1 packages" not in text


def test_generation_stats_count_tokens_in_the_singular_and_the_plural() -> None:
    one = GenerationStats(prompt_tokens=1, prompt_seconds=0.5, new_tokens=1, seconds=0.25, prompt_read=True).to_text()
    assert one.startswith("prompt: 1 token in 0.50 s (2.0 tok/s); generation: 1 token in 0.25 s"), one
    two = GenerationStats(prompt_tokens=2, prompt_seconds=0.5, new_tokens=0, seconds=0.0, prompt_read=True).to_text()
    assert two.startswith("prompt: 2 tokens in 0.50 s") and "generation: 0 tokens in" in two, two
    assert GenerationStats(prompt_tokens=1).to_text().startswith("prompt: 1 token, not all fed")
