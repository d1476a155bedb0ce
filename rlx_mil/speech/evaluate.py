"""Quality of a speech package folder against the checkpoint it came from (`rlx-mil eval FOLDER
--audio FILES --reference CHECKPOINT`).

The reference is the uncompressed checkpoint run by the NumPy reference interpreter in float32
(`ReferenceWhisper`: the same three graphs the conversion lowers, evaluated on the checkpoint's
own weights). For each audio file, its first 30 s window goes through both models end to end:

* the package's log-mel front end, encoder and text decoder (the executor), against the
  reference's; the encoder outputs are compared by cosine and PSNR (`compress.quality`);
* the reference decodes the window greedily (Whisper's rules, `speech.decoding`); both
  decoders are then teacher-forced over that transcript (the prompt, the sampled tokens and the
  end of text), each attending to its own encoder's output, and every position that predicts a
  transcript token is judged as a decoder is at conversion: top-1 agreement, top-1 where the
  reference's top-2 gap is at least 0.5 logit, mean KL(reference || package) and the perplexity
  ratio on the transcript's tokens.

The positions of all files are judged together, the encoder outputs too (one cosine over all
of them); the per-file numbers are in the JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.compress.quality import (
    DEFAULT_THRESHOLDS,
    OutputQuality,
    QualityThresholds,
    decoder_quality,
    output_quality,
)
from rlx_mil.compress.quality_check import QualityCheck
from rlx_mil.errors import InvalidOptionError
from rlx_mil.models.whisper_checkpoint import ParamsOf
from rlx_mil.speech.audio import Audio
from rlx_mil.speech.model import ENCODER, MEL, N_AUDIO_CTX, N_FRAMES, N_SAMPLES
from rlx_mil.units import counted

#: What the reference is, as the report says it.
REFERENCE_LABEL = "the checkpoint (NumPy reference, float32)"
#: The reference's graph of the decoder's cross-attention keys and values.
CROSS = "cross_attention"
#: Token ids a folder without a tokenizer is teacher-forced over (`judge_folder`).
GENERATED_TOKENS = 48


class ReferenceWhisper:
    """A Whisper checkpoint (Hugging Face or CTranslate2 folder) as a `WhisperModel`: the
    checkpoint's graphs evaluated by the NumPy reference interpreter in float32, each weight read
    and widened to float32 once. The front end and encoder are WhisperKit's graphs; the decoder
    is the stateful form's (`build_cross_kv` once per utterance, then `build_stateful_decoder`
    over the tokens of each call with the cache so far as its past), so a call of many tokens
    (a prompt, a teacher-forced transcript) is one evaluation."""

    def __init__(self, checkpoint_dir: str | os.PathLike[str], cache_len: int | None = None) -> None:
        from rlx_mil.models.whisper import build_cross_kv
        from rlx_mil.models.whisper_checkpoint import open_whisper
        from rlx_mil.speech.graphs import graphs

        checkpoint = open_whisper(checkpoint_dir)
        self.spec = spec = checkpoint.spec
        self.n_mels, self.vocab_size, self.n_text_ctx = spec.num_mel_bins, spec.vocab_size, spec.max_target_positions
        self.d_model = spec.d_model
        self.cache_len = int(cache_len if cache_len is not None else spec.max_target_positions)
        built = graphs(checkpoint, 1, fp16_io=False)
        self._graphs = {role: built[role][0] for role in (MEL, ENCODER)}
        self._params = {role: _float32(built[role][1]) for role in (MEL, ENCODER)}
        cross, cross_names = build_cross_kv(spec)
        self._graphs[CROSS] = cross
        self._params[CROSS] = _float32(ParamsOf(checkpoint.params, cross_names))
        self._decoder_params = _float32(ParamsOf(checkpoint.params, _decoder_names(spec)))
        self._decoders: dict[tuple[int, int], Any] = {}

    def log_mel(self, audio: np.ndarray) -> np.ndarray:
        out = self._run(MEL, {"audio": np.asarray(audio, np.float32).reshape(N_SAMPLES)})
        return np.asarray(out["melspectrogram_features"], np.float32).reshape(self.n_mels, N_FRAMES)

    def encode(self, mel: np.ndarray) -> np.ndarray:
        features = np.asarray(mel, np.float32).reshape(1, self.n_mels, 1, N_FRAMES)
        out = self._run(ENCODER, {"melspectrogram_features": features})
        return np.asarray(out["encoder_output_embeds"], np.float32).reshape(self.d_model, N_AUDIO_CTX).T.copy()

    def decoder(self, encoded: np.ndarray) -> ReferenceSession:
        return ReferenceSession(self, encoded)

    def _run(self, role: str, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        from rlx_mil.reference import evaluate

        return evaluate(self._graphs[role], feeds, self._params[role])

    def _decode(self, feeds: Mapping[str, np.ndarray], tokens: int, past: int) -> dict[str, np.ndarray]:
        from rlx_mil.models.whisper import build_stateful_decoder
        from rlx_mil.reference import evaluate

        graph = self._decoders.get((tokens, past))
        if graph is None:
            graph = self._decoders[(tokens, past)] = build_stateful_decoder(self.spec, tokens, past=past)[0]
        return evaluate(graph, feeds, self._decoder_params)


def _decoder_names(spec: Any) -> list[str]:
    from rlx_mil.models.whisper import build_stateful_decoder

    return list(build_stateful_decoder(spec, 1, past=0)[1])


class ReferenceSession:
    """One utterance through the reference decoder: the cross-attention keys and values once,
    then each call's tokens in one evaluation against the self-attention cache held here."""

    def __init__(self, model: ReferenceWhisper, encoded: np.ndarray) -> None:
        self.model = model
        states = np.ascontiguousarray(np.asarray(encoded, np.float32).T.reshape(1, model.d_model, 1, N_AUDIO_CTX))
        cross = model._run(CROSS, {"encoder_output_embeds": states})
        self.cross = {"cross_keys": cross["cross_keys"], "cross_values": cross["cross_values"]}
        self.past: dict[str, np.ndarray] = {}
        self.position = 0

    def step(self, tokens: Sequence[int]) -> np.ndarray:
        count = len(tokens)
        if not count:
            return np.zeros((0, self.model.vocab_size), np.float32)
        if self.position + count > self.model.cache_len:
            raise InvalidOptionError(f"the reference decoder holds {self.model.cache_len} tokens; this utterance needs more")
        positions = np.arange(self.position, self.position + count, dtype=np.int32)[None]
        feeds = {"input_ids": np.asarray([list(tokens)], np.int32), "position_ids": positions, **self.cross, **self.past}
        out = self.model._decode(feeds, count, self.position)
        for i in range(self.model.spec.decoder_layers):
            for kind in ("k", "v"):
                self.past[f"past_{kind}_{i}"] = out[f"new_{kind}_{i}"]
        self.position += count
        return np.asarray(out["logits"], np.float32).reshape(count, -1)


