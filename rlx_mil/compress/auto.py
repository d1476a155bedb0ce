"""Automatic per-weight mixes: ``compress="auto4"`` (auto3 / auto6 / auto8).

Every weight the config would compress with its default scheme gets one of a few candidate
schemes instead, chosen from error statistics computed while converting:

1. For each weight and candidate (`CANDIDATES`), the relative error ``||W - Q(W)|| / ||W||``
   is measured on a sample of its output channels (`SAMPLE_ROWS`, whole groups; the codes are
   the ones the full encode gives those rows) and the package bytes are extrapolated. With
   calibration inputs the error is activation-weighted: column j of the stored ``[out, in]``
   weight counts with ``E[x_j^2]`` of the activation it multiplies (AWQ's per-channel
   importance), i.e. the expected relative error of that layer's output.
2. Every weight starts at the cheapest candidate. With ``max_error`` each is widened to the
   cheapest candidate within it. Then, within the size budget (``budget``, a fraction of the
   fp16 weight bytes; default `AUTO_BUDGETS`), the widening that removes the most
   ``sensitivity * error^2`` per added byte is taken, again and again, while it fits.
   Sensitivity is 1, 4 for the LM head, 2 for embeddings (a tied embedding is both), times 1.5
   for the first and last layer's weights. Measured instead when the model is small enough
   (`measured_weights`); for a larger one, measured on a sample (the embedding / LM head and
   ordinary weights spread over the layers), each other weight taking the mean of the measured
   weights of its kind (its name without the layer number).

The report says, per weight, which candidate it became, its estimated error and why.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_mil.compress.emit import check_target, compressed_bytes
from rlx_mil.compress.fit import fit_to_shape
from rlx_mil.compress.linear import LinearCodes, quantize_linear, rows_view
from rlx_mil.compress.lowrank import CorrectedCodes, check_rank_fits, correct
from rlx_mil.compress.palette import PaletteCodes, palettize
from rlx_mil.compress.schemes import AUTO_BUDGETS, PER_GROUPED_CHANNEL, PaletteScheme, Scheme, parse_scheme
from rlx_mil.errors import CompressionError, CompressionWarning
from rlx_mil.lowering.target import Target
from rlx_mil.units import counted

#: Candidates per target width, cheapest first.
CANDIDATES: dict[int, tuple[str, ...]] = {
    3: ("lut3", "lut4", "int4", "uint4-float", "lut6", "int8"),
    4: ("lut4", "int4", "uint4-float", "lut6", "int8"),
    6: ("lut6", "int8"),
    8: ("int8",),
}
#: With measured sensitivities, also these (narrower than the target width) first.
NARROWER: dict[int, tuple[str, ...]] = {3: ("lut2",), 4: ("lut2", "lut3"), 6: ("lut3", "lut4"), 8: ("lut4", "lut6")}
#: How much a weight's squared error counts, by role: an LM head's error lands on the logits
#: directly, an embedding's on every token's input.
ROLE_SENSITIVITY = {"lm_head": 4.0, "embedding": 2.0}
#: Output channels per weight whose error is measured (whole groups of a grouped palette).
SAMPLE_ROWS = 256
#: The most a layer's measured loss may scale its weights' kind means (`layer_scaled`), either
#: way: a few hundred calibration tokens measure a layer's small loss only roughly.
MAX_LAYER_FACTOR = 10.0
_LAYER = re.compile(r"(?:^|\.)(?:layers?|blk|h|block)\.(\d+)\.")


@dataclass
class Option:
    scheme: Scheme
    error: float
    bytes: int


@dataclass
class AutoPlan:
    schemes: dict[str, Scheme]
    notes: dict[str, str]
    #: sensitivity * estimated error^2 of each weight's choice (what the warnings rank by).
    contributions: dict[str, float]
    summary: str


def _sample(storage: np.ndarray, scheme: Scheme) -> np.ndarray:
    """Up to `SAMPLE_ROWS` output channels of the storage array ([rows, rest]), in chunks of
    whole groups spread over the weight."""
    rows = rows_view(storage)
    channels = rows.shape[0]
    chunk = 16
    if isinstance(scheme, PaletteScheme) and scheme.granularity == PER_GROUPED_CHANNEL:
        chunk = scheme.group_size * max(1, -(-16 // scheme.group_size))
    if channels <= max(SAMPLE_ROWS, chunk):
        return np.asarray(rows)
    starts = np.unique(np.linspace(0, channels // chunk - 1, max(1, SAMPLE_ROWS // chunk)).astype(np.int64) * chunk)
    return np.concatenate([np.asarray(rows[s:s + chunk]) for s in starts])


def _weighted_error(sample: np.ndarray, back: np.ndarray, importance: np.ndarray | None) -> float:
    w = np.asarray(sample, np.float64).reshape(sample.shape[0], -1)
    d = np.asarray(back, np.float64).reshape(w.shape) - w
    if importance is not None and importance.size == w.shape[1]:
        a = importance.astype(np.float64)[None, :]
        num, den = float(np.sum(a * d * d)), float(np.sum(a * w * w))
    else:
        num, den = float(np.sum(d * d)), float(np.sum(w * w))
    return float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))


def options_for(
    storage: np.ndarray, bits: int, target: Target, store: type[np.floating[Any]], importance: np.ndarray | None = None,
    candidates: tuple[str, ...] | None = None, corrected: bool = True,
) -> list[Option]:
    """Each candidate the target holds, with its estimated error and bytes, cheapest first;
    candidates another one beats on both are dropped. A candidate with a low-rank correction
    (``+rN``, `rlx_mil.compress.lowrank`) is left out unless `corrected`; its error is measured
    on the same sample of rows, the correction fitted with the same activation weighting at
    the rank scaled by the sample's share of the rows (a rank-N correction of all rows removes
    about what rank N x share removes from the sample; the whole weight's encode cost 27x the
    sample's, 18 s a weight of SmolLM2's MLP under load)."""
    shape = tuple(int(d) for d in storage.shape)
    channels = rows_view(storage).shape[0]
    found = []
    for text in candidates or CANDIDATES[bits]:
        base = parse_scheme(text)
        assert base is not None
        scheme, _ = fit_to_shape(base, shape, target)
        try:
            check_target(scheme, target, "weight")
            check_rank_fits(scheme, shape, "weight")
        except CompressionError:
            continue
        if scheme.rank and not corrected:
            continue
        sample = _sample(storage, scheme)
        codes: LinearCodes | PaletteCodes | CorrectedCodes
        plain = dataclasses.replace(scheme, rank=0)
        if isinstance(plain, PaletteScheme):
            codes = palettize(sample, plain, store)
        else:
            codes = quantize_linear(sample.reshape((sample.shape[0], *shape[1:])), plain, store)
        if scheme.rank:
            share = dataclasses.replace(scheme, rank=max(1, round(scheme.rank * sample.shape[0] / channels)))
            codes = correct(codes, sample.reshape(sample.shape[0], -1), share, store, "weight", importance)
        estimate = round(compressed_bytes(codes.base if isinstance(codes, CorrectedCodes) else codes, target)
                         * channels / sample.shape[0])
        if scheme.rank:  # the whole weight's factors, A [out, N] and B [N, in]
            estimate += scheme.rank * (channels + rows_view(storage).shape[1]) * np.dtype(store).itemsize
        found.append(Option(scheme, _weighted_error(sample, codes.dequantize(), importance), estimate))
    found.sort(key=lambda o: (o.bytes, o.error))
    kept: list[Option] = []
    for option in found:
        if not kept or option.error < kept[-1].error:
            kept.append(option)
    return kept


def sensitivity(name: str, role: str, layers: int) -> float:
    factor = ROLE_SENSITIVITY.get(role, 1.0)
    m = _LAYER.search(name)
    if m is not None and layers > 2 and int(m.group(1)) in (0, layers - 1):
        factor *= 1.5
    return factor


def _layer_of(name: str) -> int | None:
    m = _LAYER.search(name)
    return None if m is None else int(m.group(1))


def weight_kind(name: str) -> str:
    """A weight's name with its layer number left out: what the same weight of every layer shares."""
    m = _LAYER.search(name)
    return name if m is None else name[:m.start(1)] + "#" + name[m.end(1):]


