"""Whisper graphs (rlx_mil.models.whisper) against an independent NumPy forward, from tiny random
checkpoints in the Hugging Face layout (F32, BF16, sharded) and the CTranslate2 layout (float32,
float16, int8) written by the tests."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlx_mil import reference
from rlx_mil.errors import CheckpointError, InvalidOptionError, UnsupportedConfigError, WeightsFormatError
from rlx_mil.models.ct2_file import CT2File, write_ct2
from rlx_mil.models.families import model_spec
from rlx_mil.models.families.whisper import TINY_WHISPER
from rlx_mil.models.random_checkpoint import write_random_checkpoint
from rlx_mil.models.whisper import MASKED, build_audio_encoder, build_text_decoder, sinusoids
from rlx_mil.models.whisper_checkpoint import ParamsOf, ct2_variables_of, open_whisper
from tests.speech import whisper_numpy as forward

E, MELS, LAYERS = TINY_WHISPER["d_model"], TINY_WHISPER["num_mel_bins"], TINY_WHISPER["decoder_layers"]
TOKENS = [90, 3, 17, 42, 7]
CACHE = 8


def write_ct2_folder(folder: Path, hf_folder: Path, dtype: str) -> Path:
    """The CTranslate2 folder of the same weights as the Hugging Face folder `hf_folder`."""
    source = open_whisper(hf_folder)
    folder.mkdir(parents=True)
    write_ct2(folder / "model.bin", "WhisperSpec", 3, ct2_variables_of(source.params, source.spec, dtype),
              {"decoder/projection/weight": "decoder/embeddings/weight"})
    config = {"suppress_ids": list(source.spec.suppress_tokens), "suppress_ids_begin": [5, 89],
              "lang_ids": [], "alignment_heads": [[1, 0], [1, 1]]}
    (folder / "config.json").write_text(json.dumps(config))
    tokens = [{"id": 89, "content": "<|endoftext|>"}, {"id": 90, "content": "<|startoftranscript|>"}]
    (folder / "tokenizer.json").write_text(json.dumps({"added_tokens": tokens}))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("whisper")
    hf = write_random_checkpoint(root / "hf", TINY_WHISPER, seed=1)
    return {
        "hf": hf,
        "bf16": write_random_checkpoint(root / "bf16", TINY_WHISPER, seed=1, dtype="bfloat16", shards=3),
        "ct2": write_ct2_folder(root / "ct2", hf, "float32"),
        "ct2_f16": write_ct2_folder(root / "ct2_f16", hf, "float16"),
        "ct2_int8": write_ct2_folder(root / "ct2_int8", hf, "int8"),
    }


def mel_input(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((MELS, 3000)).astype(np.float32)


def run_encoder(folder: Path, mel: np.ndarray) -> np.ndarray:
    checkpoint = open_whisper(folder)
    graph, names = build_audio_encoder(checkpoint.spec)
    out = reference.evaluate(graph, {"melspectrogram_features": mel.reshape(1, MELS, 1, 3000)},
                             ParamsOf(checkpoint.params, names))
    assert out["encoder_output_embeds"].shape == (1, E, 1, 1500)
    return out["encoder_output_embeds"].reshape(E, 1500).T


def run_decoder(folder: Path, tokens: list[int], encoded: np.ndarray) -> np.ndarray:
    """WhisperKit's loop: one token per call, the caller writing each step's K/V into its caches."""
    checkpoint = open_whisper(folder)
    graph, names = build_text_decoder(checkpoint.spec, CACHE)
    params = ParamsOf(checkpoint.params, names)
    keys = np.zeros((1, E * LAYERS, 1, CACHE), np.float32)
    values = keys.copy()
    rows = []
    for i, token in enumerate(tokens):
        update = np.zeros((1, CACHE), np.int32)
        update[0, i] = 1
        padding = np.full((1, CACHE), MASKED, np.float32)
        padding[0, : i + 1] = 0
        feeds = {"input_ids": np.array([token], np.int32), "cache_length": np.array([i], np.int32), "key_cache": keys,
                 "value_cache": values, "kv_cache_update_mask": update,
                 "encoder_output_embeds": encoded.T.reshape(1, E, 1, 1500), "decoder_key_padding_mask": padding}
        out = reference.evaluate(graph, feeds, params)
        assert out["logits"].shape == (1, 1, TINY_WHISPER["vocab_size"])
        assert out["key_cache_updates"].shape == (1, E * LAYERS, 1, 1)
        keys[..., i] = out["key_cache_updates"][..., 0]
        values[..., i] = out["value_cache_updates"][..., 0]
        rows.append(out["logits"].reshape(-1))
    return np.stack(rows)


@pytest.fixture(scope="module")
def hf_outputs(folders: dict[str, Path]) -> tuple[np.ndarray, np.ndarray]:
    encoded = run_encoder(folders["hf"], mel_input())
    return encoded, run_decoder(folders["hf"], TOKENS, encoded)


def test_encoder_and_decoder_match_the_numpy_forward(folders: dict[str, Path], hf_outputs: tuple[np.ndarray, np.ndarray]) -> None:
    params = open_whisper(folders["hf"]).params
    want = forward.encode(params, TINY_WHISPER, mel_input())
    encoded, logits = hf_outputs
    assert np.abs(encoded - want).max() < 1e-4 * max(1.0, np.abs(want).max())
    teacher_forced = forward.decode(params, TINY_WHISPER, TOKENS, encoded)
    assert np.abs(logits - teacher_forced).max() < 1e-4 * max(1.0, np.abs(teacher_forced).max())
    # the cache matters: a decoder that ignored it would differ from step 1 on
    assert np.abs(teacher_forced[1] - forward.decode(params, TINY_WHISPER, [TOKENS[1]], encoded)[0]).max() > 1e-3


def test_ct2_layout_of_the_same_weights_gives_identical_outputs(folders: dict[str, Path],
                                                                hf_outputs: tuple[np.ndarray, np.ndarray]) -> None:
    ct2 = open_whisper(folders["ct2"])
    hf = open_whisper(folders["hf"])
    assert ct2.layout == "ct2" and hf.layout == "hf"
    assert ct2.spec.tensors() == hf.spec.tensors()
    assert (ct2.spec.d_model, ct2.spec.decoder_layers, ct2.spec.decoder_heads, ct2.spec.activation) == \
        (E, LAYERS, TINY_WHISPER["decoder_attention_heads"], "gelu")
    assert ct2.spec.decoder_start_token_id == 90 and ct2.spec.eos_token_id == 89
    assert ct2.alignment_heads == ((1, 0), (1, 1))
    for name in hf.spec.tensors():
        np.testing.assert_array_equal(np.asarray(ct2.params[name]), np.asarray(hf.params[name]), err_msg=name)
    encoded, logits = hf_outputs
    np.testing.assert_array_equal(run_encoder(folders["ct2"], mel_input()), encoded)
    np.testing.assert_array_equal(run_decoder(folders["ct2"], TOKENS, encoded), logits)


@pytest.mark.parametrize(("layout", "tolerance"), [("ct2_f16", 2e-3), ("ct2_int8", 2e-2), ("bf16", 1e-2)])
def test_narrow_layouts_read_close_to_the_float32_weights(folders: dict[str, Path], layout: str, tolerance: float) -> None:
    narrow = open_whisper(folders[layout])
    wide = open_whisper(folders["hf"])
    for name in wide.spec.tensors():
        a = np.asarray(narrow.params[name], np.float32)
        b = np.asarray(wide.params[name], np.float32)
        assert a.shape == b.shape
        assert np.abs(a - b).max() <= tolerance * max(np.abs(b).max(), 1e-3), name


def test_int8_weights_dequantize_per_row(folders: dict[str, Path]) -> None:
    file = CT2File(folders["ct2_int8"] / "model.bin")
    raw = file["decoder/layer_0/attention/linear_1/weight"]
    scale = file["decoder/layer_0/attention/linear_1/weight_scale"]
    assert raw.dtype == np.int8 and raw.shape == (2 * E, E) and scale.shape == (2 * E,)
    v = open_whisper(folders["ct2_int8"]).params["model.decoder.layers.0.encoder_attn.v_proj.weight"]
    np.testing.assert_allclose(v, raw[E:].astype(np.float32) / scale[E:, None], rtol=1e-6)


def test_config_reads_and_refusals() -> None:
    spec = model_spec(TINY_WHISPER)
    assert spec.kv_width == E * LAYERS and spec.begin_suppress_tokens == (5, 89)
    large_v3_turbo = {**TINY_WHISPER, "num_mel_bins": 128, "decoder_layers": 4, "encoder_layers": 32, "d_model": 1280,
                      "encoder_attention_heads": 20, "decoder_attention_heads": 20, "vocab_size": 51866}
    turbo = model_spec(large_v3_turbo)
    assert (turbo.num_mel_bins, turbo.decoder_layers, turbo.kv_width) == (128, 4, 5120)
    for edit, field in (({"scale_embedding": True}, "scale_embedding"), ({"d_model": 65}, "encoder_attention_heads"),
                        ({"activation_function": "relu"}, "activation_function"), ({"new_thing": 1}, "new_thing")):
        with pytest.raises(UnsupportedConfigError) as info:
            model_spec({**TINY_WHISPER, **edit})
        assert info.value.field == field


def test_cache_len_is_checked() -> None:
    for bad in (0, 33, True, 2.0):
        with pytest.raises(InvalidOptionError, match="cache_len"):
            build_text_decoder(model_spec(TINY_WHISPER), bad)  # type: ignore[arg-type]


def test_from_pretrained_points_whisper_to_its_packages(folders: dict[str, Path]) -> None:
    from rlx_mil.models import from_pretrained

    with pytest.raises(InvalidOptionError, match="Whisper"):
        from_pretrained(folders["hf"])


def test_hf_checkpoint_mismatches_are_listed(tmp_path: Path) -> None:
    config = copy.deepcopy(TINY_WHISPER)
    folder = write_random_checkpoint(tmp_path / "hf", config, seed=2)
    config["decoder_ffn_dim"] = 96
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as info:
        open_whisper(folder)
    assert any("fc1.weight" in p for p in info.value.problems)


def test_malformed_ct2_files_are_typed_errors(folders: dict[str, Path], tmp_path: Path) -> None:
    data = (folders["ct2_f16"] / "model.bin").read_bytes()
    for name, blob in (("truncated", data[: len(data) // 2]), ("empty", b""), ("version", b"\x63\0\0\0" + data[4:]),
                       ("header", data[:9])):
        bad = tmp_path / name
        bad.mkdir()
        (bad / "model.bin").write_bytes(blob)
        with pytest.raises((WeightsFormatError, CheckpointError)) as info:
            open_whisper(bad)
        assert "model.bin" in str(info.value)
    variables = ct2_variables_of(open_whisper(folders["hf"]).params, model_spec(TINY_WHISPER), "float16")
    del variables["decoder/layer_1/ffn/linear_1/bias"]
    variables["decoder/extra/weight"] = np.zeros((2, 2), np.float16)
    missing = tmp_path / "missing"
    missing.mkdir()
    write_ct2(missing / "model.bin", "WhisperSpec", 3, variables)
    with pytest.raises(CheckpointError) as info:
        open_whisper(missing)
    assert any("decoder/layer_1/ffn/linear_1/bias" in p for p in info.value.problems)
    assert any("decoder/extra/weight" in p for p in info.value.problems)


def test_sinusoids_are_whispers_table() -> None:
    table = sinusoids(1500, 64)
    assert table.shape == (1500, 64)
    np.testing.assert_allclose(table[0], np.r_[np.zeros(32), np.ones(32)])
    inv = np.exp(-np.log(10000) / 31 * np.arange(32))
    np.testing.assert_allclose(table[7, :32], np.sin(7 * inv), rtol=1e-6)


def _ct2_bytes() -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.bin"
        write_ct2(path, "WhisperSpec", 3, {"encoder/num_heads": np.array(2, np.int16),
                                           "decoder/embeddings/weight": np.ones((3, 4), np.float16),
                                           "decoder/layer_0/ffn/linear_0/weight": np.ones((2, 4), np.int8),
                                           "decoder/layer_0/ffn/linear_0/weight_scale": np.ones(2, np.float32)},
                  {"decoder/projection/weight": "decoder/embeddings/weight"})
        return path.read_bytes()


CT2_BYTES = _ct2_bytes()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, len(CT2_BYTES)), flips=st.lists(st.tuples(st.integers(0, len(CT2_BYTES) - 1),
                                                                   st.integers(1, 255)), max_size=4))
def test_hostile_ct2_bytes_read_or_fail_typed(tmp_path: Path, cut: int, flips: list[tuple[int, int]]) -> None:
    """Any truncation or byte flip of a model.bin is read (all variables within the file) or is
    a WeightsFormatError naming the file: never another exception, never a huge allocation."""
    data = bytearray(CT2_BYTES[:cut])
    for at, xor in flips:
        if at < len(data):
            data[at] ^= xor
    path = tmp_path / f"m{cut}_{len(flips)}.bin"
    path.write_bytes(bytes(data))
    try:
        file = CT2File(path)
    except WeightsFormatError as err:
        assert str(path) in str(err)
        return
    for name in file:
        value = file[name]
        assert value.nbytes <= len(data)


def test_a_fifo_model_bin_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "model.bin")
    with pytest.raises(WeightsFormatError, match="not a regular file"):
        CT2File(tmp_path / "model.bin")