class _Recording:
    """A decoder session that keeps every row of logits it returns (the reference's greedy
    pass: its rows are the teacher-forced reference logits, computed once)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.rows: list[np.ndarray] = []

    def step(self, tokens: Sequence[int]) -> np.ndarray:
        out = np.asarray(self.session.step(tokens), np.float32)
        self.rows.extend(out)
        return out


class _RecordingModel:
    def __init__(self, model: ReferenceWhisper) -> None:
        self.model = model
        self.n_mels, self.vocab_size, self.n_text_ctx = model.n_mels, model.vocab_size, model.n_text_ctx
        self.cache_len = model.cache_len
        self.session: _Recording | None = None

    def log_mel(self, audio: np.ndarray) -> np.ndarray:
        return self.model.log_mel(audio)

    def encode(self, mel: np.ndarray) -> np.ndarray:
        return self.model.encode(mel)

    def decoder(self, encoded: np.ndarray) -> _Recording:
        self.session = _Recording(self.model.decoder(encoded))
        return self.session


@dataclass
class SpeechEvalFile:
    """One audio file's window: its reference transcript and the numbers on it alone."""

    audio: str
    transcript: str
    positions: int
    encoder: dict[str, Any]
    decoder: dict[str, Any]


@dataclass
class SpeechEvalResult:
    """What `evaluate_speech` measured: the check over all files, and each file's numbers."""

    check: QualityCheck
    files: list[SpeechEvalFile] = field(default_factory=list)
    #: The folder's stateful text decoder judged the same way (on the package's encoder output),
    #: when it was asked for (`judge_folder(stateful=True)`).
    stateful: QualityCheck | None = None

    @property
    def checks(self) -> list[QualityCheck]:
        return [self.check] + ([self.stateful] if self.stateful is not None else [])

    def to_text(self) -> str:
        lines = [f"{f.audio}: {counted(f.positions, 'position')} of the reference's greedy transcript {f.transcript!r}"
                 for f in self.files]
        lines += [c.summary() for c in self.checks]
        return "\n".join(lines)

    def to_json(self) -> str:
        body = {"quality": self.check.to_dict(), "files": [vars(f) for f in self.files]}
        if self.stateful is not None:
            body["stateful_quality"] = self.stateful.to_dict()
        return json.dumps(body, indent=2)


