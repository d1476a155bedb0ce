"""Tiny GGUF files written the way llama.cpp's `convert_hf_to_gguf.py` writes them, from a
Hugging Face config and weights: metadata under `<arch>.*`, tensors under llama.cpp names,
Llama's Q/K rows permuted for llama.cpp's interleaved RoPE, Gemma's norms stored as `1 + w`,
Llama 3.1 scaling as a `rope_freqs` tensor, no `output` tensor when the embeddings are tied;
Gemma 3's global RoPE as `rope.freq_base` (+ scaling), its layer kinds and local RoPE base
given only where they differ from llama.cpp's defaults (every sixth layer global, base 10000).

`write_gguf` also returns the weights as the file holds them, back in Hugging Face terms
(each tensor dequantized by the `gguf` package, un-permuted, Gemma norms less 1): what an
independent forward of "the same file's dequantized weights" reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from models.gguf.kquants import encode

ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2", "phi3": "phi3",
        "gemma3_text": "gemma3"}
#: Families whose norms llama.cpp stores as applied (`1 + w`) and whose sandwich norms it names.
GEMMA = frozenset({"gemma2", "gemma3_text"})

_LAYER = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.qkv_proj": "attn_qkv",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate_up_proj": "ffn_up",
}
_GEMMA2 = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
           "post_feedforward_layernorm": "post_ffw_norm"}


def gguf_name(hf: str, model_type: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")
    layer, module, kind = parts[2], ".".join(parts[3:-1]), parts[-1]
    table = {**_LAYER, **_GEMMA2} if model_type in GEMMA else _LAYER
    return f"blk.{layer}.{table[module]}.{kind}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` (rows of each head: halves interleaved)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _rope_of(cfg: Mapping[str, Any]) -> tuple[float, Mapping[str, Any]]:
    """(base, scaling dict) from either config form: `rope_theta` + `rope_scaling`, or
    transformers 5's `rope_parameters` (`rope_scaling` first, as transformers reads them)."""
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    return float(scaling.get("rope_theta", cfg.get("rope_theta", 10000.0))), scaling


def _gemma3_metadata(w: Any, cfg: Mapping[str, Any]) -> tuple[float, Mapping[str, Any]]:
    """What convert_hf_to_gguf's Gemma3Model writes beyond the common keys (the sliding window,
    a final soft-cap if set), plus the layer kinds as `sliding_window_pattern` (one bool per
    layer) and the local base as `rope.freq_base_swa` where they are not llama.cpp's defaults.
    Returns the global RoPE (base, scaling dict)."""
    layers = cfg["num_hidden_layers"]
    pattern = cfg.get("sliding_window_pattern", 6)
    types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    sliding = [kind == "sliding_attention" for kind in types]
    ropes = cfg.get("rope_parameters") or {}
    full, local = dict(ropes.get("full_attention") or {}), dict(ropes.get("sliding_attention") or {})
    if any(sliding) and sliding != [i % 6 < 5 for i in range(layers)]:
        w.add_sliding_window_pattern(sliding)
    local_theta = float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10000.0)))
    if local_theta != 10000.0:
        w.add_rope_freq_base_swa(local_theta)
    if any(sliding):
        w.add_sliding_window(cfg["sliding_window"])
    if cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    return float(full.get("rope_theta", cfg.get("rope_theta", 1_000_000.0))), full