def measured_weights(
    options: Mapping[str, list[Option]], fallback: Mapping[str, float], measure: Callable[[str, Scheme], float],
    sample: Collection[str] | None = None, measure_layer: Callable[[Mapping[str, Scheme]], float] | None = None,
) -> dict[str, float]:
    """Each weight's sensitivity from the model's measured output: with only weight n at its
    cheapest candidate the output's squared relative error is m_n, and a candidate of error e is
    predicted to cost m_n * (e / e_start)^2 (output errors of different weights add up, and one
    weight's scales with its error squared). The unit is the output's squared error, so the
    budget goes where the output gains most. A weight whose start is exact keeps `fallback`.

    With `sample`, only those weights are measured; every other one takes the mean of the
    measured weights of its kind (`weight_kind`), else of all measured weights, and with
    `measure_layer` that mean is scaled per layer (`layer_scaled`)."""
    out: dict[str, float] = {}
    kinds: dict[str, list[float]] = {}
    for name, opts in options.items():
        if sample is not None and name not in sample:
            continue
        start = opts[0].error
        if start > 0:
            out[name] = measure(name, opts[0].scheme) / start**2
            kinds.setdefault(weight_kind(name), []).append(out[name])
        else:
            out[name] = fallback[name]
    every = [v for values in kinds.values() for v in values]
    for name in options:
        if name not in out:
            values = kinds.get(weight_kind(name)) or every
            out[name] = float(np.mean(values)) if values else fallback[name]
    if sample is not None and measure_layer is not None:
        out = layer_scaled(options, out, sample, measure_layer)
    return out


