"""`from_pretrained`: a Hugging Face checkpoint folder -> (RLX graph, params)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import InvalidOptionError
from rlx_mil.ir import Graph
from rlx_mil.models.budget import check_activation_sizes, check_build_cost, check_sizes_against_checkpoint
from rlx_mil.models.checkpoint import Checkpoint, DerivedTensor, ModelParams, pattern_matcher
from rlx_mil.models.decoder import DecoderOptions, build_decoder
from rlx_mil.models.families import model_spec
from rlx_mil.models.hf_config import DecoderSpec, EncoderSpec, ModelSpec, VisionSpec

#: Stored tensors the decoders never read: rotary buffers older exports saved.
_DECODER_BUFFERS = (r"model\.rotary_emb\.inv_freq", r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")



def architecture_name(spec: ModelSpec) -> str:
    """How messages name the architecture of `spec` (its family record's name)."""
    from rlx_mil.models.families import family

    return family(spec.family).name


def build(
    spec: ModelSpec,
    *,
    variant: str = "prefill",
    seq_len: int | None = None,
    cache_len: int | None = None,
    batch_size: int = 1,
    last_logits: bool = False,
    kv_outputs: bool = False,
    position_ids: bool = False,
    max_positions: int | None = None,
    attention_mask: bool = False,
    pooling: str | None = None,
    normalize: bool = False,
    token_type_ids: bool = False,
    image_size: int | tuple[int, int] | None = None,
    spatial_shape: tuple[int, int] | None = None,
    name: str | None = None,
    source: str = "config.json",
    precheck: Callable[[], None] | None = None,
) -> tuple[Graph, dict[str, tuple[int, ...]], dict[str, np.ndarray]]:
    """The graph of `spec`, the checkpoint tensors it reads (name -> shape) and the arrays
    the builder computes (RoPE tables). What building would allocate is estimated first and
    refused above `budget.MAX_BUILD_BYTES` (InvalidOptionError naming `source`); a costly
    build runs `precheck` (the config's sizes against the checkpoint's headers) first."""
    if isinstance(spec, VisionSpec):
        from rlx_mil.models.vision import build_vision, check_vision_sizes, vision_options

        if variant != "prefill" or cache_len is not None or last_logits or kv_outputs or position_ids or max_positions \
                or attention_mask or token_type_ids:
            raise InvalidOptionError(f"{architecture_name(spec)} is an image encoder: it has no decode variant, KV cache,"
                                     " logits, attention_mask or token_type_ids inputs")
        vision = vision_options(spec, batch_size=batch_size, seq_len=seq_len, image_size=image_size,
                                spatial_shape=spatial_shape, pooling=pooling, normalize=normalize)
        vision.validate(spec)
        check_vision_sizes(spec, vision, source, precheck)
        return build_vision(spec, vision, name)
    if image_size is not None or spatial_shape is not None:
        raise InvalidOptionError("image_size and spatial_shape apply to the image encoders (DINOv2, SigLIP) only")
    if isinstance(spec, EncoderSpec):
        from rlx_mil.models.encoder import EncoderOptions, build_encoder

        if variant != "prefill" or cache_len is not None or last_logits or kv_outputs or position_ids or max_positions:
            raise InvalidOptionError(f"{architecture_name(spec)} is an encoder: it has no decode variant, KV cache or logits")
        encoder_options = EncoderOptions(seq_len=128 if seq_len is None else seq_len, batch_size=batch_size,
                                 pooling=pooling, normalize=normalize, token_type_ids=token_type_ids)
        encoder_options.validate(spec)
        check_build_cost(spec, source, precheck, seq_len=encoder_options.seq_len, batch_size=batch_size)
        check_activation_sizes(spec, source, seq_len=encoder_options.seq_len, batch_size=batch_size)
        return build_encoder(spec, encoder_options, name)
    if pooling is not None or normalize or token_type_ids:
        raise InvalidOptionError("pooling, normalize and token_type_ids apply to encoders (BERT, RoBERTa, ModernBERT) only")
    if seq_len is None:
        seq_len = 1 if variant == "decode" else 128
    if variant == "decode" and cache_len is None:
        raise InvalidOptionError("the decode variant needs cache_len (past positions held in the KV cache)")
    options = DecoderOptions(
        variant=variant, seq_len=seq_len, cache_len=cache_len or 0, batch_size=batch_size,
        last_logits=last_logits, kv_outputs=kv_outputs, position_ids=position_ids, max_positions=max_positions,
        attention_mask=attention_mask,
    )
    options.validate(spec)
    check_build_cost(spec, source, precheck, table_rows=options.table_rows)
    check_activation_sizes(spec, source, seq_len=options.seq_len, batch_size=options.batch_size,
                           last_logits=options.last_logits)
    own_builder = getattr(spec, "build_graph", None)
    if own_builder is not None:  # the round-2 families (rlx_mil.models.moe, lfm2, qwen3_5)
        return own_builder(options, name or f"{spec.family}_{options.variant}")
    return build_decoder(spec, options, name)


def _ignorable(spec: ModelSpec) -> Any:
    if isinstance(spec, VisionSpec):
        return pattern_matcher(*spec.ignored_tensors)
    if isinstance(spec, DecoderSpec):
        patterns = list(_DECODER_BUFFERS) + list(getattr(spec, "ignored_tensors", ()))
        if spec.tie_word_embeddings:
            patterns.append(r"lm_head\.weight")  # some exports store the tied head too
        return pattern_matcher(*patterns)
    return pattern_matcher(*spec.ignored_tensors)


def from_pretrained(
    path: str | os.PathLike[str],
    variant: str = "prefill",
    *,
    seq_len: int | None = None,
    cache_len: int | None = None,
    batch_size: int = 1,
    last_logits: bool = False,
    kv_outputs: bool = False,
    position_ids: bool = False,
    max_positions: int | None = None,
    attention_mask: bool = False,
    pooling: str | None = "auto",
    normalize: bool | None = None,
    token_type_ids: bool = False,
    image_size: int | tuple[int, int] | None = None,
    spatial_shape: tuple[int, int] | None = None,
) -> tuple[Graph, Mapping[str, np.ndarray]]:
    """Build the RLX graph of the Hugging Face checkpoint folder `path` and its params.

    `path` holds `config.json` and `model.safetensors` (or shards listed by
    `model.safetensors.index.json`). Params keep their Hugging Face names, stored layout and
    dtype (BF16 stays bfloat16), and are read from disk only when accessed; pass them
    straight to `rlx_mil.convert(graph, params, ...)`.

    Decoders: `variant="prefill"` (`seq_len` tokens, default 128) or `"decode"` (`seq_len`
    new tokens, default 1, attending to `cache_len` past positions). `last_logits` keeps only
    the last position's logits; `kv_outputs` adds each prefill layer's K/V as outputs;
    `position_ids` makes prefill take positions as an input; `max_positions` sizes the RoPE
    tables; `attention_mask` gives a one-token decode graph a key-padding mask input over the
    P + 1 keys. Encoders (BERT / MiniLM, RoBERTa / XLM-RoBERTa, ModernBERT): `pooling` "mean",
    "cls" or None ("auto" reads a sentence-transformers pooling config when present, else the
    family's own: ModernBERT's `classifier_pooling`), `normalize` L2-normalises the pooled
    embedding (default: whether the sentence-transformers pipeline has a Normalize module),
    `token_type_ids` adds that input (default: every token in segment 0).

    Image encoders (DINOv2, the vision tower of a SigLIP / SigLIP2 folder; docs/models.md):
    `pooling` "auto" outputs `pooler_output` (None: `last_hidden_state`), `normalize`
    L2-normalises it (output `image_embeds`); `image_size` (pixels, default the trained size)
    for DINOv2 and SigLIP; SigLIP2 takes `seq_len` patches per image (default `num_patches`)
    with a `spatial_shapes` input, or one `spatial_shape` (rows, columns) for every image.

    The checkpoint's tensor names, shapes and dtypes are checked against the config before
    anything is read; every mismatch is listed in one `CheckpointError`.
    """
    checkpoint = Checkpoint(path)
    source = str(checkpoint.directory / "config.json")
    spec = model_spec(checkpoint.config, source=source)
    from rlx_mil.models.whisper import WhisperSpec

    if isinstance(spec, WhisperSpec):
        raise InvalidOptionError(f"{source}: Whisper is a speech model of three packages; convert it with"
                                 " `rlx-mil convert-hf` (a WhisperKit folder) or rlx_mil.speech.convert_whisper")
    adapt = getattr(spec, "for_checkpoint", None)
    if adapt is not None:  # a family whose stored layout varies (fused or per-expert MoE weights)
        spec = adapt(checkpoint)
    spec = _layout(spec, checkpoint)
    prefix = _stored_prefix(spec, checkpoint)

    def precheck() -> None:
        if isinstance(spec, VisionSpec):
            from rlx_mil.models.vision import check_layers

            check_layers(spec, list(checkpoint), source)
        else:
            check_sizes_against_checkpoint(spec, list(checkpoint), checkpoint.shape_of, source, prefix)
    if isinstance(spec, VisionSpec):
        normalize = bool(normalize)  # pooling "auto": the model's pooler_output
        if pooling is None:  # last_hidden_state: the pooling head is not read
            spec = replace(spec, ignored_tensors=(*spec.ignored_tensors, re.escape(spec.root) + r"head\..*"))
    elif isinstance(spec, EncoderSpec):
        from rlx_mil.models.encoder import sentence_transformers_pipeline

        auto_pooling, auto_normalize = sentence_transformers_pipeline(checkpoint.directory)
        pooling = (auto_pooling or spec.default_pooling) if pooling == "auto" else pooling
        normalize = auto_normalize if normalize is None else normalize
    else:
        pooling = None if pooling == "auto" else pooling
        normalize = bool(normalize)
    graph, expected, computed = build(
        spec, variant=variant, seq_len=seq_len, cache_len=cache_len, batch_size=batch_size,
        last_logits=last_logits, kv_outputs=kv_outputs, position_ids=position_ids, max_positions=max_positions,
        attention_mask=attention_mask, pooling=pooling, normalize=normalize, token_type_ids=token_type_ids,
        image_size=image_size, spatial_shape=spatial_shape,
        name=checkpoint_name(checkpoint.directory, checkpoint.config), source=source, precheck=precheck,
    )
    checkpoint.check({prefix + k: v for k, v in expected.items()}, architecture_name(spec), _ignorable_prefixed(spec, prefix))
    derived = {k: v for k, v in computed.items() if isinstance(v, DerivedTensor)}
    arrays = {k: v for k, v in computed.items() if k not in derived}
    return graph, ModelParams(checkpoint, tuple(expected), arrays, stored_prefix=prefix, derived=derived)


def _layout(spec: ModelSpec, checkpoint: Checkpoint) -> ModelSpec:
    """A VLM decoder (root `model.language_model`) stored as transformers 4 wrote it
    (`language_model.model.`) is read from there; so is a vision-only SigLIP tower stored under
    `vision_model.` (transformers 4's `SiglipVisionModel`)."""
    if isinstance(spec, VisionSpec):
        patches = "embeddings.patch_embedding.weight"
        if spec.root == "" and patches not in checkpoint and f"vision_model.{patches}" in checkpoint:
            return replace(spec, root="vision_model.")
        return spec
    old_root = "language_model.model"
    if isinstance(spec, DecoderSpec) and spec.root == "model.language_model" \
            and f"{spec.root}.embed_tokens.weight" not in checkpoint and f"{old_root}.embed_tokens.weight" in checkpoint:
        return replace(spec, root=old_root)
    return spec


def _stored_prefix(spec: ModelSpec, checkpoint: Checkpoint) -> str:
    """Encoder checkpoints store tensors either bare (the base model's save_pretrained,
    sentence-transformers) or under the task model's `bert.` / `roberta.` / `model.`."""
    if isinstance(spec, EncoderSpec):
        embedding = spec.header_shapes()[0][0]
        prefix = f"{spec.base_prefix}."
        if embedding not in checkpoint and prefix + embedding in checkpoint:
            return prefix
    return ""


def _ignorable_prefixed(spec: ModelSpec, prefix: str) -> Any:
    base = _ignorable(spec)
    if not prefix:
        return base
    return lambda name: base(name[len(prefix):] if name.startswith(prefix) else name) or base(name)


#: Where a checkpoint's name came from (`checkpoint_source`), as `inspect` says it.
NAMED_BY_CONFIG = "config.json _name_or_path"
NAMED_BY_CARD = "model card model_name"
NAMED_BY_HUB_CACHE = "Hugging Face cache folder"
NAMED_BY_FOLDER = "folder name"


def checkpoint_source(directory: Path, config: Mapping[str, Any], card_name: str | None = None) -> tuple[str, str]:
    """(the model's source, where it came from): config.json's `_name_or_path`
    (`HuggingFaceTB/SmolLM2-135M`), else the model card's `model_name` (`card_name`), else the
    repository of a Hugging Face cache snapshot (`models--owner--name/snapshots/<hash>`: the
    folder's own name is a commit hash), else the folder's name. Many checkpoints (SmolLM2's
    among them) carry no name, so the last is common; callers say so rather than pass a folder
    such as `hf` off as the model's name."""
    given = config.get("_name_or_path")
    if isinstance(given, str) and given.strip().rstrip("/"):
        return given.strip().rstrip("/"), NAMED_BY_CONFIG
    if card_name:
        return card_name, NAMED_BY_CARD
    parts = directory.resolve().parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3][len("models--"):].replace("--", "/", 1), NAMED_BY_HUB_CACHE
    return directory.resolve().name, NAMED_BY_FOLDER


def checkpoint_name(directory: Path, config: Mapping[str, Any]) -> str | None:
    """The model's name: the last part of `checkpoint_source`."""
    return checkpoint_source(directory, config)[0].rsplit("/", 1)[-1] or None
