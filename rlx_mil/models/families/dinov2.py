"""DINOv2 image encoders: `dinov2` and `dinov2_with_registers` (`Dinov2Model` /
`Dinov2WithRegistersModel` checkpoints); graphs built by `rlx_mil.models.vision`.

Tensors are read under the names `save_pretrained` writes (the published layout:
`attention.attention.query`, `attention.output.dense`, SwiGLU `mlp.weights_in` /
`mlp.weights_out`), which transformers 5 renames on load.
"""

from __future__ import annotations

from typing import Any

from rlx_mil.models.family_registry import encoder_family
from rlx_mil.models.hf_config import Fields, VisionSpec

#: transformers 5.24.0 Dinov2Config defaults.
DINOV2_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "mlp_ratio": 4, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "initializer_range": 0.02, "layer_norm_eps": 1e-6,
    "image_size": 224, "patch_size": 14, "num_channels": 3, "qkv_bias": True, "layerscale_value": 1.0,
    "drop_path_rate": 0.0, "use_swiglu_ffn": False, "_out_features": None, "_out_indices": None,
    "apply_layernorm": True, "reshape_hidden_states": True, "use_mask_token": True,
}
#: transformers 5.24.0 Dinov2WithRegistersConfig defaults (no `use_mask_token`: the mask token is always stored).
DINOV2_WITH_REGISTERS_DEFAULTS: dict[str, Any] = {
    **{k: v for k, v in DINOV2_DEFAULTS.items() if k != "use_mask_token"}, "patch_size": 16, "num_register_tokens": 4,
}
#: Backbone settings `to_dict` writes; they shape `Dinov2Backbone`'s outputs, not the model's.
_BACKBONE_KEYS = ("out_features", "out_indices", "stage_names")

_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}

_TINY: dict[str, Any] = {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "mlp_ratio": 4, "hidden_act": "gelu",
    "layer_norm_eps": 1e-6, "image_size": 16, "patch_size": 4, "num_channels": 3, "qkv_bias": True,
    "layerscale_value": 1.0, "use_swiglu_ffn": False, "apply_layernorm": True, "reshape_hidden_states": True,
    "out_features": ["stage2"], "out_indices": [2], "stage_names": ["stem", "stage1", "stage2"],
    "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "drop_path_rate": 0.0, "initializer_range": 0.02,
}


def square(f: Fields, field: str) -> tuple[int, int]:
    """An `int` or `[height, width]` size field, as (height, width)."""
    value = f.config.get(field)
    if isinstance(value, (list, tuple)) and len(value) == 2:
        pair = tuple(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        pair = (value, value)
    else:
        raise f.refuse(field, value, "expected an integer or [height, width]")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in pair):
        raise f.refuse(field, value, "expected sizes >= 1")
    return int(pair[0]), int(pair[1])


def _read(f: Fields, with_registers: bool) -> VisionSpec:
    registers = f.int_("num_register_tokens", minimum=0) if with_registers else 0
    hidden = f.int_("hidden_size")
    heads = f.int_("num_attention_heads")
    if hidden % heads:
        raise f.refuse("num_attention_heads", heads, f"must divide hidden_size {hidden}")
    patch_h, patch_w = square(f, "patch_size")
    if patch_h != patch_w:
        raise f.refuse("patch_size", f.config["patch_size"], "only square patches are built")
    image = square(f, "image_size")
    grid_h, grid_w = image[0] // patch_h, image[1] // patch_w
    if grid_h != grid_w or grid_h < 1:
        raise f.refuse("image_size", f.config["image_size"],
                       f"transformers reads the position embeddings as a square grid; {grid_h} x {grid_w} patches is not one")
    swiglu = f.bool_("use_swiglu_ffn")
    width = int(hidden * f.float_("mlp_ratio"))
    if swiglu:  # Dinov2SwiGLUFFN: two thirds of the MLP width, rounded up to a multiple of 8
        width = (int(width * 2 / 3) + 7) // 8 * 8
    mask_token = with_registers or f.bool_("use_mask_token", True)
    return VisionSpec(
        family=f.family, layout="dinov2", hidden_size=hidden, num_layers=f.int_("num_hidden_layers"), num_heads=heads,
        intermediate_size=width, num_channels=f.int_("num_channels"), patch_size=patch_h, image_size=image,
        position_grid=grid_h, layer_norm_eps=f.float_("layer_norm_eps"), activation=f.choice("hidden_act", _ACTIVATIONS),
        qkv_bias=f.bool_("qkv_bias", True), swiglu=swiglu, num_register_tokens=registers, antialias=with_registers,
        ignored_tensors=(r"embeddings\.mask_token",),
        unread_tensors=(("embeddings.mask_token", (1, hidden)),) if mask_token else (),
    )


@encoder_family("dinov2", name="DINOv2", defaults=DINOV2_DEFAULTS, config_class="Dinov2Config", legacy=_BACKBONE_KEYS,
                transformers_version="5.24.0",
                tiny={"architectures": ["Dinov2Model"], **_TINY, "use_mask_token": True})
def read_dinov2(f: Fields) -> VisionSpec:
    return _read(f, False)


@encoder_family("dinov2_with_registers", name="DINOv2 with registers", defaults=DINOV2_WITH_REGISTERS_DEFAULTS,
                config_class="Dinov2WithRegistersConfig", legacy=_BACKBONE_KEYS, transformers_version="5.24.0",
                tiny={"architectures": ["Dinov2WithRegistersModel"], **_TINY, "num_register_tokens": 4})
def read_dinov2_with_registers(f: Fields) -> VisionSpec:
    return _read(f, True)
