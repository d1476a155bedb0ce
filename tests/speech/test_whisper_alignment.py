"""`alignment_heads_weights`: the TextDecoder's optional output that WhisperKit's word timestamps
read, the mean of the generation config's alignment heads' cross-attention weights for the
token (whisperkittools' `compute_alignment_heads_attention_weights`), against the NumPy forward."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlx_mil.errors import InvalidOptionError
from rlx_mil.models.families.whisper import TINY_WHISPER
from rlx_mil.models.random_checkpoint import write_random_checkpoint
from rlx_mil.models.whisper import build_text_decoder
from rlx_mil.models.whisper_checkpoint import open_whisper
from rlx_mil.speech.packages import convert_whisper, feeds_for_step
from tests.speech import whisper_numpy as forward
from tests.speech.test_whisper_packages import contract

SMALL = {**TINY_WHISPER, "d_model": 32, "encoder_layers": 1, "decoder_layers": 2, "encoder_ffn_dim": 32,
         "decoder_ffn_dim": 32}
HEADS = [[0, 1], [1, 0], [1, 1]]
TOKENS = [90, 3, 17, 42]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("whisper_alignment")
    hf = write_random_checkpoint(root / "whisper-small-random", SMALL, seed=5)
    (hf / "tokenizer.json").write_text(json.dumps({"added_tokens": [{"id": 90, "content": "<|startoftranscript|>"}]}))
    (hf / "generation_config.json").write_text(json.dumps({"alignment_heads": HEADS, "decoder_start_token_id": 90}))
    return hf, {p: convert_whisper(hf, root / p, precision=p, cache_len=len(TOKENS)).folder for p in ("fp32", "fp16")}


def test_alignment_weights_are_the_mean_of_the_alignment_heads(folders: tuple[Path, dict[str, Path]]) -> None:
    from rlx_mil.milexec.prepared import prepare

    hf, out = folders
    params = open_whisper(hf).params
    encoded = np.random.default_rng(1).standard_normal((1500, SMALL["d_model"])).astype(np.float32)
    per_layer: list[list[np.ndarray]] = []
    forward.decode(params, SMALL, TOKENS, encoded, per_layer)
    want = np.mean([per_layer[layer][head] for layer, head in HEADS], axis=0)  # [tokens, 1500]
    assert np.allclose(want.sum(-1), 1.0)
    e, layers = SMALL["d_model"], SMALL["decoder_layers"]
    for precision, tolerance in (("fp32", 1e-5), ("fp16", 1e-2)):
        decoder = prepare(out[precision] / "TextDecoder.mlpackage")
        keys = np.zeros((1, e * layers, 1, len(TOKENS)), np.float32)
        values = keys.copy()
        channels_first = np.ascontiguousarray(encoded.T.reshape(1, e, 1, 1500))
        for step, token in enumerate(TOKENS):
            got = decoder.run(feeds_for_step(e * layers, e, len(TOKENS), token, step, keys, values, channels_first))
            keys[..., step] = np.asarray(got["key_cache_updates"], np.float32)[..., 0]
            values[..., step] = np.asarray(got["value_cache_updates"], np.float32)[..., 0]
            weights = np.asarray(got["alignment_heads_weights"], np.float32)
            assert weights.shape == (1, 1500)
            assert np.abs(weights[0] - want[step]).max() < tolerance * want[step].max(), (precision, step)


def test_the_output_is_in_whisperkits_contract(folders: tuple[Path, dict[str, Path]]) -> None:
    _, out = folders
    assert contract(out["fp16"] / "TextDecoder.mlpackage")["alignment_heads_weights"] == ([1, 1500], "FLOAT16")
    assert contract(out["fp32"] / "TextDecoder.mlpackage")["alignment_heads_weights"] == ([1, 1500], "FLOAT32")


def test_an_alignment_head_outside_the_decoder_is_refused(folders: tuple[Path, dict[str, Path]]) -> None:
    spec = open_whisper(folders[0]).spec
    with pytest.raises(InvalidOptionError, match=r"alignment_heads: \(2, 0\)"):
        build_text_decoder(spec, 4, alignment_heads=[(2, 0)])
