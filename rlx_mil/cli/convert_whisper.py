"""`rlx-mil convert-hf WHISPER_DIR -o OUT_DIR`: a Whisper checkpoint (Hugging Face or
CTranslate2 layout) -> the WhisperKit folder `OUT_DIR/openai_whisper-<variant>/`
(`rlx_mil.speech.packages`)."""

from __future__ import annotations

import argparse
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import InvalidOptionError
from rlx_mil.ir import Graph
from rlx_mil.progress import Progress, running_under_ci
from rlx_mil.units import counted, human_bytes

#: The stateful decoder's relative logit error allowed by --verify (its cache state is fp16).
STATEFUL_TOLERANCE = 5e-2


def is_whisper_folder(path: Path) -> bool:
    """A folder whose config.json says `model_type: whisper`, or a CTranslate2 WhisperSpec `model.bin`."""
    import json

    try:
        binary = path / "model.bin"
        if binary.is_file():
            with open(binary, "rb") as f:
                head = f.read(64)
            if len(head) >= 6 and struct.unpack("<I", head[:4])[0] <= 6:
                length = struct.unpack("<H", head[4:6])[0]
                if head[6:6 + length].rstrip(b"\0") == b"WhisperSpec":
                    return True
        config = path / "config.json"
        if config.is_file() and config.stat().st_size < 2**20:
            data = json.loads(config.read_text(encoding="utf-8"))
            return isinstance(data, dict) and data.get("model_type") == "whisper"
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return False


#: convert-hf flags that shape an LLM, encoder or vision graph, its description or its quality
#: report, with the value each has when not given: a Whisper folder refuses them by name.
_NOT_FOR_WHISPER = {
    "--variant": ("variant", "prefill"), "--seq-len": ("seq_len", None), "--kv-outputs": ("kv_outputs", False),
    "--last-logits": ("last_logits", False), "--position-ids": ("position_ids", False),
    "--prefill": ("prefill", None), "--chunk-bytes": ("chunk_bytes", None), "--save-graph": ("save_graph", None),
    "--compress-check": ("compress_check", None), "--max-context": ("max_context", None),
    "--all-logits": ("all_logits", False), "--cache-layout": ("cache_layout", None),
    "--batch-size": ("batch_size", 1), "--max-positions": ("max_positions", None),
    "--attention-mask": ("attention_mask", False), "--pooling": ("pooling", "auto"),
    "--normalize/--no-normalize": ("normalize", None), "--token-type-ids": ("token_type_ids", False),
    "--image-size": ("image_size", None), "--spatial-shape": ("spatial_shape", None),
    "--author": ("author", None), "--license": ("license", None), "--description": ("description", None),
    "--model-version": ("model_version", None), "--no-split-logits": ("split_logits", True),
}


def _refuse_llm_flags(args: argparse.Namespace) -> None:
    given = [flag + (f" {value}" if flag == "--variant" else "") for flag, (key, default) in _NOT_FOR_WHISPER.items()
             if (value := getattr(args, key, default)) != default and value is not None]
    if given:
        raise InvalidOptionError(f"not for a Whisper folder: {', '.join(given)} (it writes WhisperKit's three packages;"
                                 " --cache-len sets the TextDecoder's cache slots)")


def check_options(args: argparse.Namespace) -> None:
    """Every option check of a Whisper conversion, before any file is read: flags that do not
    apply, --attention, the quality targets (warned about without --compress) and a --compress
    scheme the --target has no op for (naming both); convert-hf checks --stateful's target."""
    from rlx_mil.cli.quality import check_report_path, warn_unused_targets

    _refuse_llm_flags(args)
    if getattr(args, "attention", "auto") != "auto":
        raise InvalidOptionError("--attention does not apply to a Whisper folder")
    check_report_path(args)  # and the quality targets
    warn_unused_targets(args, compressed=getattr(args, "compress", None) is not None)
    if getattr(args, "compress", None) is not None:
        _check_compress_target(args)


def _check_compress_target(args: argparse.Namespace) -> None:
    """A fixed --compress scheme the --target has no constexpr op for (4-bit linear codes on
    iOS17...), refused up front as `convert` would refuse it for every weight."""
    from rlx_mil.compress import parse_compress
    from rlx_mil.compress.emit import check_target
    from rlx_mil.compress.fit import fit_to_shape
    from rlx_mil.compress.schemes import Scheme
    from rlx_mil.coreml.deploy import DeployForm
    from rlx_mil.coreml.deploy.compression import four_bit_text
    from rlx_mil.errors import CompressionError
    from rlx_mil.lowering.target import Target

    config = parse_compress(four_bit_text(args.compress, DeployForm.parse(getattr(args, "deploy", None) or "plain")))
    if config is None or config.auto is not None or not isinstance(config.default, Scheme):
        return
    target = Target.parse(args.target)
    try:
        check_target(fit_to_shape(config.default, (1024, 1024), target)[0], target, "*")
    except CompressionError as err:
        reason = str(err).replace("weight '*': ", "", 1)
        raise InvalidOptionError(f"--compress {args.compress} with --target {target.label}: {reason}") from None


