"""Quality of a compressed model measured against the uncompressed one (pure NumPy).

Every function takes the *reference* (the uncompressed model's output: the float checkpoint,
or for a GGUF file the float model its own codes decode to) first and the *compressed* output
second. Decoders are judged teacher-forced, position by position, on logits shaped
``[..., vocab]`` (leading axes are positions):

* `top1_agreement`: share of positions where both pick the same next token;
* `confident_top1_agreement`: the same, counted only where the reference's top-2 logit gap is
  at least `CONFIDENT_GAP` (raw top-1 on small models is dominated by near-ties);
* `mean_kl`: mean KL(reference ‖ compressed) of the next-token distributions, in nats (what
  llama.cpp's `--kl-divergence` reports);
* `perplexity` / `perplexity_ratio`: on the next tokens (``targets``) of the input text.

Encoders and other graphs are judged per output by `cosine` similarity and `psnr` (dB, peak =
the reference's largest magnitude, as WhisperKit and coremltools compute it).

`decoder_quality` / `output_quality` bundle these into records that know the documented
thresholds (`QualityThresholds`: top-1 < 0.8 -- judged where the reference is confident at 16
positions or more -- or mean KL > 0.1 for decoders, cosine < 0.95 for other outputs) and print the one-line summary conversions show.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rlx_mil.units import counted

#: A position counts for `confident_top1_agreement` when the reference's best logit beats its
#: second best by at least this much.
CONFIDENT_GAP = 0.5
#: Fewer confident positions than this: top-1 is not judged (too few to tell), KL still is.
MIN_CONFIDENT_POSITIONS = 16
#: Positions per chunk when reducing over a large vocabulary (bounds float64 temporaries).
_CHUNK = 64


@dataclass(frozen=True)
class QualityThresholds:
    """Where a compressed model stops keeping the original's quality.

    Chosen on real measurements (docs/compression.md): int8 of SmolLM2-135M keeps top-1 0.968
    and of Whisper base mean KL 0.0007, while every package users called broken had top-1 at
    or below 0.66 (SmolLM2 lut4 0.21, int4 0.66, auto4 0.54) or KL above 0.2; int4 block 32 of
    Whisper (KL 0.095, top-1 0.84) is the worst form still accepted."""

    min_top1: float = 0.8
    max_mean_kl: float = 0.1
    min_cosine: float = 0.95

    def with_targets(self, max_kl: float | None = None, min_top1: float | None = None) -> QualityThresholds:
        """These thresholds with the user's quality target (`--max-kl` / `--min-top1`) in place
        of the documented ones, each validated (`check_target`)."""
        kl = self.max_mean_kl if max_kl is None else check_target("max_kl", max_kl)
        top1 = self.min_top1 if min_top1 is None else check_target("min_top1", min_top1)
        return QualityThresholds(min_top1=top1, max_mean_kl=kl, min_cosine=self.min_cosine)


def check_target(option: str, value: Any) -> float:
    """A quality target as a float: ``max_kl`` a finite mean KL > 0 (nats), ``min_top1`` a share
    in (0, 1]. Anything else (text, NaN, a negative number, a bool) is an `InvalidOptionError`
    naming `option`."""
    from rlx_mil.errors import InvalidOptionError

    wants = "a finite mean KL > 0 (nats)" if option.endswith("kl") else "a top-1 agreement share in (0, 1]"
    if isinstance(value, bool):
        raise InvalidOptionError(f"{option} is {wants}, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidOptionError(f"{option} is {wants}, got {value!r}") from None
    ok = math.isfinite(number) and number > 0 and (option.endswith("kl") or number <= 1)
    if not ok:
        raise InvalidOptionError(f"{option} is {wants}, got {value!r}")
    return number


DEFAULT_THRESHOLDS = QualityThresholds()


def _positions(logits: Any) -> np.ndarray:
    arr = np.asarray(logits)
    if arr.ndim < 1 or arr.shape[-1] < 1:
        raise ValueError(f"logits must be shaped [..., vocab], got {arr.shape}")
    return arr.reshape(-1, arr.shape[-1])


def _pair(reference: Any, compressed: Any) -> tuple[np.ndarray, np.ndarray]:
    ref, got = _positions(reference), _positions(compressed)
    if ref.shape != got.shape:
        raise ValueError(f"reference logits {np.shape(reference)} and compressed logits {np.shape(compressed)} differ in shape")
    return ref, got


def _chunks(count: int) -> Iterator[slice]:
    for start in range(0, count, _CHUNK):
        yield slice(start, min(start + _CHUNK, count))


def log_softmax(logits: Any) -> np.ndarray:
    """log p over the last axis, in float64 (stable: max subtracted first)."""
    x = np.asarray(logits, np.float64)
    shifted = x - np.max(x, axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def top1_agreement(reference: Any, compressed: Any) -> float:
    """Share of positions where the compressed model's argmax equals the reference's."""
    ref, got = _pair(reference, compressed)
    if not len(ref):
        return float("nan")
    return float(np.mean(np.argmax(ref, axis=-1) == np.argmax(got, axis=-1)))


def top2_gaps(reference: Any) -> np.ndarray:
    """Per position, the reference's best logit minus its second best (inf with one class)."""
    ref = _positions(reference).astype(np.float64, copy=False)
    if ref.shape[-1] < 2:
        return np.full(len(ref), np.inf)
    top2 = np.partition(ref, ref.shape[-1] - 2, axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def confident_top1_agreement(reference: Any, compressed: Any, min_gap: float = CONFIDENT_GAP) -> tuple[float, int]:
    """(agreement, positions counted): top-1 agreement over the positions where the
    reference's top-2 gap is at least `min_gap`; nan when no position qualifies."""
    ref, got = _pair(reference, compressed)
    keep = top2_gaps(ref) >= min_gap
    count = int(np.count_nonzero(keep))
    if not count:
        return float("nan"), 0
    same = np.argmax(ref[keep], axis=-1) == np.argmax(got[keep], axis=-1)
    return float(np.mean(same)), count


def kl_per_position(reference: Any, compressed: Any) -> np.ndarray:
    """KL(reference ‖ compressed) of the softmax distributions at each position, in nats."""
    ref, got = _pair(reference, compressed)
    out = np.empty(len(ref))
    for part in _chunks(len(ref)):
        log_p = log_softmax(ref[part])
        log_q = log_softmax(got[part])
        out[part] = np.sum(np.exp(log_p) * (log_p - log_q), axis=-1)
    return np.maximum(out, 0.0)  # rounding can leave -1e-17 where the two agree


def mean_kl(reference: Any, compressed: Any) -> float:
    """Mean over positions of KL(reference ‖ compressed), in nats."""
    kl = kl_per_position(reference, compressed)
    return float(np.mean(kl)) if kl.size else float("nan")


def _target_ids(targets: Any, positions: int, vocab: int) -> np.ndarray:
    ids = np.asarray(targets).reshape(-1).astype(np.int64)
    if len(ids) != positions:
        raise ValueError(f"{counted(len(ids), 'target')} for {counted(positions, 'logit position')}")
    if len(ids) and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"target ids must lie in [0, {vocab}), got {ids.min()}..{ids.max()}")
    return ids