def _rope_freqs(cfg: Mapping[str, Any], head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf's Llama 3 `rope_freqs`: one divisor per frequency."""
    theta, s = _rope_of(cfg)
    factor, low, high, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def _store(writer: Any, name: str, value: np.ndarray, type_name: str) -> np.ndarray:
    """Write `value` as `type_name`; return what the file holds, dequantized (float64)."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize, quantize

    qtype = T[type_name]
    if type_name == "F32":
        data = np.ascontiguousarray(value, np.float32)
        writer.add_tensor(name, data)
        return data.astype(np.float64)
    if type_name == "F16":
        data = np.ascontiguousarray(value, np.float16)
        writer.add_tensor(name, data)
        return data.astype(np.float64)
    try:
        packed = quantize(np.ascontiguousarray(value, np.float32), qtype)
    except NotImplementedError:
        packed = encode(np.ascontiguousarray(value, np.float32), type_name)
    writer.add_tensor(name, packed, raw_dtype=qtype)
    return dequantize(packed, qtype).reshape(value.shape).astype(np.float64)


def write_gguf(
    path: str | Path, cfg: Mapping[str, Any], weights: Mapping[str, np.ndarray],
    types: Callable[[str, tuple[int, ...]], str] = lambda name, shape: "F32",
    tokenizer: Callable[[Any], None] | None = None,
) -> dict[str, np.ndarray]:
    """Write the GGUF file of HF `cfg` + `weights`; `types(gguf_name, shape)` picks each
    tensor's type (1-D tensors are always F32, as llama.cpp keeps them). Returns the file's
    dequantized weights under their HF names."""
    import gguf

    model_type = cfg["model_type"]
    arch = ARCH[model_type]
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads  # null: derived, as transformers does
    head_dim = cfg.get("head_dim") or hidden // heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(hidden)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    theta, scaling = _gemma3_metadata(w, cfg) if model_type == "gemma3_text" else _rope_of(cfg)
    w.add_rope_freq_base(theta)
    w.add_rope_dimension_count(head_dim)
    if cfg.get("head_dim"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if cfg.get("sliding_window") and model_type in ("mistral", "gemma2", "phi3"):
        w.add_sliding_window(cfg["sliding_window"])
    if model_type == "gemma2":
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(scaling["factor"])
    if tokenizer is not None:
        tokenizer(w)
    held: dict[str, np.ndarray] = {}
    if kind == "llama3":
        w.add_tensor("rope_freqs.weight", _rope_freqs(cfg, head_dim))
    for hf, value in weights.items():
        if hf == "lm_head.weight" and cfg.get("tie_word_embeddings", model_type in GEMMA):
            continue
        arr = np.asarray(value, np.float32)
        name = gguf_name(hf, model_type)
        heads_of = {"attn_q": heads, "attn_k": kv_heads}.get(name.split(".")[-2]) if arch == "llama" else None
        if heads_of is not None:
            arr = permute(arr, heads_of)
        if model_type in GEMMA and hf.endswith("norm.weight"):
            arr = arr + 1.0  # llama.cpp stores Gemma's norms as applied
        stored = _store(w, name, arr, "F32" if arr.ndim == 1 else types(name, arr.shape))
        if heads_of is not None:
            stored = unpermute(stored, heads_of)
        if model_type in GEMMA and hf.endswith("norm.weight"):
            stored = stored - 1.0
        held[hf] = stored
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


# ---------------------------------------------------------------------------- tokenizers

CORPUS = [
    "The quick brown fox jumps over the lazy dog 1234567890 times.",
    "It's a beautiful day, isn't it? We'll see what they've done.",
    "Numbers like 3.14159 and 2718 appear; so do emoji 🙂 and accents: café, naïve.",
    "def add(a, b):\n    return a + b\n\n\nprint(add(2, 40))",
] * 4
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def pre_tokenizer(kind: str) -> Any:
    """The Hugging Face pre-tokenizer of a llama.cpp `tokenizer.ggml.pre` kind."""
    from tokenizers import Regex, pre_tokenizers

    from rlx_mil.models.gguf.tokenizer import LLAMA3_SPLIT

    if kind == "smollm":  # SmolLM's tokenizer.json: single digits, then GPT-2's byte-level split
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if kind == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def trained_bpe(kind: str, vocab_size: int = 400) -> Any:
    """A byte-level BPE tokenizer trained on CORPUS with the pre-tokenizer of `kind`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer(kind)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def bpe_metadata(tok: Any, pre_name: str, **extra: Any) -> Callable[[Any], None]:
    """What llama.cpp's converter writes for a byte-level BPE tokenizer (tokens in id order,
    merges as 'a b', special tokens as control tokens), as a `write_gguf` tokenizer hook."""
    import json

    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]

    def add(w: Any) -> None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre_name)
        w.add_token_list(tokens)
        w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
        w.add_token_merges(merges)
        w.add_bos_token_id(vocab["<|im_start|>"])
        w.add_eos_token_id(vocab["<|im_end|>"])
        w.add_chat_template(TEMPLATE)
        for key, value in extra.items():
            getattr(w, f"add_{key}")(value)

    return add


def write_metadata_only(path: str | Path, arch: str, add: Callable[[Any], None]) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    add(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_chat_gguf(path: Path, *, layers: int, seed: int) -> Path:
    """A tiny Llama-style GGUF file (Q8_0 weights, tied embeddings) with a trained BPE tokenizer
    in its metadata, its float checkpoint written beside it in `<path>.hf`."""
    import copy

    from rlx_mil.models.checkpoint import Checkpoint
    from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

    tok = trained_bpe("smollm")
    cfg: dict[str, Any] = {**copy.deepcopy(TINY_CONFIGS["llama"]), "vocab_size": tok.get_vocab_size(),
                           "rope_parameters": None, "tie_word_embeddings": True, "num_hidden_layers": layers}
    weights = Checkpoint(write_random_checkpoint(path.with_suffix(".hf"), cfg, seed=seed))
    write_gguf(path, cfg, {k: weights[k] for k in weights}, types=lambda n, s: "Q8_0", tokenizer=bpe_metadata(tok, "smollm"))
    return path
