"""`--compress autoN` of a speech folder: one plan over the encoder's and decoder's weights.

The two packages ship together and are judged together (`rlx-mil eval FOLDER --audio`), so
their weights share one budget (a fraction of the folder's fp16 weight bytes) and the bytes go
where they are felt (`rlx_mil.compress.across`). Each package's sensitivities are measured in
its own unit, on the calibration audio (`rlx_mil.speech.calibration`), by the NumPy reference
with one weight at a time at its narrowest candidate:

* the encoder by its output: the squared relative error of `encoder_output_embeds` (1 - cosine
  is about half of it), target `FOLDER_COSINE`. Its effect on the decoder's KL is measurable too
  but says little: an encoder at cosine 0.98 moves the decoder's KL by 0.007 on real speech
  (docs/compression.md), so a KL-judged encoder would be starved below the cosine the folder's
  target asks for;
* the decoder by the mean KL of its next-token distributions teacher-forced over the
  calibration transcript, attending to the float encoder's output; target the user's
  `max_kl` / `min_top1` (as KL, `kl_for_top1`), else `FOLDER_KL`.

Both run over the calibration audio's frames only (at most `CALIBRATION_SECONDS`, the encoder's
positions cut to them), not the 30 s window. A sample of the weights is measured (`MEASURED`),
the others taking the mean of their kind (`rlx_mil.compress.auto.measured_weights`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rlx_mil.compress.across import PlanPart, plan_across
from rlx_mil.compress.auto import (
    CANDIDATES,
    layer_count,
    measured_weights,
    options_for,
    sensitivity,
)
from rlx_mil.compress.fit import fit_to_shape
from rlx_mil.compress.plan import WeightCompressor, encode, store_dtype
from rlx_mil.compress.quality import cosine, decoder_quality, kl_per_position
from rlx_mil.compress.schemes import AUTO_BUDGETS, CompressionConfig, Scheme
from rlx_mil.compress.sensitivity import KL_UNIT, SQUARED_UNIT, Replaced, kl_for_top1, measure_sample
from rlx_mil.ir import Graph
from rlx_mil.lowering.target import Precision, Target
from rlx_mil.models.whisper import (
    build_audio_encoder,
    build_cross_kv,
    build_stateful_decoder,
    parse_rows_name,
)
from rlx_mil.models.whisper_checkpoint import ParamsOf, WhisperCheckpoint
from rlx_mil.speech.calibration import TRANSCRIPT_TOKENS, SpeechCalibration
from rlx_mil.speech.model import DECODER, ENCODER, MEL, N_SAMPLES

#: The encoder's quality target: output cosine (against the float encoder on the calibration audio).
FOLDER_COSINE = 0.99
#: The decoder's quality target without the user's: mean KL (llama.cpp's Q4_K_M measures 0.031).
FOLDER_KL = 0.05
#: A speech folder's default budget per width where it differs from `AUTO_BUDGETS`: measured on
#: Whisper base, auto4's encoder needs about 0.40x and its decoder 0.30x to keep the folder's
#: targets on recorded speech; 0.325x of the weight bytes is 0.33x of the fp16 packages' bytes.
FOLDER_BUDGETS = {4: 0.325}
#: Weights measured per package at most (each one reference run of that package).
MEASURED = {"encoder": 14, "decoder": 24}
#: Mel frames per encoder position (the second convolution's stride).
_STRIDE = 2


def _float32(params: Mapping[str, Any], names: Any) -> dict[str, np.ndarray]:
    return {n: np.asarray(params[n], np.float32) for n in names}


class _Package:
    """One package's weights as the plan sees them: the ones autoN chooses for (`names`), their
    storage arrays, options and bytes, from the conversion's own `WeightCompressor`."""

    def __init__(self, config: CompressionConfig, graph: Graph, params: Mapping[str, Any], target: Target,
                 precision: Precision, candidates: tuple[str, ...]) -> None:
        bits = config.auto or 4
        planning = dataclasses.replace(config, auto=None, budget=None, max_error=None, plan=None)
        compressor = WeightCompressor(planning, graph, target, precision, params=params)
        self.names = list(compressor.auto_names)
        self.readers, self.roles, self.fixed, self.total = compressor.auto_weights(self.names)
        compressor.store.close()
        self.params, self.target, self.precision = params, target, precision
        store = store_dtype(precision)
        self.options = {n: options_for(self.readers[n](), bits, target, store, None, candidates) for n in self.names}
        #: bytes of `bits` bits per element: where the sensitivity is measured
        self.floor = {n: int(np.prod(np.shape(params[n]))) * bits // 8 for n in self.names}

    def value(self, name: str, scheme: Scheme) -> np.ndarray:
        """Weight `name` as `scheme` gives it back, float32 in its Param's shape."""
        storage = self.readers[name]()
        fitted, _ = fit_to_shape(scheme, tuple(int(d) for d in storage.shape), self.target)
        back = encode(storage, fitted, self.precision, name).dequantize()
        param = np.asarray(self.params[name])
        dense = storage.shape == param.shape and np.array_equal(storage, param)
        return np.asarray(back if dense else back.T, np.float32).reshape(param.shape)

    def part(self, name: str, measure: Callable[[str, Scheme], float], count: int, unit: str, target: float,
             describe: Callable[[float], str], default: bool) -> PlanPart:
        layers = layer_count(self.names)
        fallback = {n: sensitivity(n, self.roles.get(n, "weight"), layers) for n in self.names}
        sample = None if len(self.names) <= count else measure_sample(self.names, self.roles, count)
        # Measured at the width's first candidate (the cheapest of at least `bits` bits a weight),
        # not the narrowest: a 2-bit table moves the outputs so far that the loss is no longer
        # quadratic in the error, and its sensitivity would overstate what 4 or 8 bits cost.
        at_width = {n: opts[next((i for i, o in enumerate(opts) if o.bytes >= self.floor[n]), len(opts) - 1):]
                    for n, opts in self.options.items()}
        weights = measured_weights(at_width, fallback, measure, sample)
        return PlanPart(name, self.options, weights, unit, target, self.fixed, self.total, describe, default)


def _encoder_part(config: CompressionConfig, built: Mapping[str, tuple[Graph, Mapping[str, Any]]], spec: Any,
                  checkpoint: WhisperCheckpoint, mel: np.ndarray, target: Target, precision: Precision,
                  candidates: tuple[str, ...]) -> tuple[PlanPart, np.ndarray, Callable[[Mapping[str, Scheme]], np.ndarray]]:
    from rlx_mil.reference import evaluate
    graph, params = built[ENCODER]
    package = _Package(config, graph, params, target, precision, candidates)
    positions = mel.shape[-1] // _STRIDE
    short, names = build_audio_encoder(dataclasses.replace(spec, max_source_positions=positions), ENCODER)
    weights = _float32(checkpoint.params, names)
    table = "model.encoder.embed_positions.weight"
    weights[table] = weights[table][:positions]
    feeds = {"melspectrogram_features": mel[None, :, None, :].astype(np.float32)}
    want = np.asarray(evaluate(short, feeds, weights)["encoder_output_embeds"], np.float64)
    scale = max(float(np.sum(want * want)), 1e-30)

    def measure(name: str, scheme: Scheme) -> float:
        value = package.value(name, scheme)
        got = evaluate(short, feeds, Replaced(weights, name, value[:positions] if name == table else value))
        return float(np.sum((np.asarray(got["encoder_output_embeds"], np.float64) - want) ** 2)) / scale

    def mixed(schemes: Mapping[str, Scheme]) -> np.ndarray:
        """The encoder's output with every planned weight as `schemes` give them back."""
        values = dict(weights)
        for name in package.names:
            value = package.value(name, schemes[name])
            values[name] = value[:positions] if name == table else value
        return np.asarray(evaluate(short, feeds, values)["encoder_output_embeds"], np.float32)

    part = package.part(ENCODER, measure, MEASURED["encoder"], SQUARED_UNIT, 2 * (1 - FOLDER_COSINE),
                        lambda loss: f"cosine {1 - loss / 2:.4f}", default=True)
    return part, want.astype(np.float32), mixed


def _transcript(checkpoint: WhisperCheckpoint, calibration: SpeechCalibration,
                greedy: Callable[[list[int], int], list[int]]) -> tuple[list[int], int]:
    """(prompt + transcript ids, the prompt's length): the float model's greedy transcript of
    the speech (the user's or the built-in clip), else (the generated signal) the built-in
    calibration text; a checkpoint folder without a tokenizer gives generated ids after the
    start token."""
    from rlx_mil.compress.builtin_text import builtin_text
    from rlx_mil.errors import RlxMilError
    from rlx_mil.speech.tokens import load_tokens

    spec = checkpoint.spec
    try:
        tokens = load_tokens(checkpoint.directory)
        prompt = tokens.prompt("en" if tokens.multilingual else None, "transcribe", False)
    except RlxMilError:
        ids = np.random.default_rng(0).integers(0, min(spec.eos_token_id, spec.vocab_size), TRANSCRIPT_TOKENS)
        return [spec.decoder_start_token_id, *map(int, ids)], 1
    if calibration.spoken:
        return prompt + greedy(prompt, tokens.eot), len(prompt)
    text = tokens.tokenizer.encode(" " + " ".join(builtin_text("calibration").split())).ids
    return prompt + [int(t) for t in text[:TRANSCRIPT_TOKENS]], len(prompt)


def _decoder_part(config: CompressionConfig, built: Mapping[str, tuple[Graph, Mapping[str, Any]]], spec: Any,
                  checkpoint: WhisperCheckpoint, encoded: np.ndarray, calibration: SpeechCalibration, target: Target,
                  precision: Precision, candidates: tuple[str, ...]) -> tuple[PlanPart, Callable[..., Any]]:
    from rlx_mil.reference import evaluate
    graph, params = built[DECODER]
    package = _Package(config, graph, params, target, precision, candidates)
    short = dataclasses.replace(spec, max_source_positions=encoded.shape[-1])
    cross_graph, cross_names = build_cross_kv(short)
    decoder_names = list(build_stateful_decoder(short, 1, past=0)[1])
    weights = _float32(checkpoint.params, {*cross_names, *decoder_names})
    states = {"encoder_output_embeds": encoded}
    cross = evaluate(cross_graph, states, ParamsOf(weights, cross_names))

    steps: dict[tuple[int, int], Graph] = {}

    def run(ids: list[int], params: Mapping[str, Any], held: Mapping[str, np.ndarray], past: int = 0,
            cache: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        step = steps.get((len(ids), past))
        if step is None:
            step = steps[(len(ids), past)] = build_stateful_decoder(short, len(ids), past=past)[0]
        feeds = {"input_ids": np.asarray([ids], np.int32),
                 "position_ids": np.arange(past, past + len(ids), dtype=np.int32)[None],
                 "cross_keys": held["cross_keys"], "cross_values": held["cross_values"], **(cache or {})}
        return evaluate(step, feeds, ParamsOf(params, decoder_names))

    def greedy(prompt: list[int], eot: int) -> list[int]:
        out = run(prompt, weights, cross)
        said: list[int] = []
        while len(said) < TRANSCRIPT_TOKENS:
            token = int(np.argmax(np.asarray(out["logits"])[0, -1, :eot + 1]))
            if token == eot:
                break
            said.append(token)
            cache = {f"past_{kind}_{i}": out[f"new_{kind}_{i}"] for i in range(spec.decoder_layers) for kind in "kv"}
            out = run([token], weights, cross, len(prompt) + len(said) - 1, cache)
        return said

    ids, first = _transcript(checkpoint, calibration, greedy)
    want = np.asarray(run(ids, weights, cross)["logits"], np.float64)[0, first - 1:-1]

    def measure(name: str, scheme: Scheme) -> float:
        value = package.value(name, scheme)
        rows = parse_rows_name(name)
        if rows is not None:  # a piece of the tied embedding / head: its rows of the whole table
            tensor, start, stop = rows
            whole = weights[tensor].copy()
            whole[start:stop] = value
            replaced: Mapping[str, Any] = Replaced(weights, tensor, whole)
        else:
            replaced = Replaced(weights, name, value)
        held = evaluate(cross_graph, states, ParamsOf(replaced, cross_names)) if name in cross_names else cross
        got = np.asarray(run(ids, replaced, held)["logits"], np.float64)[0, first - 1:-1]
        return float(np.mean(kl_per_position(want, got)))

    def mixed(schemes: Mapping[str, Scheme], encoded_mix: np.ndarray) -> Any:
        """The decoder with every planned weight as `schemes` give them back, attending to
        `encoded_mix`, judged against the float decoder on the float encoder's output."""
        values = dict(weights)
        for name in package.names:
            value = package.value(name, schemes[name])
            rows = parse_rows_name(name)
            if rows is None:
                values[name] = value
                continue
            if values[rows[0]] is weights[rows[0]]:
                values[rows[0]] = weights[rows[0]].copy()
            values[rows[0]][rows[1]:rows[2]] = value
        held = evaluate(cross_graph, {"encoder_output_embeds": encoded_mix}, ParamsOf(values, cross_names))
        got = np.asarray(run(ids, values, held)["logits"], np.float64)[0, first - 1:-1]
        return decoder_quality(want, got, ids[first:])

    bounds = [b for b in (config.max_kl, None if config.min_top1 is None else kl_for_top1(config.min_top1)) if b is not None]
    return package.part(DECODER, measure, MEASURED["decoder"], KL_UNIT, min(bounds) if bounds else FOLDER_KL,
                        lambda loss: f"mean KL {loss:.3g}", default=not bounds), mixed


def folder_budget(config: CompressionConfig) -> float:
    """The folder's budget: the user's, else none with a quality target (the search stops at
    it), else `FOLDER_BUDGETS` / `AUTO_BUDGETS` for the width."""
    if config.budget is not None:
        return float(config.budget)
    if config.max_kl is not None or config.min_top1 is not None:
        return 1.0
    bits = config.auto or 4
    return FOLDER_BUDGETS.get(bits, AUTO_BUDGETS[bits])


def plan_folder(config: CompressionConfig, checkpoint: WhisperCheckpoint,
                built: Mapping[str, tuple[Graph, Mapping[str, Any]]], calibration: SpeechCalibration, *,
                target: str, precision: str) -> CompressionConfig:
    """`config` (autoN) with one plan over the folder's encoder and decoder (see the module
    doc), which both packages' conversions (and a stateful decoder's) take their schemes from."""
    from rlx_mil.reference import evaluate
    bits = config.auto or 4
    tgt, prec = Target.parse(target), Precision.parse(precision)
    # No candidate narrower than the width (`NARROWER`): measured on Whisper base, the decoder's
    # cross-attention looked free on the calibration and took 2-3 bits, which cost mean KL 0.75
    # on recordings of speech (docs/compression.md).
    candidates = CANDIDATES[bits] if config.candidates is None else tuple(config.candidates)
    spec = checkpoint.spec
    samples = np.zeros(N_SAMPLES, np.float32)
    samples[:len(calibration.samples)] = calibration.samples[:N_SAMPLES]
    mel_graph, mel_params = built[MEL]
    mel = np.asarray(evaluate(mel_graph, {"audio": samples}, mel_params)["melspectrogram_features"], np.float32)
    positions = max(1, min(spec.n_audio_ctx, -(-len(calibration.samples) // 320)))
    mel = mel.reshape(spec.num_mel_bins, -1)[:, :_STRIDE * positions]
    encoder, encoded, encoder_mix = _encoder_part(config, built, spec, checkpoint, mel, tgt, prec, candidates)
    decoder, decoder_mix = _decoder_part(config, built, spec, checkpoint, encoded, calibration, tgt, prec, candidates)
    search = config.max_kl is not None or config.min_top1 is not None
    plan = plan_across(bits, [encoder, decoder], folder_budget(config), search)
    # The mix as planned, measured on the calibration (both packages together, the decoder on
    # the mixed encoder's output): what the predictions became.
    got = encoder_mix(plan.schemes)
    judged = decoder_mix(plan.schemes, got)
    plan.summary += (f"; measured on {calibration.label}; the mix on it: encoder cosine {cosine(encoded, got):.4f},"
                     f" decoder {judged.summary()}")
    # The stateful decoder reads the tied table whole: it takes the widest of its pieces' schemes.
    for name in list(plan.schemes):
        rows = parse_rows_name(name)
        if rows is not None:
            widest = max((n for n in plan.schemes if (parse_rows_name(n) or ("",))[0] == rows[0]),
                         key=lambda n: getattr(plan.schemes[n], "bits", 8))
            plan.schemes.setdefault(rows[0], plan.schemes[widest])
            plan.notes.setdefault(rows[0], f"{plan.notes[widest]}; the whole table: the widest of its pieces")
    return dataclasses.replace(config, plan=plan)