def _float32(params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {name: np.asarray(params[name], np.float32) for name in params}


def evaluate_speech(
    folder: str | os.PathLike[str],
    audio: Sequence[str | os.PathLike[str]],
    reference: str | os.PathLike[str],
    *,
    language: str | None = None,
    max_tokens: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> SpeechEvalResult:
    """`rlx-mil eval FOLDER --audio FILES --reference CHECKPOINT` from Python (see the module
    doc). `language` None: the reference detects it (multilingual checkpoints); `max_tokens`
    bounds each greedy transcript; `progress(what)` hears each stage."""
    from rlx_mil.speech.audio import as_audio

    if not audio:
        raise InvalidOptionError("eval of a speech folder needs at least one audio file (--audio FILE ...)")
    root = _checked_folder(folder, reference)
    clips = [as_audio(path) for path in audio]  # every file read (and refused) before any model runs
    return judge_folder(root, clips, reference, language=language, max_tokens=max_tokens, progress=progress)


def _checked_folder(folder: str | os.PathLike[str], reference: str | os.PathLike[str]) -> Path:
    from rlx_mil.speech.transcription import check_speech_folder

    root = check_speech_folder(folder)
    if not Path(reference).is_dir():
        raise InvalidOptionError(f"--reference {reference}: not a folder (the Whisper checkpoint the package came from:"
                                 " a Hugging Face or CTranslate2 folder)")
    return root


def judge_folder(
    folder: str | os.PathLike[str],
    clips: Sequence[Audio],
    reference: str | os.PathLike[str],
    *,
    language: str | None = None,
    max_tokens: int | None = None,
    progress: Callable[[str], None] | None = None,
    inputs: str | None = None,
    thresholds: QualityThresholds = DEFAULT_THRESHOLDS,
    worst: Sequence[tuple[str, str]] = (),
    stateful: bool = False,
) -> SpeechEvalResult:
    """The speech folder `folder` against the checkpoint `reference` on `clips` (see the module
    doc): what `evaluate_speech` and the conversion's quality check
    (`rlx_mil.speech.quality_check`) measure. `inputs` names the clips in the check's summary;
    `thresholds` and `worst` (the weights contributing most) go into the check. A folder
    without a tokenizer is teacher-forced over generated token ids after the start token (no
    perplexity: they are not language). `stateful`: the folder's stateful text decoder is
    judged too, over the same transcripts (`SpeechEvalResult.stateful`)."""
    from rlx_mil.errors import RlxMilError
    from rlx_mil.speech.audio import window
    from rlx_mil.speech.decoding import DecodingOptions, decode_window
    from rlx_mil.speech.tokens import load_tokens
    from rlx_mil.speech.transcription import open_model

    root = _checked_folder(folder, reference)
    ref_dir = Path(reference)
    try:
        tokens = load_tokens(root)
    except RlxMilError:
        if inputs is None:  # `rlx-mil eval`: a speech folder holds its tokenizer
            raise
        tokens = None
    options = DecodingOptions(language=language, max_tokens=max_tokens)
    if tokens is not None:
        options.check(tokens)
    say = progress or (lambda _: None)
    say(f"opening {root}")
    package = open_model(root)
    stateful_model = open_model(root, stateful=True) if stateful else None
    stateful_rows: list[np.ndarray] = []
    say(f"reading the reference {ref_dir}")
    ref = ReferenceWhisper(ref_dir, cache_len=getattr(package, "cache_len", None))
    if ref.vocab_size != package.vocab_size or ref.n_mels != package.n_mels:
        raise InvalidOptionError(f"--reference {ref_dir}: vocabulary {ref.vocab_size} / {ref.n_mels} mels, the package's"
                                 f" {package.vocab_size} / {package.n_mels}: not the checkpoint it came from")
    recorder = _RecordingModel(ref)
    want_rows: list[np.ndarray] = []
    got_rows: list[np.ndarray] = []
    targets: list[int] = []
    want_enc: list[np.ndarray] = []
    got_enc: list[np.ndarray] = []
    files = []
    for clip in clips:
        samples = window(clip, 0)
        say(f"{clip.name}: the reference's front end and encoder")
        ref_encoded = ref.encode(ref.log_mel(samples))
        say(f"{clip.name}: the package's front end and encoder")
        encoded = package.encode(package.log_mel(samples))
        if tokens is None:
            fed, wanted, first, text = _generated_ids(ref, max_tokens)
            ref_rows = np.asarray(ref.decoder(ref_encoded).step(fed), np.float32)[first:]
        else:
            say(f"{clip.name}: the reference's greedy transcript")
            decoded = decode_window(recorder, ref_encoded, tokens, options)
            assert recorder.session is not None
            fed = decoded.prompt + decoded.tokens
            wanted = decoded.tokens + ([tokens.eot] if decoded.ended else [])
            rows = np.stack(recorder.session.rows)
            if not decoded.ended:  # the last sampled token was never fed: its row is not there
                fed = fed[:-1]
            first = len(decoded.prompt) - 1  # the row after the prompt predicts the first sampled token
            ref_rows = rows[first:len(fed)]
            text = tokens.text(decoded.tokens)
        say(f"{clip.name}: the package's decoder over {counted(len(wanted), 'token')}")
        pkg_rows = np.asarray(package.decoder(encoded).step(fed), np.float32)[first:, :ref.vocab_size]
        ref_rows = ref_rows[:, :ref.vocab_size]
        if stateful_model is not None:
            say(f"{clip.name}: the package's stateful decoder over {counted(len(wanted), 'token')}")
            stateful_rows.append(np.asarray(stateful_model.decoder(encoded).step(fed), np.float32)[first:, :ref.vocab_size])
        scored = wanted if tokens is not None else None
        file_decoder = decoder_quality(ref_rows, pkg_rows, scored)
        file_encoder = output_quality("encoder_output", ref_encoded, encoded)
        files.append(SpeechEvalFile(clip.name, text, len(wanted), file_encoder.to_dict(), file_decoder.to_dict()))
        want_rows.append(ref_rows)
        got_rows.append(pkg_rows)
        targets += wanted
        want_enc.append(ref_encoded)
        got_enc.append(encoded)
    encoder: OutputQuality = output_quality("encoder_output", np.concatenate(want_enc), np.concatenate(got_enc))
    transcripts = "the reference's greedy transcripts" if tokens is not None else "generated token ids (no tokenizer)"
    label = ((inputs or f"{counted(len(clips), 'audio file')}, the first 30 s of each")
             + f"; {counted(len(targets), 'position')} of {transcripts}, each model on its own encoder output")
    scored_targets = targets if tokens is not None else None
    want_all = np.concatenate(want_rows)
    check = QualityCheck(compared_with=REFERENCE_LABEL, inputs=label,
                         decoder=decoder_quality(want_all, np.concatenate(got_rows), scored_targets),
                         outputs=[encoder], worst=list(worst), thresholds=thresholds)
    second = None
    if stateful_model is not None:
        second = QualityCheck(compared_with=REFERENCE_LABEL, inputs=f"{label}; the stateful text decoder",
                              decoder=decoder_quality(want_all, np.concatenate(stateful_rows), scored_targets),
                              worst=list(worst), thresholds=thresholds)
    return SpeechEvalResult(check, files, second)


def _generated_ids(ref: ReferenceWhisper, max_tokens: int | None) -> tuple[list[int], list[int], int, str]:
    """(fed ids, the ids each judged position predicts, the first judged row, a label): the
    start token and `GENERATED_TOKENS` ids drawn below the end-of-text id, for a folder
    without a tokenizer."""
    spec = ref.spec
    count = min(GENERATED_TOKENS if max_tokens is None else max_tokens, ref.cache_len - 1)
    ids = np.random.default_rng(0).integers(0, min(spec.eos_token_id, spec.vocab_size), count + 1)
    fed = [int(spec.decoder_start_token_id), *map(int, ids[:-1])]
    return fed, [int(i) for i in ids], 0, "(generated token ids)"


def speech_folder_in(path: str | os.PathLike[str]) -> Path:
    """The WhisperKit folder at `path`, or the one folder inside it that holds the packages
    (`convert-hf WHISPER -o OUT_DIR` writes `OUT_DIR/openai_whisper-<variant>/`)."""
    root = Path(path)
    if (root / f"{ENCODER}.mlpackage").is_dir() or not root.is_dir():
        return root
    inside = [p for p in sorted(root.iterdir()) if (p / f"{ENCODER}.mlpackage").is_dir()]
    if len(inside) == 1:
        return inside[0]
    if inside:
        raise InvalidOptionError(f"{root} holds {len(inside)} speech package folders ({', '.join(p.name for p in inside)});"
                                 " name one")
    return root
