"""The compression report's text: counts in words that agree with them, and for a source that
held codes of its own (a GGUF file) what each weight was in the file beside what it became."""

from __future__ import annotations

from rlx_mil.compress.report import CompressionReport, WeightReport, counted, source_summary


def _weight(name: str, scheme: str, source: str = "") -> WeightReport:
    return WeightReport(name=name, role="weight", scheme=scheme, layout="dense", shape=[4, 8], bytes_before=64,
                        bytes_after=16, relative_error=0.01, source=source)


def test_counts_agree_with_their_nouns() -> None:
    assert (counted(0, "weight"), counted(1, "weight"), counted(2, "weight"), counted(1234, "weight")) == (
        "0 weights", "1 weight", "2 weights", "1,234 weights")
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
