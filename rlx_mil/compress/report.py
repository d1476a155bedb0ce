"""What compression did to each weight, kept with the model (metadata) and shown by `inspect`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from rlx_mil.errors import RlxMilError
from rlx_mil.units import counted, human_bytes

METADATA_KEY = "rlx_mil.compression"


@dataclass
class WeightReport:
    name: str
    role: str
    scheme: str
    #: "kn": a [K, N] matmul weight stored as the [N, K] `linear` weight; "dense": as given.
    layout: str
    shape: list[int]
    bytes_before: int
    bytes_after: int
    #: ||W - dequantized W|| / ||W|| (Frobenius; absolute when W is all zeros).
    relative_error: float
    #: max |W - dequantized W|, for weights whose source was already quantized (W: the source's
    #: exact decode).
    max_error: float | None = None
    #: Why the weight got this scheme when it is not simply the configured one (a block or
    #: group size fitted to its shape, an automatic choice, ...).
    note: str = ""
    #: What the source file held before this scheme, when it held codes of its own: a GGUF
    #: tensor's llama.cpp type (`Q4_K`, `Q6_K`, `Q8_0`, `F16`); "" for a float checkpoint.
    source: str = ""
    #: The MIL ops the lowering named for this weight's decoding op (one per function or chunk
    #: that names it differently): how `rlx_mil.milexec.stored_weights` finds the codes the
    #: package holds (a Neural Engine rewrite may add `_conv` / `_part<i>` to them).
    ops: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.bytes_after / self.bytes_before if self.bytes_before else 1.0


@dataclass
class CompressionReport:
    config: str
    target: str
    precision: str
    weights: list[WeightReport] = field(default_factory=list)
    #: Float weights left uncompressed (name -> why), e.g. norms, small tensors.
    kept: dict[str, str] = field(default_factory=dict)
    #: Filled by `measure_output_error`: per output, max |error| and relative L2 error of the
    #: compressed model vs the uncompressed conversion.
    output_error: dict[str, dict[str, float]] | None = None
    #: autoN: what the mix chose overall (each weight's note says what it became and why).
    plan: str = ""
    #: With calibration inputs: per output, the reference on the dequantized weights against
    #: the float weights on those inputs (max |error|, relative L2).
    calibration_error: dict[str, dict[str, float]] | None = None
    #: autoN: sensitivity * estimated error^2 per weight (what a warning ranks by).
    contributions: dict[str, float] = field(default_factory=dict)
    #: Without calibration: the same comparison on inputs the conversion generates
    #: (`rlx_mil.compress.calibration.example_inputs`), unless the config says check=off.
    check_error: dict[str, dict[str, float]] | None = None
    #: The quality check (`rlx_mil.compress.quality_check.QualityCheck.to_dict`): top-1, KL,
    #: perplexity ratio or cosine / PSNR against the uncompressed model, and its verdict.
    quality: dict[str, Any] | None = None

    @property
    def bytes_before(self) -> int:
        return sum(w.bytes_before for w in self.weights)

    @property
    def bytes_after(self) -> int:
        return sum(w.bytes_after for w in self.weights)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> CompressionReport:
        try:
            raw = json.loads(text)
            weights = [WeightReport(**w) for w in raw.pop("weights")]
            return cls(weights=weights, **raw)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as err:
            raise RlxMilError(f"model metadata {METADATA_KEY!r} is not a compression report ({err})") from None

    def to_text(self) -> str:
        lines = [f"compression: {self.config} ({self.target}, {self.precision})"]
        if self.weights:
            ratio = self.bytes_after / self.bytes_before if self.bytes_before else 1.0
            lines.append(
                f"  {counted(len(self.weights), 'weight')}: {human_bytes(self.bytes_before)} -> {human_bytes(self.bytes_after)}"
                f" ({ratio:.3f}x)"
            )
            sources = source_summary(self.weights)
            if sources:
                lines.append(f"  from the file's types: {sources}")
            width = max(len(w.name) for w in self.weights)
            with_max = any(w.max_error is not None for w in self.weights)
            source_width = max((len(w.source) for w in self.weights), default=0)
            source_width = max(source_width, len("source")) if source_width else 0
            source_head = f"{'source':<{source_width}} " if source_width else ""
            header = f"  {'weight':<{width}}  {source_head}{'scheme':<20} {'before':>10} {'after':>10} {'rel.err':>9}"
            lines.append(header + (f" {'max.err':>9}" if with_max else ""))
            for w in self.weights:
                source = f"{w.source or '-':<{source_width}} " if source_width else ""
                row = (f"  {w.name:<{width}}  {source}{w.scheme:<20} {human_bytes(w.bytes_before):>10}"
                       f" {human_bytes(w.bytes_after):>10} {w.relative_error:>9.2e}")
                if with_max:
                    row += f" {w.max_error:>9.2e}" if w.max_error is not None else f" {'-':>9}"
                lines.append(row + (f"  {w.note}" if w.note else ""))
        if self.plan:
            lines.append(f"  {self.plan}")
        if self.kept:
            lines.append(f"  kept in float: {counted(len(self.kept), 'weight')} ({', '.join(sorted(set(self.kept.values())))})")
        if self.output_error:
            for out, err in self.output_error.items():
                lines.append(
                    f"  output {out}: max |error| {err['max_abs']:.3g}, relative L2 {err['relative_l2']:.3g}"
                    " vs the uncompressed conversion"
                )
        else:
            lines.append("  output error vs the uncompressed conversion: not measured")
        for out, err in (self.calibration_error or {}).items():
            lines.append(f"  output {out}: relative L2 {err['relative_l2']:.3g} on the calibration inputs (vs float weights)")
        for out, err in (self.check_error or {}).items():
            lines.append(f"  output {out}: relative L2 {err['relative_l2']:.3g} on generated check inputs (vs float weights)")
        if self.quality is not None:
            from rlx_mil.compress.quality_check import check_from_dict

            lines.append("  " + check_from_dict(self.quality).summary())
        return "\n".join(lines)

    def summary(self) -> dict[str, Any]:
        return {
            "weights": len(self.weights), "bytes_before": self.bytes_before, "bytes_after": self.bytes_after,
            "output_error": self.output_error,
        }


def source_summary(weights: list[WeightReport]) -> str:
    """What the source file's types became, by type: "Q4_K (27) -> lut4-scaled 20, int8 7;
    Q8_0 (10) -> int8 10"; "" when no weight names a source type."""
    by_source: dict[str, dict[str, int]] = {}
    for w in weights:
        if w.source:
            became = by_source.setdefault(w.source, {})
            became[w.scheme] = became.get(w.scheme, 0) + 1
    parts = []
    for source in sorted(by_source):
        became = by_source[source]
        total = sum(became.values())
        kinds = ", ".join(f"{scheme} {n}" for scheme, n in sorted(became.items(), key=lambda kv: (-kv[1], kv[0])))
        parts.append(f"{source} ({total}) -> {kinds}")
    return "; ".join(parts)