def layer_scaled(
    options: Mapping[str, list[Option]], weights: Mapping[str, float], measured: Collection[str],
    measure_layer: Callable[[Mapping[str, Scheme]], float],
) -> dict[str, float]:
    """`weights` with each layer's unmeasured weights scaled by how much more (or less) that
    layer moves the output than its weights' kinds predict.

    `measure_layer(schemes)` is the output loss with the weights of one layer all at their
    start (`schemes`); the prediction is the sum of ``weights * start error^2`` over them. A
    weight of kind K is not equally felt at every depth (SmolLM2-135M: two of 30 layers carry
    43 % of the Neural Engine mix's KL), which a kind's mean cannot see. Each layer's factor is
    its measured / predicted ratio over the mean ratio of all layers (weighted by their
    predictions), so the layers share the loss as measured while its total stays what the
    single-weight measurements said (a layer's weights together at a narrow start need not add
    up as they do alone). Weights measured one by one keep their own measurement."""
    layers: dict[int, list[str]] = {}
    for name, opts in options.items():
        layer = _layer_of(name)
        if layer is not None and opts[0].error > 0:
            layers.setdefault(layer, []).append(name)
    if len(layers) < 2:
        return dict(weights)
    found: dict[int, tuple[float, float]] = {}
    for layer, names in sorted(layers.items()):
        guess = sum(weights[n] * options[n][0].error ** 2 for n in names)
        found[layer] = (measure_layer({n: options[n][0].scheme for n in names}), guess)
    total_measured = sum(m for m, _ in found.values())
    total_guess = sum(g for _, g in found.values())
    out = dict(weights)
    if total_measured <= 0 or total_guess <= 0:
        return out
    for layer, names in layers.items():
        m, g = found[layer]
        if g <= 0:
            continue
        factor = min(max((m / g) / (total_measured / total_guess), 1 / MAX_LAYER_FACTOR), MAX_LAYER_FACTOR)
        for name in names:
            if name not in measured:
                out[name] = weights[name] * factor
    return out


def layer_count(names: list[str]) -> int:
    found = [int(m.group(1)) for n in names if (m := _LAYER.search(n))]
    return max(found) + 1 if found else 0


def predicted(options: Mapping[str, list[Option]], weights: Mapping[str, float], pick: Mapping[str, int]) -> float:
    """The summed ``sensitivity * error^2`` of a mix: with measured sensitivities, the model's
    predicted output loss (mean KL for a decoder) with every weight as picked."""
    return float(sum(weights[n] * options[n][i].error ** 2 for n, i in pick.items()))


def _best_widening(
    options: Mapping[str, list[Option]], weights: Mapping[str, float], pick: Mapping[str, int], room: float,
) -> tuple[float, str, int] | None:
    """The widening (weight, option) removing the most ``sensitivity * error^2`` per added byte
    among those adding at most `room` bytes; None when none fits."""
    best: tuple[float, str, int] | None = None
    for n, i in pick.items():
        o = options[n][i]
        for j in range(i + 1, len(options[n])):
            q = options[n][j]
            extra = q.bytes - o.bytes
            if extra > room:
                break
            gain = weights[n] * (o.error**2 - q.error**2) / max(extra, 1)
            if best is None or gain > best[0]:
                best = (gain, n, j)
    return best


