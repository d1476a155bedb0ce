"""Configs read the way transformers reads them: both RoPE forms, every RoPE type transformers
defines (tables checked against an independent NumPy version of its formulas), the config
classes' defaults for missing fields, and typed refusals naming what is not built."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.hf_rope_numpy import inv_freq, rope_dicts
from rlx_mil.errors import UnsupportedConfigError
from rlx_mil.models import from_pretrained
from rlx_mil.models.families import model_spec, records
from rlx_mil.models.hf_config import DecoderSpec
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint
from rlx_mil.models.rope import RopeReader, rope_tables

HEAD_DIM = 16
BASE: dict[str, Any] = {**TINY_CONFIGS["llama"], "head_dim": HEAD_DIM, "max_position_embeddings": 4096}
BASE.pop("rope_parameters")

#: One config per RoPE type (legacy rope_scaling form), with the values that exercise each branch.
ROPES: dict[str, dict[str, Any]] = {
    "default": {},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 128},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
    "yarn_untruncated_mscale": {"rope_type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                                "mscale_all_dim": 0.707, "original_max_position_embeddings": 64, "truncate": False},
    "yarn_attention_factor": {"rope_type": "yarn", "factor": 2.0, "attention_factor": 0.8},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(8)],
                 "long_factor": [2.0 + 0.5 * i for i in range(8)]},
}


def config_with(rope: dict[str, Any], **extra: Any) -> dict[str, Any]:
    cfg = {**copy.deepcopy(BASE), "rope_theta": 5000.0, **extra}
    if rope:
        cfg["rope_scaling"] = copy.deepcopy(rope)
    return cfg


def as_rope_parameters(cfg: dict[str, Any]) -> dict[str, Any]:
    """The same config as transformers >= 5 writes it: one `rope_parameters` dict, no rope_theta."""
    out = copy.deepcopy(cfg)
    params = {"rope_type": "default", **(out.pop("rope_scaling", None) or {}), "rope_theta": out.pop("rope_theta")}
    if "partial_rotary_factor" in out:
        params["partial_rotary_factor"] = out.pop("partial_rotary_factor")
    if "type" in params:
        params["rope_type"] = params.pop("type")
    out["rope_parameters"] = params
    return out


def spec_of(cfg: dict[str, Any]) -> DecoderSpec:
    spec = model_spec(cfg)
    assert isinstance(spec, DecoderSpec)
    return spec


@pytest.mark.parametrize("partial", [1.0, 0.75])
@pytest.mark.parametrize("rows", [48, 300, 5000])
@pytest.mark.parametrize("name", list(ROPES))
def test_tables_match_the_transformers_formulas(name: str, rows: int, partial: float) -> None:
    rope = copy.deepcopy(ROPES[name])
    if partial != 1.0 and name == "longrope":  # one factor per rotated frequency
        rope["short_factor"], rope["long_factor"] = rope["short_factor"][:6], rope["long_factor"][:6]
    # 5000 rows exceed max_position_embeddings 4096: dynamic NTK rescales its base there.
    cfg = config_with(rope, partial_rotary_factor=partial)
    if name == "longrope":
        cfg["original_max_position_embeddings"] = 256  # top level, where Phi-3 writes it
    # Llama rotates whole heads: a partial factor is read as for the families that take one.
    reader = RopeReader(cfg, "config.json", "llama", partial=True)
    field, params = reader.parameters()
    spec_rope = reader.spec(params, field, head_dim=HEAD_DIM, default_theta=10000.0,
                            max_position_embeddings=cfg["max_position_embeddings"])
    if partial == 1.0:
        assert spec_rope == spec_of(cfg).rope
    cos, sin = rope_tables(spec_rope, HEAD_DIM, rows)
    inv, scale = inv_freq(rope_dicts(cfg), cfg, HEAD_DIM, rows)
    angles = np.arange(rows)[:, None] * inv[None, :]
    half = len(inv)
    assert spec_rope.rotary_dim == 2 * half == int(HEAD_DIM * partial)
    np.testing.assert_allclose(cos[:, :half], np.cos(angles) * scale, rtol=0, atol=2e-6 * max(scale, 1))
    np.testing.assert_allclose(sin[:, :half], np.sin(angles) * scale, rtol=0, atol=2e-6 * max(scale, 1))
    np.testing.assert_array_equal(cos[:, half:], 1.0)  # the pass-through columns: identity
    np.testing.assert_array_equal(sin[:, half:], 0.0)
    if name.startswith("yarn") or name == "longrope":
        assert scale != 1.0  # the attention factor is exercised


def test_longrope_switches_to_long_factors_beyond_the_original_length() -> None:
    cfg = config_with(ROPES["longrope"], original_max_position_embeddings=64)
    spec = spec_of(cfg)
    short, _ = rope_tables(spec.rope, HEAD_DIM, 64)
    long, _ = rope_tables(spec.rope, HEAD_DIM, 65)
    assert not np.allclose(short[1:64], long[1:64])
    inv, _ = inv_freq(rope_dicts(cfg), cfg, HEAD_DIM, 65)
    np.testing.assert_allclose(1.0 / inv, 5000.0 ** (np.arange(0, 16, 2) / 16) * ROPES["longrope"]["long_factor"][:8])


@pytest.mark.parametrize("name", ["default", "linear", "llama3", "yarn", "longrope"])
def test_rope_parameters_give_the_same_graph_as_rope_theta(name: str, tmp_path: Path) -> None:
    legacy = config_with(ROPES[name], rope_theta=1_000_000.0)
    modern = as_rope_parameters(legacy)
    assert "rope_theta" not in modern and "rope_scaling" not in modern
    assert spec_of(legacy) == spec_of(modern)
    folders = [write_random_checkpoint(tmp_path / form / "model", cfg, seed=0)
               for form, cfg in (("legacy", legacy), ("modern", modern))]
    (g1, p1), (g2, p2) = (from_pretrained(f, "decode", seq_len=2, cache_len=3) for f in folders)
    assert json.dumps(g1.to_json(), sort_keys=True) == json.dumps(g2.to_json(), sort_keys=True)
    for key in ("rope.cos", "rope.sin"):
        np.testing.assert_array_equal(p1[key], p2[key])


#: Every family with one RoPE dict (the per-layer-type ones, Gemma 3 and ModernBERT, have their
#: legacy forms tested with their families), with a scaled type where the family reads one.
FLAT_ROPE_FAMILIES = {
    "llama": ROPES["yarn"], "qwen2": ROPES["linear"], "qwen3": ROPES["llama3"], "mistral": ROPES["dynamic"],
    "gemma2": ROPES["linear"], "phi3": {"rope_type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0],
                                        "long_factor": [1.0, 2.0, 4.0, 8.0]},
    "phi4_mini": {}, "smollm3": ROPES["yarn"], "granite": ROPES["llama3"], "granitemoehybrid": ROPES["linear"],
    "qwen3_moe": ROPES["yarn"], "qwen2_moe": ROPES["linear"], "olmoe": ROPES["dynamic"], "lfm2": ROPES["linear"],
    "qwen3_5": ROPES["yarn"], "qwen3_5_text": ROPES["linear"],
}


@pytest.mark.parametrize("family", list(FLAT_ROPE_FAMILIES))
def test_every_family_reads_both_rope_forms_the_same(family: str) -> None:
    """Each family's config written both ways — transformers 5's `rope_parameters` and the < 5
    `rope_theta` + `partial_rotary_factor` + `rope_scaling` — gives one spec; another theta
    gives another."""
    cfg = copy.deepcopy(TINY_CONFIGS[family])
    text = cfg.get("text_config", cfg)
    given = {**(text.pop("rope_parameters", None) or {}), **(text.pop("rope_scaling", None) or {})}
    theta = given.pop("rope_theta", None) or text.pop("rope_theta", None) or 321_000.0
    partial = given.pop("partial_rotary_factor", None) or text.pop("partial_rotary_factor", None)
    for key in ("type", "mrope_section", "mrope_interleaved"):  # Phi-3's "type"; Qwen3.5's text-inert M-RoPE
        given.pop(key, None)
    scaling = copy.deepcopy(FLAT_ROPE_FAMILIES[family]) or {"rope_type": "longrope", **given}
    modern = copy.deepcopy(cfg)
    modern_text = modern.get("text_config", modern)
    modern_text["rope_parameters"] = {"rope_type": "default", **scaling, "rope_theta": theta,
                                      **({"partial_rotary_factor": partial} if partial else {})}
    legacy = copy.deepcopy(cfg)
    legacy_text = legacy.get("text_config", legacy)
    legacy_text["rope_theta"] = theta
    if partial:
        legacy_text["partial_rotary_factor"] = partial
    if scaling.get("rope_type", "default") != "default":
        legacy_text["rope_scaling"] = scaling
    want = model_spec(modern)
    assert model_spec(legacy) == want
    assert want.rope.theta == theta and want.rope.kind == scaling.get("rope_type", "default")  # type: ignore[attr-defined]
    legacy_text["rope_theta"] = theta * 2
    assert model_spec(legacy) != want


def test_theta_from_rope_parameters_is_honoured() -> None:
    """The hole this closes: a transformers-5 config with theta 1e6 built theta 1e4 tables."""
    cfg = as_rope_parameters(config_with({}, rope_theta=1_000_000.0))
    assert spec_of(cfg).rope.theta == 1_000_000.0
    cos, _ = rope_tables(spec_of(cfg).rope, HEAD_DIM, 8)
    np.testing.assert_allclose(cos[7, 1], np.cos(7 * 1_000_000.0 ** (-2 / 16)), rtol=1e-6)


def test_missing_fields_take_transformers_defaults() -> None:
    gemma2 = {k: v for k, v in TINY_CONFIGS["gemma2"].items()
              if k not in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "sliding_window")}
    spec = spec_of(gemma2)
    assert spec.score_scale == 256**-0.5 and spec.attn_softcap == 50.0 and spec.final_softcap == 30.0
    assert spec.layer_windows == (4096, None)
    qwen3 = {k: v for k, v in TINY_CONFIGS["qwen3"].items() if k != "head_dim"}
    assert spec_of(qwen3).head_dim == 128  # Qwen3Config's head_dim, not hidden / heads
    mistral = {k: v for k, v in TINY_CONFIGS["mistral"].items() if k != "sliding_window"}
    assert spec_of(mistral).layer_windows == (4096, 4096)
    assert spec_of({**TINY_CONFIGS["mistral"], "sliding_window": None}).layer_windows == (None, None)
    bare = spec_of({"model_type": "llama"})  # everything from LlamaConfig
    assert (bare.hidden_size, bare.num_layers, bare.num_kv_heads, bare.vocab_size, bare.rms_norm_eps) == (4096, 32, 32, 32000, 1e-6)


def test_every_family_records_its_defaults_and_their_source() -> None:
    for record in records().values():
        # the image encoders' tables were read from 5.24.0, the others' from 5.23.0
        assert record.defaults and record.config_class.endswith("Config") and record.transformers_version in ("5.23.0", "5.24.0")
        assert record.tiny["model_type"] == record.model_type
        model_spec(record.tiny)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ({"rope_scaling": {"rope_type": "ntk", "factor": 2.0}}, "rope_scaling.rope_type"),
        ({"rope_parameters": {"rope_type": "llama4", "rope_theta": 1e4}}, "rope_parameters.rope_type"),
        ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}},
         "rope_scaling.short_factor"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": -1.0}}, "rope_scaling.factor"),
        ({"rope_scaling": {"rope_type": "linear"}}, "factor"),
        ({"attention_chunk_size": 8}, "attention_chunk_size"),
        ({"no_rope_layers": [1, 0]}, "no_rope_layers"),
    ],
)
def test_unknown_rope_types_and_fields_are_typed_errors(edit: dict[str, Any], field: str) -> None:
    with pytest.raises(UnsupportedConfigError) as info:
        model_spec({**config_with({}), **edit})
    assert info.value.field == field
    assert field.rsplit(".", 1)[-1] in str(info.value)


@pytest.mark.parametrize(
    ("edit", "plain"),
    [
        # published Llama configs: a factor under type "default", which transformers' default RoPE ignores
        ({"rope_scaling": {"type": "default", "factor": 4.0}}, {}),
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4, "scale_positions": True}},
         {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}),
    ],
)
def test_rope_keys_transformers_leaves_unused_are_warned_of_and_unused(edit: dict[str, Any], plain: dict[str, Any]) -> None:
    from rlx_mil.errors import IgnoredConfigKeyWarning

    with pytest.warns(IgnoredConfigKeyWarning, match=r"are not keys of rope type .*unused"):
        spec = model_spec({**config_with({}), **edit})
    assert spec == model_spec({**config_with({}), **plain})


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen3", "gemma2", "gemma3_text", "smollm3", "granite",
                                    "olmoe", "lfm2", "modernbert"])
@pytest.mark.parametrize("where", ["top level", "rope_parameters"])
def test_a_partial_rotary_factor_is_refused_where_transformers_rotates_whole_heads(family: str, where: str) -> None:
    """transformers' Llama-like models apply RoPE to every head dimension: their default RoPE
    ignores `partial_rotary_factor`, the scaled types fail on it. Building a partial rotation
    would give other logits than transformers', so the factor is refused by name; 1.0 is read."""
    cfg = copy.deepcopy(TINY_CONFIGS[family])
    params = cfg.get("rope_parameters") or {}
    nested = "rope_type" not in params  # one dict per layer type (Gemma 3, ModernBERT)
    if where == "top level":
        if not nested:  # a field Gemma 3's and ModernBERT's configs never had: unknown
            cfg["partial_rotary_factor"] = 1.0
            model_spec(cfg)
        cfg["partial_rotary_factor"] = 0.5
        field = "partial_rotary_factor"
    else:
        for sub in params.values() if nested else [params]:
            sub["partial_rotary_factor"] = 0.5
        field = "rope_parameters." + (f"{next(iter(params))}." if nested else "") + "partial_rotary_factor"
    with pytest.raises(UnsupportedConfigError) as info:
        model_spec(cfg)
    if family in ("gemma3_text", "modernbert") and where == "top level":
        assert info.value.field == field  # not one of their config classes' fields
    else:
        assert info.value.field == field and "rotates every head dimension" in str(info.value)