def total_nll(logits: Any, targets: Any) -> float:
    """Sum over positions of the negative log-likelihood of `targets` (one token id per
    position), in nats: what `perplexity` averages, kept as a sum so blocks of a long text add."""
    arr = _positions(logits)
    ids = _target_ids(targets, len(arr), arr.shape[-1])
    nll = 0.0
    for part in _chunks(len(arr)):
        logp = log_softmax(arr[part])
        nll -= float(np.sum(logp[np.arange(len(logp)), ids[part]]))
    return nll


def perplexity(logits: Any, targets: Any) -> float:
    """exp of the mean negative log-likelihood of `targets` (one token id per position)."""
    count = len(_positions(logits))
    return math.exp(total_nll(logits, targets) / count) if count else float("nan")


def perplexity_ratio(reference: Any, compressed: Any, targets: Any) -> float:
    """perplexity(compressed) / perplexity(reference) on the same targets."""
    return perplexity(compressed, targets) / perplexity(reference, targets)


def cosine(reference: Any, compressed: Any) -> float:
    """Cosine similarity of the two outputs flattened (1.0 when both are all zeros)."""
    a = np.asarray(reference, np.float64).reshape(-1)
    b = np.asarray(compressed, np.float64).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"reference {np.shape(reference)} and compressed {np.shape(compressed)} differ in shape")
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def psnr(reference: Any, compressed: Any) -> float:
    """Peak signal-to-noise ratio in dB: 10 log10(max|reference|^2 / mean squared error);
    inf when the two are equal."""
    a = np.asarray(reference, np.float64).reshape(-1)
    b = np.asarray(compressed, np.float64).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"reference {np.shape(reference)} and compressed {np.shape(compressed)} differ in shape")
    mse = float(np.mean((a - b) ** 2)) if a.size else 0.0
    if mse == 0.0:
        return float("inf")
    peak = float(np.max(np.abs(a)))
    return 10.0 * math.log10(peak * peak / mse) if peak > 0 else float("-inf")


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