def bytes_for_target(
    options: Mapping[str, list[Option]], weights: Mapping[str, float], pick: Mapping[str, int], used: int, target: float,
) -> int | None:
    """The bytes the greedy widening needs, from `pick` (taking `used` bytes), before the
    predicted loss (`predicted`) is at most `target`; None when even the widest mix misses it."""
    pick = dict(pick)
    while predicted(options, weights, pick) > target:
        step = _best_widening(options, weights, pick, float("inf"))
        if step is None:
            return None
        _, n, j = step
        used += options[n][j].bytes - options[n][pick[n]].bytes
        pick[n] = j
    return used


def choose(
    options: Mapping[str, list[Option]], weights: Mapping[str, float], fixed_bytes: int, total_before: int,
    bits: int, budget: float | None, max_error: float | None, target: float | None = None,
) -> tuple[dict[str, int], dict[str, str], float]:
    """Index of each weight's option, a reason per weight, and the size fraction reached.

    With `target` (a bound on `predicted`, the measured loss: mean KL for a decoder) the
    widening stops as soon as the mix is predicted to meet it: the cheapest mix found that
    does, within the budget."""
    pick = {n: 0 for n in options}
    why = {n: f"the {bits}-bit start" for n in options}
    if max_error is not None:
        for n, opts in options.items():
            within = [i for i, o in enumerate(opts) if o.error <= max_error]
            pick[n] = within[0] if within else len(opts) - 1
            if pick[n]:
                why[n] = f"widened to meet max_error {max_error:g}" if within else f"widest: no candidate meets max_error {max_error:g}"
    cap = None if budget is None and (max_error is not None or target is not None) else (
        (AUTO_BUDGETS[bits] if budget is None else budget) * total_before)
    used = fixed_bytes + sum(options[n][i].bytes for n, i in pick.items())
    if cap is None and target is not None:
        cap = float("inf")
    if cap is not None:
        while used > cap:  # max_error asked for more than the budget: narrow the cheapest losses first
            best: tuple[float, str] | None = None
            for n, i in pick.items():
                if i > 0:
                    o, p = options[n][i], options[n][i - 1]
                    cost = weights[n] * (p.error**2 - o.error**2) / max(o.bytes - p.bytes, 1)
                    if best is None or cost < best[0]:
                        best = (cost, n)
            if best is None:
                break
            n = best[1]
            used -= options[n][pick[n]].bytes - options[n][pick[n] - 1].bytes
            pick[n] -= 1
            why[n] = "narrowed to fit the budget"
        while target is None or predicted(options, weights, pick) > target:
            best_gain = _best_widening(options, weights, pick, cap - used)
            if best_gain is None:
                break
            _, n, j = best_gain
            used += options[n][j].bytes - options[n][pick[n]].bytes
            pick[n] = j
            why[n] = ("widened: among the largest loss reductions per byte toward the quality target" if target is not None
                      else "widened: among the largest error reductions per byte within the budget")
    return pick, why, used / total_before if total_before else 1.0