def top_contributors(report: CompressionReport, count: int = 5) -> list[tuple[str, float]]:
    """The weights whose compression error contributes most (autoN's sensitivity-weighted
    estimate, else the squared relative error), largest first."""
    if report.contributions:
        ranked = sorted(report.contributions.items(), key=lambda kv: -kv[1])
    else:
        ranked = sorted(((w.name, w.relative_error**2) for w in report.weights), key=lambda kv: -kv[1])
    return ranked[:count]


def worst_weights(report: CompressionReport, count: int = 3) -> list[tuple[str, str]]:
    """(name, scheme) of the `count` weights contributing most, largest first: what a quality
    warning names."""
    schemes = {w.name: w.scheme for w in report.weights}
    return [(n, schemes.get(n, "?")) for n, _ in top_contributors(report, count)]


def merged_report(reports: list[CompressionReport]) -> CompressionReport:
    """One report for the functions of a multifunction package: the last function's fields,
    with every function's compressed weights (a weight several functions share once, with every
    op name they give it) and kept weights. Functions with disjoint weights (a Whisper stateful
    decoder's `cross_attention` and `decode`) each keep theirs in the package's report, so the
    fidelity checks decode all the codes it stores."""
    import dataclasses

    by_name: dict[str, WeightReport] = {}
    for report in reports:
        for w in report.weights:
            seen = by_name.get(w.name)
            if seen is None:
                by_name[w.name] = dataclasses.replace(w, ops=list(w.ops))
            else:
                seen.ops += [op for op in w.ops if op not in seen.ops]
    kept: dict[str, str] = {}
    for report in reports:
        kept.update({n: why for n, why in report.kept.items() if n not in by_name})
    return dataclasses.replace(reports[-1], weights=list(by_name.values()), kept=kept)


def report_of(model_or_metadata: Any) -> CompressionReport | None:
    """The compression report of an `MLModel` (or its metadata mapping), None if uncompressed."""
    meta = getattr(model_or_metadata, "user_defined_metadata", model_or_metadata)
    text = meta.get(METADATA_KEY) if hasattr(meta, "get") else None
    return None if text is None else CompressionReport.from_json(text)
