"""The WhisperKit folder (rlx_mil.speech.packages) from tiny random Whisper checkpoints: the IO
contract field by field, the mel front end against a NumPy implementation of Whisper's log-mel,
the packages through the executor against the NumPy forward, fp16 against fp32, and the
CTranslate2 layout of the same weights giving identical outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlx_mil.models.families.whisper import TINY_WHISPER
from rlx_mil.models.random_checkpoint import write_random_checkpoint
from rlx_mil.models.whisper_checkpoint import open_whisper
from rlx_mil.models.whisper_mel import mel_filters
from rlx_mil.speech.packages import convert_whisper, folder_name
from rlx_mil.speech.runner import PackagedWhisper
from tests.speech import whisper_numpy as forward
from tests.speech.test_whisper_model import write_ct2_folder

pytestmark = pytest.mark.xdist_group("whisper-packages")

CACHE = 8
E, MELS, LAYERS, VOCAB = (TINY_WHISPER[k] for k in ("d_model", "num_mel_bins", "decoder_layers", "vocab_size"))
TOKENS = [90, 3, 17, 42, 7]


def whisper_log_mel(audio: np.ndarray, n_mels: int) -> np.ndarray:
    """openai/whisper's log_mel_spectrogram in NumPy: reflect-padded 400-point STFT (periodic
    Hann, hop 160) by rfft, last frame dropped, power, mel filters, log10 with the 1e-10 floor,
    the max - 8 clamp, (x + 4) / 4."""
    padded = np.pad(np.asarray(audio, np.float64), 200, mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)
    frames = np.lib.stride_tricks.sliding_window_view(padded, 400)[::160] * window  # [3001, 400]
    power = (np.abs(np.fft.rfft(frames, axis=1)) ** 2)[:-1].T
    mel = mel_filters(n_mels).astype(np.float64) @ power
    log = np.log10(np.maximum(mel, 1e-10))
    log = np.maximum(log, log.max() - 8.0)
    return (log + 4.0) / 4.0


def speechlike(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(480_000) / 16_000
    audio = 0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.02 * rng.standard_normal(t.size)
    audio[400_000:] = 0  # the zero padding of a short last window
    return audio.astype(np.float32)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("whisper_packages")
    hf = write_random_checkpoint(root / "whisper-tiny", TINY_WHISPER, seed=1)
    (hf / "tokenizer.json").write_text(json.dumps({"added_tokens": [{"id": 90, "content": "<|startoftranscript|>"}]}))
    ct2 = write_ct2_folder(root / "faster-whisper-tiny", hf, "float32")
    out = {"hf": hf}
    for key, source, precision in (("fp16", hf, "fp16"), ("fp32", hf, "fp32"), ("ct2_fp16", ct2, "fp16")):
        out[key] = convert_whisper(source, root / key, precision=precision, cache_len=CACHE, stateful=key == "fp16").folder
    return out


def contract(package: Path) -> dict[str, tuple[list[int], str]]:
    import coremltools as ct

    spec = ct.utils.load_spec(str(package))
    names = ct.proto.FeatureTypes_pb2.ArrayFeatureType.ArrayDataType.Name
    return {f.name: (list(f.type.multiArrayType.shape), names(f.type.multiArrayType.dataType))
            for f in [*spec.description.input, *spec.description.output]}


def test_the_folder_matches_whisperkits_contract_field_by_field(built: dict[str, Path]) -> None:
    folder = built["fp16"]
    assert folder.name == "openai_whisper-tiny"
    assert contract(folder / "MelSpectrogram.mlpackage") == {
        "audio": ([480000], "FLOAT16"), "melspectrogram_features": ([1, MELS, 1, 3000], "FLOAT16")}
    assert contract(folder / "AudioEncoder.mlpackage") == {
        "melspectrogram_features": ([1, MELS, 1, 3000], "FLOAT16"), "encoder_output_embeds": ([1, E, 1, 1500], "FLOAT16")}
    assert contract(folder / "TextDecoder.mlpackage") == {
        "input_ids": ([1], "INT32"), "cache_length": ([1], "INT32"),
        "key_cache": ([1, E * LAYERS, 1, CACHE], "FLOAT16"), "value_cache": ([1, E * LAYERS, 1, CACHE], "FLOAT16"),
        "kv_cache_update_mask": ([1, CACHE], "INT32"), "encoder_output_embeds": ([1, E, 1, 1500], "FLOAT16"),
        "decoder_key_padding_mask": ([1, CACHE], "FLOAT16"), "logits": ([1, 1, VOCAB], "FLOAT16"),
        "key_cache_updates": ([1, E * LAYERS, 1, 1], "FLOAT16"), "value_cache_updates": ([1, E * LAYERS, 1, 1], "FLOAT16"),
    }
    # fp32 packages keep float32 interfaces
    assert contract(built["fp32"] / "TextDecoder.mlpackage")["logits"] == ([1, 1, VOCAB], "FLOAT32")
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["d_model"], config["num_mel_bins"]) == ("whisper", E, MELS)
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["begin_suppress_tokens"] == [5, 89]
    assert json.loads((folder / "tokenizer.json").read_text())["added_tokens"][0]["id"] == 90


def test_folder_names() -> None:
    assert folder_name(Path("/x/whisper-base")) == "openai_whisper-base"
    assert folder_name(Path("/x/faster-whisper-large-v3")) == "openai_whisper-large-v3"
    assert folder_name(Path("/x/whisper-base-ct2")) == "openai_whisper-base"
    assert folder_name(Path("/x/my-finetune")) == "openai_whisper-my-finetune"


@pytest.mark.parametrize(("precision", "tolerance"), [("fp32", 1e-4), ("fp16", 0.03)])
def test_mel_package_is_whispers_log_mel(built: dict[str, Path], precision: str, tolerance: float) -> None:
    model = PackagedWhisper(built[precision])
    for audio in (speechlike(), np.zeros(480_000, np.float32)):
        want = whisper_log_mel(audio, MELS)
        got = model.log_mel(audio)
        assert got.shape == (MELS, 3000) and np.isfinite(got).all()
        assert np.abs(got - want).max() < tolerance
    assert np.all(model.log_mel(np.zeros(480_000, np.float32)) == -1.5)  # log10(1e-10) = -10 -> (-10 + 4) / 4


def test_packages_run_whisper_as_the_numpy_forward(built: dict[str, Path]) -> None:
    params = open_whisper(built["hf"]).params
    wide, narrow = PackagedWhisper(built["fp32"]), PackagedWhisper(built["fp16"])
    mel = wide.log_mel(speechlike())
    want = forward.encode(params, TINY_WHISPER, mel)
    encoded32, encoded16 = wide.encode(mel), narrow.encode(mel)
    assert np.abs(encoded32 - want).max() < 1e-4 * np.abs(want).max()
    cosine = float((encoded16 * encoded32).sum() / np.linalg.norm(encoded16) / np.linalg.norm(encoded32))
    assert cosine >= 0.999
    teacher = forward.decode(params, TINY_WHISPER, TOKENS, encoded32)
    logits32 = wide.decoder(encoded32).step(TOKENS)
    assert logits32.shape == (len(TOKENS), VOCAB)
    assert np.abs(logits32 - teacher).max() < 1e-4 * np.abs(teacher).max()
    session = narrow.decoder(encoded32)
    logits16 = np.concatenate([session.step(TOKENS[:2]), session.step(TOKENS[2:])])  # steps append to the cache
    assert np.abs(logits16 - teacher).max() < 0.02 * np.abs(teacher).max()
    assert (logits16.argmax(-1) == teacher.argmax(-1)).all()


def test_ct2_and_hf_layouts_give_identical_package_outputs(built: dict[str, Path]) -> None:
    hf, ct2 = PackagedWhisper(built["fp16"]), PackagedWhisper(built["ct2_fp16"])
    mel = hf.log_mel(speechlike(1))
    np.testing.assert_array_equal(ct2.log_mel(speechlike(1)), mel)
    encoded = hf.encode(mel)
    np.testing.assert_array_equal(ct2.encode(mel), encoded)
    np.testing.assert_array_equal(ct2.decoder(encoded).step(TOKENS), hf.decoder(encoded).step(TOKENS))


def test_stateful_decoder_matches_the_numpy_forward(built: dict[str, Path]) -> None:
    """The stateful form: cross-attention K/V computed once (`cross_attention`), the
    self-attention cache in Core ML state (`decode`), one multifunction package."""
    import coremltools as ct

    package = built["fp16"] / "TextDecoderStateful.mlpackage"
    spec = ct.utils.load_spec(str(package))
    functions = {f.name: f for f in spec.description.functions}
    assert set(functions) == {"cross_attention", "decode"} and spec.description.defaultFunctionName == "decode"
    assert [s.name for s in functions["decode"].state] == ["key_cache", "value_cache"]
    assert {i.name for i in functions["decode"].input} == {"input_ids", "position_ids", "cache_position", "cross_keys",
                                                           "cross_values"}
    params = open_whisper(built["hf"]).params
    encoded = np.random.default_rng(3).standard_normal((1500, E)).astype(np.float32)
    teacher = forward.decode(params, TINY_WHISPER, TOKENS, encoded)
    session = PackagedWhisper(built["fp16"], stateful=True).decoder(encoded)
    logits = np.concatenate([session.step(TOKENS[:3]), session.step(TOKENS[3:])])
    assert np.abs(logits - teacher).max() < 0.02 * np.abs(teacher).max()
    assert (logits.argmax(-1) == teacher.argmax(-1)).all()


@pytest.mark.parametrize("device", ["ane", "gpu"])
def test_the_three_packages_pass_preflight(built: dict[str, Path], device: str) -> None:
    """No package of the WhisperKit folder breaks a rule; the MelSpectrogram's `audio [480000]`,
    which WhisperKit's contract fixes, is only cut into 3000 rows of 160 samples and a few short
    slices (the frames Whisper's reflect padding reaches): the `interface-copy` note, no compute
    op reads it."""
    from rlx_mil.coreml.preflight import preflight

    for role in ("AudioEncoder", "TextDecoder"):
        assert [f.to_text() for f in preflight(built["fp16"] / f"{role}.mlpackage", device)] == []
    [mel] = preflight(built["fp16"] / "MelSpectrogram.mlpackage", device)
    assert (mel.rule, mel.severity, mel.var) == ("interface-copy", "note", "audio")
    assert mel.why.startswith("model input fp16[480000] only moved (reshape, slice_by_size): cut into pieces within")
    assert "a copy of 960,000 bytes per prediction" in mel.why


class FakeMLModel:
    """`coremltools.models.MLModel` as `rlx_mil.speech.runner.CoreMLProgram` uses it, run by the
    executor: the plumbing of the Core ML engine (feed dtypes, functions, state) on Linux."""

    fed: list[dict[str, np.dtype]] = []
    units: dict[str, object] = {}  # package -> the compute units it was loaded with
    real: Any = None  # coremltools' own, for the spec reads that load no model

    def __new__(cls, path: str, *args: Any, **options: Any) -> Any:
        if options.get("skip_model_load"):
            return cls.real(path, *args, **options)
        return super().__new__(cls)

    def __init__(self, path: str, compute_units: object = None, function_name: str | None = None) -> None:
        from rlx_mil.milexec.prepared import prepare

        self.path, self.function_name, self.program = path, function_name, prepare(Path(path))
        FakeMLModel.units[Path(path).stem] = compute_units

    def get_spec(self) -> object:
        import coremltools as ct

        return ct.utils.load_spec(self.path)

    def make_state(self) -> dict[str, np.ndarray]:
        return {}

    def predict(self, feeds: dict[str, np.ndarray], state: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        FakeMLModel.fed.append({k: v.dtype for k, v in feeds.items()})
        return self.program.run(feeds, function_name=self.function_name, states=state)


@pytest.mark.parametrize("stateful", [False, True])
def test_the_core_ml_engine_runs_what_the_executor_runs(built: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                        stateful: bool) -> None:
    import coremltools as ct

    from rlx_mil.speech import runner

    executor = PackagedWhisper(built["fp16"], stateful=stateful)
    monkeypatch.setattr(runner, "coreml_available", lambda: True)
    FakeMLModel.real = ct.models.MLModel
    monkeypatch.setattr(ct.models, "MLModel", FakeMLModel)
    FakeMLModel.fed, FakeMLModel.units = [], {}
    coreml = PackagedWhisper(built["fp16"], stateful=stateful, engine="auto")
    assert (executor.engine, coreml.engine) == ("milexec", "coreml")
    mel = coreml.log_mel(speechlike(2))
    assert np.array_equal(mel, executor.log_mel(speechlike(2)))
    encoded = coreml.encode(mel)
    assert np.array_equal(encoded, executor.encode(mel))
    session = coreml.decoder(encoded)
    logits = np.concatenate([session.step(TOKENS[:2]), session.step(TOKENS[2:])])
    assert np.array_equal(logits, executor.decoder(encoded).step(TOKENS))
    assert FakeMLModel.fed[0] == {"audio": np.float16}  # WhisperKit's fp16 interface, cast for Core ML
    if not stateful:
        assert FakeMLModel.fed[-1]["key_cache"] == np.float16 and FakeMLModel.fed[-1]["input_ids"] == np.int32
    # WhisperKit's compute units: the mel front end off the Neural Engine, the rest on it
    decoder = "TextDecoderStateful" if stateful else "TextDecoder"
    assert FakeMLModel.units == {"MelSpectrogram": ct.ComputeUnit.CPU_AND_GPU, "AudioEncoder": ct.ComputeUnit.CPU_AND_NE,
                                 decoder: ct.ComputeUnit.CPU_AND_NE}
    FakeMLModel.units = {}
    PackagedWhisper(built["fp16"], stateful=stateful, engine="coreml", compute_units="CPU_ONLY").log_mel(speechlike(2))
    assert set(FakeMLModel.units.values()) == {ct.ComputeUnit.CPU_ONLY}


def test_the_core_ml_engine_is_refused_where_core_ml_does_not_run(built: dict[str, Path]) -> None:
    from rlx_mil.errors import InvalidOptionError
    from rlx_mil.speech.runner import coreml_available

    if coreml_available():
        pytest.skip("Core ML runs here")
    with pytest.raises(InvalidOptionError, match="engine 'coreml' needs macOS"):
        PackagedWhisper(built["fp16"], engine="coreml")
    assert PackagedWhisper(built["fp16"], engine="auto").engine == "milexec"


def test_core_ml_runs_the_packages_as_the_executor_does(built: dict[str, Path]) -> None:
    from rlx_mil.speech.runner import coreml_available

    if not coreml_available():
        pytest.skip("Core ML's MLModel.predict runs only on macOS (coremltools' libcoremlpython)")
    executor, coreml = PackagedWhisper(built["fp16"], stateful=True), PackagedWhisper(built["fp16"], stateful=True,
                                                                                      engine="coreml")
    mel = executor.log_mel(speechlike(3))
    assert np.abs(coreml.log_mel(speechlike(3)) - mel).max() < 0.05
    encoded = executor.encode(mel)
    assert np.abs(coreml.encode(mel) - encoded).max() < 0.05 * np.abs(encoded).max()
    want = executor.decoder(encoded).step(TOKENS)
    for session in (coreml.decoder(encoded), PackagedWhisper(built["fp16"], engine="coreml").decoder(encoded)):
        got = session.step(TOKENS)
        assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
        assert (got.argmax(-1) == want.argmax(-1)).all()
