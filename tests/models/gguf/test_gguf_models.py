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


@pytest.mark.parametrize("name", ["llama", "gemma2", "phi3"])
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


def test_missing_and_unexpected_tensors_are_listed(tmp_path: Path, models: Any) -> None:
    ckpt, _, _ = models["qwen3"]
    cfg = CONFIGS["qwen3"]
    weights = Checkpoint(ckpt)
    kept = {k: weights[k] for k in weights if k != "model.layers.1.mlp.up_proj.weight"}
    write_gguf(tmp_path / "m.gguf", cfg, kept)
    with pytest.raises(CheckpointError) as err:
        from_gguf(tmp_path / "m.gguf")
    assert any("model.layers.1.mlp.up_proj.weight" in p for p in err.value.problems)


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_gguf_conversion_matches_reference(name: str, models: Any) -> None:
    from rlx_mil.testing import check_conversion

    _, path, _ = models[name]
    graph, params = from_gguf(path, seq_len=SEQ)
    ids = ids_for(CONFIGS[name]["vocab_size"], SEQ)
    check_conversion(graph, params, {"input_ids": ids}, targets=["iOS18"], precisions=["fp32"], coreml=False)