@dataclass(frozen=True)
class DecoderQuality:
    """Teacher-forced next-token quality of a compressed decoder against its reference."""

    positions: int
    top1: float
    #: top-1 agreement where the reference's top-2 gap >= CONFIDENT_GAP, and how many such.
    top1_confident: float
    confident_positions: int
    mean_kl: float
    max_kl: float
    #: Only with targets (the input's own next tokens): perplexities and their ratio.
    perplexity_reference: float | None = None
    perplexity_compressed: float | None = None

    @property
    def perplexity_ratio(self) -> float | None:
        if self.perplexity_reference is None or self.perplexity_compressed is None:
            return None
        return self.perplexity_compressed / self.perplexity_reference

    @property
    def top1_judged(self) -> bool:
        """Whether top-1 is judged: only with `MIN_CONFIDENT_POSITIONS` positions where the
        reference is confident (on fewer, or a model all near-ties, top-1 measures the ties)."""
        return self.confident_positions >= MIN_CONFIDENT_POSITIONS

    def failures(self, thresholds: QualityThresholds = DEFAULT_THRESHOLDS) -> list[str]:
        """Each threshold crossed, as a short phrase; empty when quality is kept. Top-1 (all
        positions, and where the reference is confident) is judged when `top1_judged`; mean KL
        always."""
        out = []
        if self.top1_judged:
            for which, value in (("top-1", self.top1), ("confident top-1", self.top1_confident)):
                if not value >= thresholds.min_top1:  # nan fails too
                    out.append(f"{which} {value * 100:.1f} % < {thresholds.min_top1 * 100:.0f} %")
        if not self.mean_kl <= thresholds.max_mean_kl:
            out.append(f"mean KL {self.mean_kl:.3g} > {thresholds.max_mean_kl:g}")
        return out

    def summary(self) -> str:
        """`top-1 96.8 %, KL 0.005, ppl x1.011` (no 'vs what': the caller says that)."""
        parts = [f"top-1 {self.top1 * 100:.1f} %"]
        if self.confident_positions and self.confident_positions != self.positions:
            parts.append(f"confident top-1 {self.top1_confident * 100:.1f} % ({counted(self.confident_positions, 'position')})")
        parts.append(f"KL {self.mean_kl:.3g}")
        ratio = self.perplexity_ratio
        if ratio is not None:
            parts.append(f"ppl x{ratio:.3f}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        raw = asdict(self)
        raw["perplexity_ratio"] = self.perplexity_ratio
        return {k: (_finite(v) if isinstance(v, float) else v) for k, v in raw.items()}


@dataclass
class DecoderTally:
    """Running sums of the decoder metrics over blocks of positions judged one after another
    (a long text's windows, without holding all their logits at once): `add` each block,
    `result` gives the `DecoderQuality` of all of them -- the numbers one `decoder_quality`
    call on the blocks concatenated gives, by the same code."""

    positions: int = 0
    agree: int = 0
    confident_agree: int = 0
    confident_positions: int = 0
    kl_sum: float = 0.0
    kl_max: float = -math.inf
    #: Negative log-likelihood sums of the targets; None until a block comes without targets.
    nll_reference: float | None = 0.0
    nll_compressed: float | None = 0.0

    def add(self, reference: Any, compressed: Any, targets: Any | None = None) -> None:
        """Judge one block of positions: `compressed` logits against `reference` logits (shaped
        ``[..., vocab]`` alike), with `targets` (the next token at each position) the NLLs."""
        ref, got = _pair(reference, compressed)
        ids = None if targets is None else _target_ids(targets, len(ref), ref.shape[-1])
        if ids is None:
            self.nll_reference = self.nll_compressed = None
        # One pass over the positions: each side's log-softmax once, for the KL and both
        # perplexities (a large vocabulary makes these passes the check's main cost after the runs);
        # a block of positions at a time, so no float64 copy of all the logits is ever made.
        for part in _chunks(len(ref)):
            same = np.argmax(ref[part], axis=-1) == np.argmax(got[part], axis=-1)
            keep = top2_gaps(ref[part]) >= CONFIDENT_GAP
            self.agree += int(np.count_nonzero(same))
            self.confident_agree += int(np.count_nonzero(same & keep))
            self.confident_positions += int(np.count_nonzero(keep))
            log_p, log_q = log_softmax(ref[part]), log_softmax(got[part])
            kl = np.maximum(np.sum(np.exp(log_p) * (log_p - log_q), axis=-1), 0.0)  # -1e-17 where they agree
            self.kl_sum += float(np.sum(kl))
            self.kl_max = max(self.kl_max, float(np.max(kl)))
            if ids is not None and self.nll_reference is not None and self.nll_compressed is not None:
                rows, picked = np.arange(len(log_p)), ids[part]
                self.nll_reference -= float(np.sum(log_p[rows, picked]))
                self.nll_compressed -= float(np.sum(log_q[rows, picked]))
        self.positions += len(ref)

    def result(self) -> DecoderQuality:
        """The metrics over every position added (nan where there are none)."""
        n = self.positions
        ppl_ref = ppl_got = None
        if self.nll_reference is not None and self.nll_compressed is not None:
            ppl_ref, ppl_got = (math.exp(self.nll_reference / n), math.exp(self.nll_compressed / n)) if n else (math.nan, math.nan)
        return DecoderQuality(
            positions=n, top1=self.agree / n if n else math.nan,
            top1_confident=self.confident_agree / self.confident_positions if self.confident_positions else math.nan,
            confident_positions=self.confident_positions, mean_kl=self.kl_sum / n if n else math.nan,
            max_kl=self.kl_max if n else math.nan, perplexity_reference=ppl_ref, perplexity_compressed=ppl_got,
        )


def decoder_quality(reference: Any, compressed: Any, targets: Any | None = None) -> DecoderQuality:
    """All decoder metrics of `compressed` logits against `reference` logits; with `targets`
    (the next token at each position) the perplexities too."""
    tally = DecoderTally()
    tally.add(reference, compressed, targets)
    return tally.result()


@dataclass(frozen=True)
class OutputQuality:
    """One output of an encoder (or any graph) against its reference."""

    name: str
    cosine: float
    psnr: float
    #: How many examples (the leading axis of a batch: sentences) `cosine` is the worst of.
    items: int = 1

    def failures(self, thresholds: QualityThresholds = DEFAULT_THRESHOLDS) -> list[str]:
        if not self.cosine >= thresholds.min_cosine:
            return [f"{self.name!r} cosine {self.cosine:.4f} < {thresholds.min_cosine:g}"]
        return []

    def summary(self) -> str:
        db = "inf" if math.isinf(self.psnr) else f"{self.psnr:.1f}"
        worst = f" (the worst of {self.items} examples)" if self.items > 1 else ""
        return f"{self.name} cosine {self.cosine:.4f}{worst}, PSNR {db} dB"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "cosine": self.cosine, "psnr": _finite(self.psnr), "items": self.items}


def output_quality(name: str, reference: Any, compressed: Any, *, per_example: bool = False) -> OutputQuality:
    """Cosine and PSNR of one compressed output against the reference. `per_example`: an
    output with a batch of several examples (sentence embeddings `[batch, hidden]`) is judged
    by its worst example's cosine: one bad sentence among good ones moves the cosine of the
    whole batch little (MiniLM `int4`: 0.958 over 8 sentences, 0.947 for the worst)."""
    ref, got = np.asarray(reference), np.asarray(compressed)
    if per_example and ref.ndim >= 2 and ref.shape[0] > 1 and ref.shape == got.shape:
        worst = min(cosine(r, g) for r, g in zip(ref, got, strict=True))
        return OutputQuality(name=name, cosine=worst, psnr=psnr(ref, got), items=int(ref.shape[0]))
    return OutputQuality(name=name, cosine=cosine(ref, got), psnr=psnr(ref, got))