def verify_inputs(role: str, graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Example inputs of one WhisperKit graph: speech-like audio, a log-mel-sized spectrogram,
    and the decoder's first step with an empty cache."""
    from rlx_mil.ir import Input

    rng = np.random.default_rng(seed)
    shapes = {n.op.name: n.shape.sizes() for n in graph if isinstance(n.op, Input)}
    if role == "MelSpectrogram":
        t = np.arange(shapes["audio"][0]) / 16_000
        return {"audio": (0.3 * np.sin(2 * np.pi * 220 * t) + 0.02 * rng.standard_normal(t.size)).astype(np.float32)}
    if role == "AudioEncoder":
        return {"melspectrogram_features": rng.uniform(-1.0, 1.5, shapes["melspectrogram_features"]).astype(np.float32)}
    slots = shapes["key_cache"][-1]
    feeds: dict[str, np.ndarray] = {
        "input_ids": np.array([1], np.int32), "cache_length": np.array([1], np.int32),
        "key_cache": rng.standard_normal(shapes["key_cache"]).astype(np.float32),
        "value_cache": rng.standard_normal(shapes["value_cache"]).astype(np.float32),
        "kv_cache_update_mask": np.zeros((1, slots), np.int32),
        "encoder_output_embeds": rng.standard_normal(shapes["encoder_output_embeds"]).astype(np.float32),
        "decoder_key_padding_mask": np.full((1, slots), -1e4, np.float32),
    }
    feeds["kv_cache_update_mask"][0, 1] = 1
    feeds["decoder_key_padding_mask"][0, :2] = 0
    return feeds


def run_whisper(args: argparse.Namespace, convert: Mapping[str, Any]) -> int:
    """Write the WhisperKit folder (and with --stateful rlx_mil's stateful decoder beside it);
    `check_options(args)` has passed."""
    from rlx_mil.coreml.package_info import package_info
    from rlx_mil.models.verify import verify_package
    from rlx_mil.speech.packages import convert_whisper

    progress = Progress(enabled=not (args.quiet or running_under_ci()))
    checks: list[Any] = []

    def verify(role: str, graph: Graph, params: Mapping[str, Any], path: Path) -> None:
        if role != "MelSpectrogram" and convert.get("compress"):  # fidelity: what the package's codes decode to
            from rlx_mil.compress import report_of
            from rlx_mil.models.verify import package_weights

            params = package_weights(params, path, report_of(package_info(path).metadata))
        # compressed: what is checked here is fidelity; quality is judged after the folder is written
        fidelity = " fidelity (the package vs the weights it stores):" if convert.get("compress") else ""
        for check in verify_package(graph, params, path, verify_inputs(role, graph), convert["precision"]):
            print(f"{role}:{fidelity} {check.to_text()}")
            checks.append(check)

    start = time.perf_counter()
    written = convert_whisper(
        args.model_dir, args.output, precision=convert["precision"], target=convert["target"],
        compress=convert.get("compress"), deploy=convert.get("deploy", "plain"),
        cache_len=args.cache_len, stateful=bool(args.stateful),
        overwrite=args.overwrite, progress=progress, on_graph=verify if args.verify else None,
        calibration=[args.speech_calibration] if getattr(args, "speech_calibration", None) else None,
        quality_check=True if args.verify else None,
    )
    stateful_ok = True
    if args.verify and args.stateful:
        # the cache state is fp16 whatever the precision; a compressed decoder against the weights it stores
        error, agree = verify_stateful(args.model_dir, written.folder, convert["precision"])
        stateful_ok = agree and error <= STATEFUL_TOLERANCE
        weights = " (fidelity: on the weights the package stores)" if convert.get("compress") else ""
        print(f"TextDecoderStateful: 4 tokens against the reference decoder{weights}: max |logit error| {error:.3g} of"
              f" the largest logit, argmax {'agrees' if agree else 'differs'}: {'ok' if stateful_ok else 'FAIL'}")
    total = 0
    for role, path in written.packages.items():
        info = package_info(path)
        total += info.package_bytes
        print(f"  {role}: {counted(info.num_ops, 'op')}, {human_bytes(info.package_bytes)}")
    print(f"wrote {written.folder} ({human_bytes(total)}) in {time.perf_counter() - start:.1f} s")
    qualities = [] if written.quality is None else written.quality.checks
    for quality in qualities:
        print(quality.summary())
    write_folder_report(args, written)
    fidelity_ok = stateful_ok and all(c.ok for c in checks)
    if not args.verify:
        return 0
    from rlx_mil.cli.quality import verify_quality

    failed = [verify_quality(args, q, "the packages as saved vs the float checkpoint, on speech") for q in qualities]
    return 0 if fidelity_ok and not any(failed) else 1


def write_folder_report(args: argparse.Namespace, written: Any) -> None:
    """--report FILE: each compressed package's compression report (by role) and the folder's
    quality check (with each audio file's transcript and numbers) as JSON."""
    import json
    from dataclasses import asdict

    path = getattr(args, "report", None)
    if path is None:
        return
    from rlx_mil.fileio import atomic_output_file

    compression = {}
    for role, report in written.reports.items():
        compression[role] = asdict(report)
        compression[role].pop("quality", None)
    result = written.quality
    body = {"compression": compression or None, "quality": None if result is None else result.check.to_dict(),
            "files": [] if result is None else [vars(f) for f in result.files]}
    if result is not None and result.stateful is not None:
        body["stateful_quality"] = result.stateful.to_dict()
    with atomic_output_file(Path(path), overwrite=True, what="report") as stream:
        stream.write((json.dumps(body, indent=1, allow_nan=False) + "\n").encode())
    print(f"wrote the compression report to {path}")


def verify_stateful(checkpoint_dir: Path, folder: Path, precision: str, steps: int = 4, seed: int = 0) -> tuple[float, bool]:
    """`--verify` of the stateful decoder: `steps` tokens through it (the executor) against the
    reference semantics of WhisperKit's one-token decoder graph, fed the same tokens and a
    random encoder output. Returns (max |logit error| relative to the largest logit, whether
    every step's argmax agrees, near-ties within twice that error counted as agreeing). A
    compressed decoder's reference computes with the weights its package stores."""
    from rlx_mil import reference
    from rlx_mil.models.whisper import build_text_decoder
    from rlx_mil.models.whisper_checkpoint import ParamsOf, open_whisper
    from rlx_mil.speech.packages import STATEFUL_DECODER, feeds_for_step
    from rlx_mil.speech.runner import PackagedWhisper

    checkpoint = open_whisper(checkpoint_dir)
    spec = checkpoint.spec
    rng = np.random.default_rng(seed)
    encoded = rng.standard_normal((spec.n_audio_ctx, spec.d_model)).astype(np.float32)
    tokens = [spec.decoder_start_token_id, *rng.integers(0, spec.vocab_size, steps - 1).tolist()]
    got = PackagedWhisper(folder, stateful=True).decoder(encoded).step(tokens)
    graph, names = build_text_decoder(spec, steps)
    params: Mapping[str, Any] = ParamsOf(checkpoint.params, names)
    package = folder / f"{STATEFUL_DECODER}.mlpackage"
    from rlx_mil.compress import report_of
    from rlx_mil.coreml.package_info import package_info
    from rlx_mil.models.verify import package_weights

    params = package_weights(params, package, report_of(package_info(package).metadata))
    keys = np.zeros((1, spec.kv_width, 1, steps), np.float32)
    values = keys.copy()
    channels_first = np.ascontiguousarray(encoded.T.reshape(1, spec.d_model, 1, spec.n_audio_ctx))
    want = []
    for i, token in enumerate(tokens):
        out = reference.evaluate(graph, feeds_for_step(spec.kv_width, spec.d_model, steps, token, i, keys, values,
                                                       channels_first), params)
        keys[..., i] = out["key_cache_updates"][..., 0]
        values[..., i] = out["value_cache_updates"][..., 0]
        want.append(out["logits"].reshape(-1))
    expected = np.stack(want)
    gap = float(np.abs(got - expected).max())
    error = gap / max(float(np.abs(expected).max()), 1e-6)
    # a step agrees when the package's pick is the reference's, or within twice the logit error
    # of the reference's best (a near-tie that the fp16 cache may decide either way)
    picked = expected[np.arange(len(tokens)), got.argmax(-1)]
    return error, bool(np.all(picked >= expected.max(-1) - 2 * gap))