def plan_auto(
    bits: int, storages: Mapping[str, Any], roles: Mapping[str, str], target: Target, store: type[np.floating[Any]],
    fixed_bytes: int, total_before: int, budget: float | None, max_error: float | None,
    importance: Mapping[str, np.ndarray] | None = None, candidates: tuple[str, ...] | None = None,
    measure: Callable[[str, Scheme], float] | None = None, sample: Collection[str] | None = None,
    loss_target: float | None = None, loss_unit: str = "squared output error", narrower: tuple[str, ...] = (),
    measure_layer: Callable[[Mapping[str, Scheme]], float] | None = None, measured_note: str = "",
    uncorrected: Collection[str] = (),
) -> AutoPlan:
    """The mix for the weights `storages` (name -> a callable giving the storage-layout array,
    read one weight at a time), `fixed_bytes` being what the other weights take. `measure(name,
    scheme)`, when given, is the squared relative output error of the model with only that
    weight compressed with that scheme: the sensitivities then come from it (`measured_weights`),
    for the weights in `sample` only when it is given."""
    options: dict[str, list[Option]] = {}
    if measure is not None:
        # Measured sensitivities show which weights the outputs hardly feel: those may go
        # narrower than the target width, paying for the ones they do feel.
        candidates = NARROWER[bits] + CANDIDATES[bits] if candidates is None else tuple(narrower) + tuple(candidates)
    if measure is None:
        loss_target = None  # without measured sensitivities the sums are weight errors, not a loss
    for name, read in storages.items():
        options[name] = options_for(read(), bits, target, store, (importance or {}).get(name), candidates,
                                    corrected=name not in uncorrected)
    layers = layer_count(list(storages))
    weights = {n: sensitivity(n, roles.get(n, "weight"), layers) for n in options}
    for n in options:
        if roles.get(n) == "lm_head":
            # Measured on trained decoders (SmolLM2, Whisper base): 4-bit codes on the LM head /
            # tied embedding cost more than 4-bit codes on every other weight together, so
            # without measured sensitivities it counts as much as all of them.
            weights[n] = max(weights[n], float(len(options)))
    if measure is not None:
        weights = measured_weights(options, weights, measure, sample, measure_layer)
    pick, why, reached = choose(options, weights, fixed_bytes, total_before, bits, budget, max_error, loss_target)
    for n in pick:
        if roles.get(n) == "lm_head":
            why[n] = f"head: the most sensitive weight; {why[n]}"
    schemes, notes, contributions = {}, {}, {}
    for name, i in pick.items():
        o = options[name][i]
        schemes[name] = o.scheme
        start = options[name][0]
        extra = "" if i == 0 else f"; {start.scheme.label} {start.error:.3g}"
        contributions[name] = weights[name] * o.error**2
        share = f"; predicted {loss_unit} {contributions[name]:.2g}" if measure is not None else ""
        notes[name] = f"auto{bits}: est. error {o.error:.3g}{extra}{share} ({why[name]})"
    widened = sum(1 for i in pick.values() if i)
    free = budget is None and (max_error is not None or loss_target is not None)
    cap = "none" if free else f"{AUTO_BUDGETS[bits] if budget is None else budget:g}x"
    over = ""
    asked = None if free else (AUTO_BUDGETS[bits] if budget is None else budget)
    if asked is not None and total_before and reached > asked + 5e-4:
        # Even the narrowest candidate of every weight does not fit: say so, and what would.
        over = (f"; the budget {asked:g}x cannot be met: the narrowest mix this target holds takes {reached:.3f}x,"
                f" give a budget of at least {math.ceil(reached * 1000) / 1000:g}")
        warnings.warn(CompressionWarning(f"auto{bits}: {over[2:]}"), stacklevel=3)
    loss = ""
    if measure is not None:
        expected = predicted(options, weights, pick)
        loss = f"; predicted {loss_unit} {expected:.3g}"
        if loss_target is not None:
            loss += f" (target {loss_target:.3g})"
            if expected > loss_target * (1 + 1e-9) and not over:
                used = fixed_bytes + sum(options[n][i].bytes for n, i in pick.items())
                need = bytes_for_target(options, weights, pick, used, loss_target)
                if need is None:
                    miss = (f"the quality target ({loss_unit} {loss_target:.3g}) cannot be met by any mix of"
                            f" {'/'.join(CANDIDATES[bits]) if candidates is None else '/'.join(candidates)}:"
                            f" the widest is predicted at {predicted(options, weights, {n: len(o) - 1 for n, o in options.items()}):.3g}")
                else:
                    miss = (f"the quality target ({loss_unit} {loss_target:.3g}) cannot be met within the budget {cap}:"
                            f" predicted {expected:.3g}; a budget of {math.ceil(need / total_before * 1000) / 1000:g}"
                            " is predicted to meet it")
                over = "; " + miss
                warnings.warn(CompressionWarning(f"auto{bits}: {miss}"), stacklevel=3)
    basis = "activation-weighted" if importance else "weight-space"
    measured = ""
    if measure is not None:
        measured = ", measured output sensitivities"
        if sample is not None:
            measured += f" ({sum(1 for n in pick if n in sample)} of {counted(len(pick), 'weight')} measured, the rest by kind"
            layered = len({_layer_of(n) for n in pick} - {None}) if measure_layer is not None else 0
            measured += (f", scaled per layer by {layered} measured layers" if layered >= 2 else "") + ")"
        measured += measured_note
    summary = (f"auto{bits}: {widened} of {counted(len(pick), 'weight')} widened, {reached:.3f}x the uncompressed weight bytes"
               f" (budget {cap}" + (f", max_error {max_error:g}" if max_error is not None else "") + f"; {basis} errors{measured})"
               + loss + over)
    return AutoPlan(schemes, notes, contributions, summary)