@pytest.mark.parametrize("family", ["phi3", "qwen3_5_text"])
def test_partial_rotary_factor_is_read_where_transformers_applies_it(family: str) -> None:
    cfg = copy.deepcopy(TINY_CONFIGS[family])
    cfg["rope_parameters"]["partial_rotary_factor"] = 0.5
    spec = model_spec(cfg)
    assert spec.rope.rotary_dim == spec.head_dim // 2  # type: ignore[attr-defined]


def test_rope_parameters_per_layer_type() -> None:
    """transformers 5 may key rope_parameters by layer type: each layer gets its type's RoPE
    (one table pair per distinct RoPE), and equal per-type dicts give the flat form's graph."""
    from rlx_mil.models.pretrained import build

    base = {k: v for k, v in TINY_CONFIGS["gemma2"].items() if k != "rope_theta"}
    nested = {**base, "layer_types": ["sliding_attention", "full_attention"],
              "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    spec = spec_of(nested)
    assert [(r.kind, r.theta) for r in spec.layer_ropes if r is not None] == [("default", 1e4), ("linear", 1e6)]
    _, _, computed = build(spec, seq_len=4)
    assert set(computed) == {"rope.cos", "rope.sin", "rope_1.cos", "rope_1.sin"}
    same = {**nested, "rope_parameters": {kind: {"rope_type": "default", "rope_theta": 1e4}
                                          for kind in ("full_attention", "sliding_attention")}}
    flat = {**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
    (g1, _, c1), (g2, _, c2) = (build(spec_of(cfg), seq_len=4) for cfg in (same, flat))
    assert json.dumps(g1.to_json()) == json.dumps(g2.to_json())
    assert set(c1) == set(c2) == {"rope.cos", "rope.sin"}
    with pytest.raises(UnsupportedConfigError, match="sliding_attention"):
        spec_of({**nested, "rope_parameters": {"full_attention": {"rope_type": "default"}}})


def test_gemma2_without_its_scalars_matches_the_transformers_defaults(tmp_path: Path) -> None:
    """The hole this closes: a Gemma 2 config without query_pre_attn_scalar, the soft-caps and
    sliding_window built logits off by up to 3.3; now they are Gemma2Config's (the forward's)."""
    from models.hf_numpy import gemma2_forward
    from rlx_mil import reference
    from rlx_mil.models.checkpoint import Checkpoint

    dropped = ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "sliding_window")
    cfg = {k: v for k, v in TINY_CONFIGS["gemma2"].items() if k not in dropped}
    folder = write_random_checkpoint(tmp_path / "gemma2", cfg, seed=2)
    ids = np.random.default_rng(4).integers(0, cfg["vocab_size"], (1, 8)).astype(np.int32)
    graph, params = from_pretrained(folder, seq_len=8)
    got = reference.evaluate(graph, {"input_ids": ids}, params)["logits"]
    want, _ = gemma2_forward(Checkpoint(folder), cfg, ids)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())
    old, _ = gemma2_forward(Checkpoint(folder), {**cfg, "query_pre_attn_scalar": 16, "attn_logit_softcapping": None,
                                                 "final_logit_softcapping": None}, ids)
    assert np.abs(old - want).max() > 1e-2 * np.abs(want).max()  # the defaults matter
