"""`rlx-mil transcribe` end to end on a tiny random Whisper converted to a WhisperKit folder (fp32,
WhisperKit's decoder and the stateful one), run through the executor, against the same
transcription over an independent NumPy forward of the checkpoint (tests/speech/whisper_numpy)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from safetensors.numpy import load_file, save_file

from rlx_mil.cli.main import main
from rlx_mil.models.families.whisper import TINY_WHISPER
from rlx_mil.models.random_checkpoint import write_random_checkpoint
from rlx_mil.models.whisper_checkpoint import open_whisper
from rlx_mil.speech.audio import read_audio
from rlx_mil.speech.decoding import DecodingOptions
from rlx_mil.speech.packages import convert_whisper
from rlx_mil.speech.tokens import load_tokens
from rlx_mil.speech.transcription import transcribe_audio
from tests.speech import whisper_numpy as forward
from tests.speech.fake_whisper import EOT, SOT, TS, VOCAB, write_speech_folder
from tests.speech.test_whisper_packages import whisper_log_mel

pytestmark = pytest.mark.xdist_group("whisper-packages")

CACHE = 32
#: The stateful text decoder (rlx_mil.speech.stateful) lands separately from the WhisperKit form.
HAS_STATEFUL = importlib.util.find_spec("rlx_mil.speech.stateful") is not None
CONFIG = {**TINY_WHISPER, "vocab_size": VOCAB, "decoder_start_token_id": SOT, "pad_token_id": EOT,
          "bos_token_id": EOT, "eos_token_id": EOT, "max_target_positions": 64, "begin_suppress_tokens": [220, EOT]}


class NumpyWhisper:
    """The checkpoint through the tests' NumPy forward and log-mel, as a `WhisperModel`."""

    def __init__(self, checkpoint: Path) -> None:
        self.params = open_whisper(checkpoint).params
        self.n_mels, self.vocab_size = CONFIG["num_mel_bins"], VOCAB
        self.n_text_ctx, self.cache_len = CONFIG["max_target_positions"], CACHE

    def log_mel(self, audio: np.ndarray) -> np.ndarray:
        return whisper_log_mel(audio, self.n_mels).astype(np.float32)

    def encode(self, mel: np.ndarray) -> np.ndarray:
        return forward.encode(self.params, CONFIG, mel).astype(np.float32)

    def decoder(self, encoded: np.ndarray) -> NumpySession:
        return NumpySession(self, encoded)


class NumpySession:
    def __init__(self, model: NumpyWhisper, encoded: np.ndarray) -> None:
        self.model, self.encoded, self.fed = model, encoded, []  # type: ignore[var-annotated]

    def step(self, tokens: list[int]) -> np.ndarray:
        self.fed.extend(tokens)
        logits = forward.decode(self.model.params, CONFIG, list(self.fed), self.encoded)
        return np.asarray(logits, np.float32)[-len(tokens):]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiny_whisper_transcribe")
    checkpoint = write_random_checkpoint(root / "whisper-tiny", CONFIG, seed=7)
    # Timestamp rows of the tied embedding at zero: their logits are exactly 0 on every path, so
    # the random model says text (logits of a few units) and its timestamp ties break alike.
    weights = load_file(checkpoint / "model.safetensors")
    weights["model.decoder.embed_tokens.weight"][TS:] = 0.0
    save_file(weights, checkpoint / "model.safetensors")
    write_speech_folder(root / "text")
    for name in ("tokenizer.json", "generation_config.json"):
        shutil.copy(root / "text" / name, checkpoint / name)
    packages = convert_whisper(checkpoint, root / "out", precision="fp32", cache_len=CACHE,
                               stateful=HAS_STATEFUL).folder
    return checkpoint, packages


def speech_wav(path: Path, seconds: float) -> Path:
    rng = np.random.default_rng(5)
    t = np.arange(round(seconds * 22050)) / 22050
    audio = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 2 * t)) + 0.01 * rng.standard_normal(t.size)
    sf.write(path, audio.astype(np.float32), 22050, subtype="PCM_16")
    return path


@pytest.mark.parametrize("stateful", [False, pytest.param(True, marks=pytest.mark.skipif(
    not HAS_STATEFUL, reason="rlx_mil.speech.stateful (the stateful text decoder) is not there yet"))],
    ids=["whisperkit", "stateful"])
def test_transcribe_through_packages_matches_the_numpy_forward(
    folder: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], stateful: bool,
) -> None:
    checkpoint, packages = folder
    wav = speech_wav(tmp_path / "speech.wav", 3.0)
    assert main(["transcribe", str(packages), str(wav), "--json", "-q", *(["--stateful"] if stateful else [])]) == 0
    got = json.loads(capsys.readouterr().out)
    want = transcribe_audio(NumpyWhisper(checkpoint), load_tokens(packages), read_audio(wav), DecodingOptions())
    assert got["language"] == want.language and got["text"] == want.text
    assert [s["tokens"] for s in got["segments"]] == [s.tokens for s in want.segments]
    assert len(want.text) > 3  # the random model says something


def test_timestamps_through_packages_match_the_numpy_forward(folder: tuple[Path, Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint, packages = folder
    wav = speech_wav(tmp_path / "speech.wav", 2.0)
    assert main(["transcribe", str(packages), str(wav), "--json", "-q", "--timestamps", "--language", "de"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = transcribe_audio(NumpyWhisper(checkpoint), load_tokens(packages), read_audio(wav),
                            DecodingOptions(language="de", timestamps=True))
    assert got["segments"] == [s.to_json() for s in want.segments] and got["language"] == "de"
    assert want.segments and any(t >= TS for s in want.segments for t in s.tokens)
