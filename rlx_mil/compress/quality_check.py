"""The conversion's quality check: a compressed model's outputs against the uncompressed model's
on the same inputs, judged by `rlx_mil.compress.quality` and its documented thresholds.

`judge_outputs` turns the two models' outputs into a `QualityCheck`: a logits output (named
``logits``, last axis the vocabulary) is judged as a decoder, teacher-forced, with perplexity
on the input's own next tokens when the input is token ids; any other float output by cosine
and PSNR. The check says what it compared with (`compared_with`) and on which inputs
(`inputs`), prints one summary line, and `warn_below_threshold` raises one
`CompressionWarning` naming the three weights contributing most when a threshold is crossed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_mil.compress.quality import (
    DEFAULT_THRESHOLDS,
    DecoderQuality,
    OutputQuality,
    QualityThresholds,
    decoder_quality,
    output_quality,
)
from rlx_mil.errors import CompressionWarning

#: How many weights a warning names.
WORST_NAMED = 3
#: What the quality is compared with when the caller says nothing more precise.
UNCOMPRESSED = "the uncompressed model"


@dataclass
class QualityCheck:
    """One measurement of a compressed model against the uncompressed one."""

    #: What the reference was: "the float checkpoint", "the float model the GGUF codes decode to", ...
    compared_with: str
    #: Which inputs: "the calibration inputs", "200 tokens of the built-in English text", ...
    inputs: str
    decoder: DecoderQuality | None = None
    outputs: list[OutputQuality] = field(default_factory=list)
    #: The weights contributing most to the error: (name, scheme), largest first.
    worst: list[tuple[str, str]] = field(default_factory=list)
    thresholds: QualityThresholds = DEFAULT_THRESHOLDS

    @property
    def failures(self) -> list[str]:
        out = self.decoder.failures(self.thresholds) if self.decoder is not None else []
        for o in self.outputs:
            out += o.failures(self.thresholds)
        return out

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        """`quality vs the float checkpoint: top-1 96.8 %, KL 0.005, ppl x1.011 (on ...)`."""
        parts = [self.decoder.summary()] if self.decoder is not None else []
        parts += [o.summary() for o in self.outputs]
        measured = "; ".join(parts) if parts else "no float output to compare"
        verdict = "" if self.ok else " -- BELOW THRESHOLD (" + "; ".join(self.failures) + ")"
        return f"quality vs {self.compared_with}: {measured} (on {self.inputs}){verdict}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "compared_with": self.compared_with, "inputs": self.inputs, "ok": self.ok, "failures": self.failures,
            "decoder": None if self.decoder is None else self.decoder.to_dict(),
            "outputs": [o.to_dict() for o in self.outputs],
            "worst": [{"name": n, "scheme": s} for n, s in self.worst],
            "thresholds": {"min_top1": self.thresholds.min_top1, "max_mean_kl": self.thresholds.max_mean_kl,
                           "min_cosine": self.thresholds.min_cosine},
        }


def _is_logits(name: str, value: np.ndarray) -> bool:
    return "logits" in name and value.ndim >= 2 and value.dtype.kind == "f" and value.shape[-1] > 1


def next_token_targets(inputs: Mapping[str, Any], logits_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """(positions to judge, next token at each) when `inputs` holds the token ids the logits
    were computed from (``input_ids`` shaped like the logits' leading axes): every position but
    the last of each row predicts the next id. None when the ids cannot be matched."""
    ids = inputs.get("input_ids")
    if ids is None:
        return None
    arr = np.asarray(ids)
    if arr.shape != tuple(logits_shape[:-1]) or arr.ndim < 1 or arr.shape[-1] < 2:
        return None
    mask = inputs.get("attention_mask")
    keep = np.ones(arr.shape, bool)
    keep[..., -1] = False
    if mask is not None and np.shape(mask) == arr.shape:
        m = np.asarray(mask) != 0
        keep &= m & np.roll(m, -1, axis=-1)  # the position and its target are both real tokens
    targets = np.roll(arr, -1, axis=-1)
    return keep, targets


def _kept(keep: np.ndarray, reference: np.ndarray, compressed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both logits (shaped `[*keep.shape, vocab]`) at the positions `keep` selects, as
    `[n, vocab]`: views when they are the first n positions (one row less its last token, the
    usual case), else copies."""
    where = np.flatnonzero(keep.reshape(-1))
    r, g = (x.reshape(-1, x.shape[-1]) for x in (reference, compressed))
    if len(where) and where[-1] == len(where) - 1:  # positions 0..n-1
        return r[: len(where)], g[: len(where)]
    return r[where], g[where]


def judge_outputs(
    want: Mapping[str, Any],
    got: Mapping[str, Any],
    inputs: Mapping[str, Any],
    *,
    compared_with: str = UNCOMPRESSED,
    inputs_label: str,
    worst: list[tuple[str, str]] | None = None,
    thresholds: QualityThresholds = DEFAULT_THRESHOLDS,
    text: bool = True,
) -> QualityCheck:
    """Judge each output of the compressed model (`got`) against the uncompressed one's
    (`want`): logits as a decoder (teacher-forced on `inputs`' ids when they match), other
    float outputs by cosine / PSNR; integer outputs are skipped. `text` False (generated ids,
    not language): no perplexity, which would mean nothing."""
    check = QualityCheck(compared_with=compared_with, inputs=inputs_label, worst=list(worst or []), thresholds=thresholds)
    for name, ref in want.items():
        r = np.asarray(ref)
        g = np.asarray(got[name])
        if r.dtype.kind != "f":
            continue
        if check.decoder is None and _is_logits(name, r):
            matched = next_token_targets(inputs, r.shape)
            if matched is not None and matched[0].any():
                keep, targets = matched
                kept_r, kept_g = _kept(keep, r, g)
                check.decoder = decoder_quality(kept_r, kept_g, targets[keep] if text else None)
            else:
                check.decoder = decoder_quality(r, g)
            continue
        check.outputs.append(output_quality(name, r, g, per_example=True))
    return check


def warn_below_threshold(check: QualityCheck, stacklevel: int = 3) -> None:
    """One `CompressionWarning` (one line, then the weights contributing most) when `check`
    crossed a documented threshold; nothing otherwise."""
    if check.ok:
        return
    lines = [check.summary()]
    if check.worst:
        lines.append("  the weights contributing most: " + ", ".join(f"{n} ({s})" for n, s in check.worst[:WORST_NAMED]))
    lines.append("  widen them (e.g. a rule 'NAME=int8'), use a wider scheme, or autoN with a larger budget")
    warnings.warn(CompressionWarning("\n".join(lines)), stacklevel=stacklevel)


def check_from_dict(raw: Mapping[str, Any]) -> QualityCheck:
    """A `QualityCheck` back from `to_dict` (a package's metadata or a --report file)."""
    dec = raw.get("decoder")
    decoder = None
    if dec is not None:
        decoder = DecoderQuality(**{k: (v if k.startswith("perplexity") else _num(v))
                                    for k, v in dec.items() if k != "perplexity_ratio"})
    outputs = [OutputQuality(o["name"], float(_num(o["cosine"])), float(_num(o["psnr"], math.inf)), _items(o.get("items")))
               for o in raw.get("outputs", [])]
    t = raw.get("thresholds") or {}
    return QualityCheck(
        compared_with=str(raw.get("compared_with", UNCOMPRESSED)), inputs=str(raw.get("inputs", "")), decoder=decoder,
        outputs=outputs, worst=[(w["name"], w["scheme"]) for w in raw.get("worst", [])],
        thresholds=QualityThresholds(**t) if t else DEFAULT_THRESHOLDS,
    )


def _num(value: Any, missing: float = math.nan) -> Any:
    return missing if value is None else value


def _items(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1
