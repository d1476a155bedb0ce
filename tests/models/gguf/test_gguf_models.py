"""GGUF files of every architecture (written by the tests with `gguf.GGUFWriter`, the way
llama.cpp's converter writes them) built by `from_gguf`: against an independent NumPy forward
of the file's weights, and against the same model read from its Hugging Face checkpoint."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.gguf.gguf_files import ARCH, write_gguf
from models.hf_numpy import FORWARDS
from rlx_mil import reference
from rlx_mil.errors import CheckpointError, UnsupportedConfigError
from rlx_mil.models import from_gguf, from_pretrained
from rlx_mil.models.checkpoint import Checkpoint
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

#: The tiny configs of the families GGUF files are read for (by their HF name).
CONFIGS: dict[str, dict[str, Any]] = {n: copy.deepcopy(c) for n, c in TINY_CONFIGS.items() if n in ARCH}
# GGUF has no query_pre_attn_scalar: llama.cpp scales Gemma 2 scores by head_dim (27B aside).
CONFIGS["gemma2"]["query_pre_attn_scalar"] = CONFIGS["gemma2"]["head_dim"]
CONFIGS["llama"]["rope_parameters"]["original_max_position_embeddings"] = 128
# Gemma 3 as llama.cpp lays it out by default (every sixth layer global), a local RoPE base of
# its own (`rope.freq_base_swa`) and a final soft-cap; and one without a sliding window.
CONFIGS["gemma3_pattern6"] = {
    **copy.deepcopy(TINY_CONFIGS["gemma3_text"]), "num_hidden_layers": 7, "layer_types": None, "final_logit_softcapping": 5.0,
    "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}},
}
CONFIGS["gemma3_global"] = {**copy.deepcopy(TINY_CONFIGS["gemma3_text"]), "layer_types": ["full_attention"] * 3}
CONFIGS["llama_linear_tied"] = {**copy.deepcopy(TINY_CONFIGS["llama"]), "rope_scaling": {"type": "linear", "factor": 2.0},
                                "tie_word_embeddings": True}
SEQ = 8


def family(name: str) -> str:
    return str(CONFIGS[name]["model_type"])


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, dict[str, np.ndarray]]]:
    root = tmp_path_factory.mktemp("gguf_models")
    out = {}
    for i, (name, cfg) in enumerate(CONFIGS.items()):
        ckpt = write_random_checkpoint(root / name, cfg, seed=10 + i)
        weights = Checkpoint(ckpt)
        held = write_gguf(root / f"{name}.gguf", cfg, {k: weights[k] for k in weights},
                          types=lambda n, s: "F16" if "ffn" in n else "F32")
        out[name] = (ckpt, root / f"{name}.gguf", held)
    return out


def ids_for(vocab: int, length: int) -> np.ndarray:
    return np.random.default_rng(3).integers(0, vocab, (1, length)).astype(np.int32)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_gguf_prefill_matches_independent_forward(name: str, models: Any) -> None:
    ckpt, path, held = models[name]
    cfg = CONFIGS[name]
    graph, params = from_gguf(path, seq_len=SEQ)
    ids = ids_for(cfg["vocab_size"], SEQ)
    got = reference.evaluate(graph, {"input_ids": ids}, params)["logits"]
    want, _ = FORWARDS[family(name)](held, cfg, ids)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())
    # The same model from its Hugging Face checkpoint (F16 ffn weights rounded in the file).
    hf_graph, hf_params = from_pretrained(ckpt, seq_len=SEQ)
    hf = reference.evaluate(hf_graph, {"input_ids": ids}, hf_params)["logits"]
    np.testing.assert_allclose(got, hf, rtol=2e-2, atol=2e-2 * np.abs(hf).max())


@pytest.mark.parametrize("name", ["llama", "gemma2", "gemma3_text", "gemma3_pattern6", "phi3"])
def test_gguf_decode_continues_prefill(name: str, models: Any) -> None:
    _, path, held = models[name]
    cfg = CONFIGS[name]
    past, new = 5, 2
    ids = ids_for(cfg["vocab_size"], past + new)
    want, _ = FORWARDS[family(name)](held, cfg, ids)
    prefill, p_params = from_gguf(path, seq_len=past, kv_outputs=True)
    cached = reference.evaluate(prefill, {"input_ids": ids[:, :past]}, p_params)
    decode, params = from_gguf(path, "decode", seq_len=new, cache_len=past)
    feeds = {"input_ids": ids[:, past:], "position_ids": np.arange(past, past + new, dtype=np.int32)[None]}
    for i in range(cfg["num_hidden_layers"]):
        feeds[f"past_k_{i}"], feeds[f"past_v_{i}"] = cached[f"new_k_{i}"], cached[f"new_v_{i}"]
    got = reference.evaluate(decode, feeds, params)["logits"]
    np.testing.assert_allclose(got, want[:, past:], rtol=2e-4, atol=2e-4 * np.abs(want).max())


def test_unknown_architecture_is_refused_by_name(tmp_path: Path) -> None:
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedConfigError, match=r"general.architecture = .mamba.") as err:
        from_gguf(tmp_path / "m.gguf")
    assert err.value.field == "general.architecture"


def _gemma3_metadata_file(path: Path, layers: int, **keys: Any) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "gemma3")
    for key, value in {"block_count": layers, "embedding_length": 1024, "feed_forward_length": 64, "head_count": 8,
                       "head_count_kv": 4, "key_length": 256, "value_length": 256, **keys}.items():
        getattr(w, f"add_{key}")(value)
    w.add_tensor("token_embd.weight", np.zeros((4, 1024), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gemma3_metadata_follows_llama_cpp(tmp_path: Path) -> None:
    """llama.cpp's Gemma 3 conventions: queries scaled by head_dim ** -0.5 except in the 62-layer
    27B ((hidden / heads) ** -0.5); every sixth layer global; local RoPE base 10000 unscaled, the
    file's rope scaling on the global layers only; no sliding window: every layer global."""
    import gguf

    from rlx_mil.models.gguf.metadata import decoder_spec
    from rlx_mil.models.gguf.reader import GGUFFile

    spec = decoder_spec(GGUFFile(_gemma3_metadata_file(tmp_path / "a.gguf", 62, sliding_window=1024, rope_freq_base=1e6,
                                                       rope_scaling_type=gguf.RopeScalingType.LINEAR, rope_scaling_factor=8.0)))
    assert spec.score_scale == pytest.approx((1024 / 8) ** -0.5)
    assert spec.layer_windows == tuple(None if i % 6 == 5 else 1024 for i in range(62))
    assert [(r.theta, r.kind, r.factor) for r in spec.layer_ropes if r is not None][4:6] == [(1e4, "default", 1.0), (1e6, "linear", 8.0)]
    assert spec.embed_scale == pytest.approx(32.0) and spec.norm_offset == 0.0 and spec.qk_norm and spec.tie_word_embeddings
    small = decoder_spec(GGUFFile(_gemma3_metadata_file(tmp_path / "b.gguf", 26)))
    assert small.score_scale == pytest.approx(256**-0.5)
    assert small.layer_windows == (None,) * 26 and {r.theta for r in small.layer_ropes if r is not None} == {10000.0}
    with pytest.raises(UnsupportedConfigError, match=r"gemma3.attention.sliding_window_pattern") as err:
        decoder_spec(GGUFFile(_gemma3_metadata_file(tmp_path / "c.gguf", 4, sliding_window=8, sliding_window_pattern=[True, False])))
    assert err.value.field == "gemma3.attention.sliding_window_pattern"


def test_missing_and_unexpected_tensors_are_listed(tmp_path: Path, models: Any) -> None:
    ckpt, _, _ = models["qwen3"]
    cfg = CONFIGS["qwen3"]
    weights = Checkpoint(ckpt)
    kept = {k: weights[k] for k in weights if k != "model.layers.1.mlp.up_proj.weight"}
    write_gguf(tmp_path / "m.gguf", cfg, kept)
    with pytest.raises(CheckpointError) as err:
        from_gguf(tmp_path / "m.gguf")
    assert any("model.layers.1.mlp.up_proj.weight" in p for p in err.value.problems)


@pytest.mark.parametrize("name", ["llama", "gemma2", "gemma3_text"])
def test_gguf_conversion_matches_reference(name: str, models: Any) -> None:
    from rlx_mil.testing import check_conversion

    _, path, _ = models[name]
    graph, params = from_gguf(path, seq_len=SEQ)
    ids = ids_for(CONFIGS[name]["vocab_size"], SEQ)
    check_conversion(graph, params, {"input_ids": ids}, targets=["iOS18"], precisions=["fp32"], coreml=False)
