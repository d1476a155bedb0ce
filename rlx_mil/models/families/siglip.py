"""SigLIP / SigLIP2 image encoders from their dual-encoder folders (`SiglipModel` /
`Siglip2Model`: the vision tower's config under `vision_config`, its tensors under
`vision_model.`; the text tower, `logit_scale` and `logit_bias` are not read) and from
vision-only folders (`SiglipVisionModel` / `Siglip2VisionModel`); graphs built by
`rlx_mil.models.vision`."""

from __future__ import annotations

import math
from typing import Any

from rlx_mil.errors import UnsupportedConfigError
from rlx_mil.models.families.dinov2 import square
from rlx_mil.models.family_registry import encoder_family
from rlx_mil.models.hf_config import Fields, VisionSpec

#: transformers 5.24.0 SiglipConfig / Siglip2Config defaults (the dual-encoder wrapper).
SIGLIP_DEFAULTS: dict[str, Any] = {"text_config": None, "vision_config": None, "initializer_factor": 1.0}
#: transformers 5.24.0 SiglipVisionConfig defaults.
SIGLIP_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "image_size": 224, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6, "attention_dropout": 0.0, "vision_use_head": True,
}
#: transformers 5.24.0 Siglip2VisionConfig defaults.
SIGLIP2_VISION_DEFAULTS: dict[str, Any] = {
    **{k: v for k, v in SIGLIP_VISION_DEFAULTS.items() if k != "image_size"}, "num_patches": 256,
}
#: transformers 5.24.0 SiglipTextConfig / Siglip2TextConfig sizes (the text tower's tensors, not read).
SIGLIP_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
    "max_position_embeddings": 64, "projection_size": None,
}

_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu"}
#: What a dual-encoder folder holds beside the vision tower.
_IGNORED = (r"text_model\..*", r"logit_scale", r"logit_bias", r"vision_model\.embeddings\.position_ids")

_TINY_TEXT: dict[str, Any] = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
    "max_position_embeddings": 16, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6,
    "attention_dropout": 0.0, "projection_size": 32, "pad_token_id": 1, "bos_token_id": 49406, "eos_token_id": 49407,
}
_TINY_VISION: dict[str, Any] = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_channels": 3,
    "patch_size": 4, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6, "attention_dropout": 0.0,
    "vision_use_head": True,
}


def _text_tower(config: object) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The text tower's tensors (name, shape) as `save_pretrained` writes them; () when its
    config is not readable (it is never read, so it cannot fail a conversion)."""
    if not isinstance(config, dict):
        return ()
    try:
        f = Fields(config, "siglip_text_model", "text_config", SIGLIP_TEXT_DEFAULTS)
        e, m, layers = f.int_("hidden_size"), f.int_("intermediate_size"), f.int_("num_hidden_layers")
        out = f.int_("projection_size", e)
        tensors: list[tuple[str, tuple[int, ...]]] = [
            ("text_model.embeddings.token_embedding.weight", (f.int_("vocab_size"), e)),
            ("text_model.embeddings.position_embedding.weight", (f.int_("max_position_embeddings"), e)),
            ("text_model.final_layer_norm.weight", (e,)), ("text_model.final_layer_norm.bias", (e,)),
            ("text_model.head.weight", (out, e)), ("text_model.head.bias", (out,)),
            ("logit_scale", (1,)), ("logit_bias", (1,)),
        ]
    except UnsupportedConfigError:
        return ()
    for i in range(layers):
        p = f"text_model.encoder.layers.{i}"
        for norm in ("layer_norm1", "layer_norm2"):
            tensors += [(f"{p}.{norm}.weight", (e,)), (f"{p}.{norm}.bias", (e,))]
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            tensors += [(f"{p}.self_attn.{proj}.weight", (e, e)), (f"{p}.self_attn.{proj}.bias", (e,))]
        tensors += [(f"{p}.mlp.fc1.weight", (m, e)), (f"{p}.mlp.fc1.bias", (m,)),
                    (f"{p}.mlp.fc2.weight", (e, m)), (f"{p}.mlp.fc2.bias", (e,))]
    return tuple(tensors)


def _read(f: Fields, naflex: bool) -> VisionSpec:
    """A dual-encoder folder: the vision tower's config under `vision_config`."""
    vision = f.config.get("vision_config")
    if not isinstance(vision, dict):
        raise UnsupportedConfigError(f"{f.source}: a {f.family} config needs a vision_config object",
                                     field="vision_config", value=vision)
    defaults = SIGLIP2_VISION_DEFAULTS if naflex else SIGLIP_VISION_DEFAULTS
    v = Fields(vision, f.family, f"{f.source} vision_config", defaults)
    v.check_known(frozenset(defaults))
    return _tower(v, naflex, "vision_model.", _IGNORED, _text_tower(f.config.get("text_config")))


