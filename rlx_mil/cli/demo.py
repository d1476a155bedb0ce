"""`rlx-mil demo`: a tiny random checkpoint in the Hugging Face layout, converted the way
`rlx-mil convert-hf` converts one, then checked through the NumPy MIL executor."""

from __future__ import annotations

import argparse
import copy
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from rlx_mil.models.families import family
from rlx_mil.models.random_checkpoint import ROUND2_FAMILIES, TINY_CONFIGS, resized_round2_config
from rlx_mil.units import counted

DEMO_FAMILIES = tuple(TINY_CONFIGS)
#: The encoders among them, text and image (no KV heads, no decode variant).
ENCODER_FAMILIES = frozenset(k for k, v in TINY_CONFIGS.items() if family(v["model_type"]).kind == "encoder")


def demo_config(args: argparse.Namespace) -> dict[str, Any]:
    """The tiny config of `args.family` with the demo's sizes."""
    from rlx_mil.models.transformer import DecoderConfig

    # Same size rules (and messages) as the example decoder; checked before anything is written.
    DecoderConfig(hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads, intermediate=2 * args.hidden,
                  layers=args.layers, seq=args.seq)
    if args.family in ROUND2_FAMILIES:
        return resized_round2_config(args.family, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                                     layers=args.layers, vocab=256, max_positions=max(256, args.seq))
    whole = copy.deepcopy(TINY_CONFIGS[args.family])
    if _is_image_encoder(whole):
        return _image_encoder_config(whole, args)
    # A vision-language folder (gemma3) sizes its text decoder.
    config = whole["text_config"] if isinstance(whole.get("text_config"), dict) else whole
    config.update(hidden_size=args.hidden, num_attention_heads=args.heads, intermediate_size=2 * args.hidden,
                  num_hidden_layers=args.layers, vocab_size=256)
    if config.get("model_type") in ENCODER_FAMILIES:
        # RoBERTa's positions start after padding_idx: its table holds pad_token_id + 1 more rows.
        offset = config["pad_token_id"] + 1 if config["model_type"] in ("roberta", "xlm-roberta") else 0
        config["max_position_embeddings"] = max(64, args.seq) + offset
    else:
        config.update(num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
                      max_position_embeddings=max(256, args.seq))
    if "query_pre_attn_scalar" in config:
        config["query_pre_attn_scalar"] = args.hidden // args.heads
    _resized_lists(config, args.layers, args.hidden // args.heads)
    return whole


def _is_image_encoder(config: dict[str, Any]) -> bool:
    from rlx_mil.models.families import model_spec
    from rlx_mil.models.hf_config import VisionSpec

    return isinstance(model_spec(config), VisionSpec)


def _image_encoder_config(whole: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """An image encoder's tiny config with the demo's width, heads and layers (its image or
    patch count stays the tiny one's: --seq does not apply)."""
    config = whole["vision_config"] if isinstance(whole.get("vision_config"), dict) else whole
    config.update(hidden_size=args.hidden, num_attention_heads=args.heads, num_hidden_layers=args.layers)
    if "intermediate_size" in config:
        config["intermediate_size"] = 2 * args.hidden
    if isinstance(whole.get("text_config"), dict):  # the dual encoder's text tower, not converted
        whole["text_config"].update(hidden_size=args.hidden, num_attention_heads=args.heads, projection_size=args.hidden)
    for key in ("out_features", "out_indices", "stage_names"):  # DINOv2's backbone stages follow the layers
        config.pop(key, None)
    return whole


def _resized_lists(config: dict[str, Any], layers: int, head_dim: int) -> dict[str, Any]:
    """Per-layer lists repeated to `layers` entries, longrope factors spread over the rotated
    frequencies of `head_dim`."""
    for key in ("layer_types", "no_rope_layers"):
        if isinstance(config.get(key), list):
            config[key] = [config[key][i % len(config[key])] for i in range(layers)]
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict) and "short_factor" in scaling:
        half = int(head_dim * config.get("partial_rotary_factor", 1.0)) // 2
        for key in ("short_factor", "long_factor"):
            old = scaling[key]
            scaling[key] = [old[min(len(old) - 1, i * len(old) // half)] for i in range(half)]
    return config


def run_demo(args: argparse.Namespace) -> int:
    from rlx_mil.coreml.package_info import package_info
    from rlx_mil.llm.convert_hf import convert_checkpoint
    from rlx_mil.models.random_checkpoint import write_random_checkpoint
    from rlx_mil.models.verify import example_inputs, verify_package
    from rlx_mil.progress import Progress, running_under_ci

    config = demo_config(args)
    keep = args.checkpoint is not None
    folder = Path(args.checkpoint) if keep else Path(tempfile.mkdtemp(prefix="rlx_mil_demo_")) / f"tiny-{args.family}"
    progress = Progress(enabled=not (args.quiet or running_under_ci()))
    try:
        t0 = time.perf_counter()
        write_random_checkpoint(folder, config, seed=0)
        image = _is_image_encoder(config)
        # Qwen3.5 nests the decoder's config, SigLIP its vision tower's
        text = config.get("vision_config" if image else "text_config", config)
        # A temporary checkpoint is deleted when the demo ends: name where it went only when kept.
        where = f"written to {folder}" if keep else "written (a temporary folder; --checkpoint DIR keeps it)"
        print(f"rlx-mil demo: random {args.family} checkpoint ({counted(text['num_hidden_layers'], 'layer')}, hidden "
              f"{text['hidden_size']}, {counted(text['num_attention_heads'], 'head')}) {where} "
              f"in {time.perf_counter() - t0:.2f} s")
        t1 = time.perf_counter()
        graph, params, path = convert_checkpoint(
            folder, args.output, build={} if image else {"seq_len": args.seq}, progress=progress, overwrite=True,
            convert={"target": args.target, "precision": args.precision, "attention": args.attention},
        )
        try:
            print(f"  graph:   {len(graph)} IR nodes; converted and saved in {time.perf_counter() - t1:.2f} s "
                  f"[{args.target}, {args.precision}]")
            print(package_info(path).to_text())
            if args.verify:
                vocab = int(text.get("vocab_size", 1))
                t2 = time.perf_counter()
                checks = verify_package(graph, params, path, example_inputs(graph, vocab, seed=1), args.precision)
                print(f"  executor ran the saved package in {time.perf_counter() - t2:.2f} s")
                for check in checks:
                    print(check.to_text())
                if not all(c.ok for c in checks):
                    return 1
        except KeyboardInterrupt:
            # Ctrl-C before the demo has shown the package checked: it is not left behind.
            shutil.rmtree(path, ignore_errors=True)
            raise
    finally:
        if not keep:
            shutil.rmtree(folder.parent, ignore_errors=True)
    return 0