def _tower(v: Fields, naflex: bool, root: str, ignored: tuple[str, ...],
           unread: tuple[tuple[str, tuple[int, ...]], ...]) -> VisionSpec:
    """The vision tower of a SigLIP (NaFlex: SigLIP2) vision config."""
    hidden, heads = v.int_("hidden_size"), v.int_("num_attention_heads")
    if hidden % heads:
        raise v.refuse("num_attention_heads", heads, f"must divide hidden_size {hidden}")
    v.must_be("attention_dropout", (0, 0.0), "dropout at inference must be 0")
    patch = v.int_("patch_size")
    image: tuple[int, int] | None = None
    if naflex:
        positions = v.int_("num_patches")
        grid = math.isqrt(positions)
        if grid * grid != positions:
            raise v.refuse("num_patches", positions, "transformers reads the position embeddings as a square grid")
    else:
        image = square(v, "image_size")
        if image[0] != image[1]:
            raise v.refuse("image_size", v.config["image_size"], "transformers builds square SigLIP images only")
        grid = image[0] // patch
        if grid < 1:
            raise v.refuse("image_size", image[0], f"smaller than one {patch}-pixel patch")
    return VisionSpec(
        family=v.family, layout="siglip", hidden_size=hidden, num_layers=v.int_("num_hidden_layers"), num_heads=heads,
        intermediate_size=v.int_("intermediate_size"), num_channels=v.int_("num_channels"), patch_size=patch,
        image_size=image, position_grid=grid, layer_norm_eps=v.float_("layer_norm_eps"),
        activation=v.choice("hidden_act", _ACTIVATIONS), use_head=v.bool_("vision_use_head", True), naflex=naflex,
        root=root, ignored_tensors=ignored, unread_tensors=unread,
    )


@encoder_family("siglip", name="SigLIP", defaults=SIGLIP_DEFAULTS, config_class="SiglipConfig", transformers_version="5.24.0",
                tiny={"architectures": ["SiglipModel"], "initializer_factor": 1.0,
                      "text_config": {**_TINY_TEXT, "model_type": "siglip_text_model"},
                      "vision_config": {**_TINY_VISION, "model_type": "siglip_vision_model", "image_size": 16}})
def read_siglip(f: Fields) -> VisionSpec:
    return _read(f, naflex=False)


@encoder_family("siglip2", name="SigLIP2", defaults=SIGLIP_DEFAULTS, config_class="Siglip2Config", transformers_version="5.24.0",
                tiny={"architectures": ["Siglip2Model"], "initializer_factor": 1.0,
                      "text_config": {**_TINY_TEXT, "model_type": "siglip2_text_model"},
                      "vision_config": {**_TINY_VISION, "model_type": "siglip2_vision_model", "num_patches": 16}})
def read_siglip2(f: Fields) -> VisionSpec:
    return _read(f, naflex=True)


#: A vision-only folder's buffers (transformers 4 stored the tower under `vision_model.`).
_STANDALONE_IGNORED = (r"(vision_model\.)?embeddings\.position_ids",)


@encoder_family("siglip_vision_model", name="SigLIP vision", defaults=SIGLIP_VISION_DEFAULTS,
                config_class="SiglipVisionConfig", transformers_version="5.24.0",
                tiny={"architectures": ["SiglipVisionModel"], **_TINY_VISION, "image_size": 16})
def read_siglip_vision_model(f: Fields) -> VisionSpec:
    """A `SiglipVisionModel` folder: the tower's config at the top level, its tensors at the
    root (transformers 5) or under `vision_model.` (transformers 4; `pretrained` reads either)."""
    return _tower(f, False, "", _STANDALONE_IGNORED, ())


@encoder_family("siglip2_vision_model", name="SigLIP2 vision", defaults=SIGLIP2_VISION_DEFAULTS,
                config_class="Siglip2VisionConfig", transformers_version="5.24.0",
                tiny={"architectures": ["Siglip2VisionModel"], **_TINY_VISION, "num_patches": 16})
def read_siglip2_vision_model(f: Fields) -> VisionSpec:
    """A `Siglip2VisionModel` folder (as `siglip_vision_model`)."""
    return _tower(f, True, "", _STANDALONE_IGNORED, ())
