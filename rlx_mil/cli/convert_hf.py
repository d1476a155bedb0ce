"""`rlx-mil convert-hf`: a Hugging Face checkpoint folder -> a verified `.mlpackage`.

The command's options come in two groups, each turned into keyword arguments by one
function: `build_kwargs` (how `from_pretrained` builds the graph) and `convert_kwargs` (how
`rlx_mil.convert` lowers it). A new flag is one `add_argument` in `add_arguments` plus one
entry in the matching function.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlx_mil.cli.aimodel_output import add_format_argument
from rlx_mil.cli.arguments import int_at_least
from rlx_mil.cli.quality import print_compression  # the commands' shared summary line
from rlx_mil.errors import InvalidOptionError
from rlx_mil.progress import Progress, detail, running_under_ci
from rlx_mil.units import counted, human_bytes

if TYPE_CHECKING:  # the command's heavy parts load when it runs, never while parsing flags
    import numpy as np

    from rlx_mil.ir import Graph

#: `rlx_mil.llm.convert_hf.VARIANTS` (tests/test_cli.py checks that they agree).
VARIANTS = ("prefill", "decode")


def check_output(path: Path, overwrite: bool) -> None:
    from rlx_mil.llm.convert_hf import check_output as check

    check(path, overwrite)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The convert-hf flags (besides the shared --target/--precision/... conversion flags)."""
    # str, not Path: Path("./org/model") drops the "./" that says a missing folder is no Hub id
    p.add_argument("model_dir", help="checkpoint folder (config.json + model.safetensors or shards), or a"
                   " Hugging Face Hub id such as Qwen/Qwen3-0.6B[@REVISION], downloaded into the Hub's cache")
    add_decoder_arguments(p)
    p.add_argument("--pooling", default="auto", choices=["auto", "mean", "cls", "none"],
                   help="encoders: sentence embedding pooling (auto: the sentence-transformers config, else"
                        " ModernBERT's classifier_pooling)")
    p.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                   help="encoders: L2-normalise the pooled embedding (default: the sentence-transformers config)")
    p.add_argument("--token-type-ids", action="store_true", help="encoders: take token_type_ids as an input")
    p.add_argument("--image-size", type=_size_pair, metavar="N or HxW",
                   help="DINOv2 / SigLIP: the image size in pixels (default: the trained size; others resize the"
                        " position embeddings as transformers does)")
    p.add_argument("--spatial-shape", type=_size_pair, metavar="ROWSxCOLS",
                   help="SigLIP2: one patch grid for every image (default: each image's, the spatial_shapes input)")
    p.add_argument("--save-graph", type=Path, metavar="GRAPH_JSON", help="also write the RLX graph as JSON")
    p.add_argument("--verify", action="store_true",
                   help="run the package through the NumPy MIL executor (--engine coreai: Apple's runtime) and compare"
                        " with the reference; a compressed package is also judged against the original model and"
                        " fails below the quality thresholds unless --allow-quality-loss")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output (also off when CI is set)")
    p.add_argument("--author", help="Core ML model author (default: the model card's, or the owner in config.json's"
                   " _name_or_path)")
    p.add_argument("--license", help="Core ML model license (default: the model card's)")
    p.add_argument("--description", help="Core ML short description (default: the model's name and architecture)")
    p.add_argument("--model-version", metavar="VERSION", help="Core ML model version string (default: the model card's)")
    add_stateful_arguments(p)


def add_decoder_arguments(p: argparse.ArgumentParser) -> None:
    """The output and decoder-graph flags convert-hf and convert-gguf share."""
    p.add_argument("-o", "--output", type=Path, required=True,
                   help="output .mlpackage (or .aimodel) path (a folder with --chunk-bytes)")
    add_format_argument(p)
    p.add_argument("--overwrite", action="store_true", help="replace an existing package")
    p.add_argument("--variant", default="prefill", choices=VARIANTS,
                   help="decoders: prefill (S tokens, causal) or decode (new tokens against a KV cache)")
    p.add_argument("--seq-len", type=int_at_least(1), help="tokens per call (prefill default 128, decode default 1)")
    p.add_argument("--cache-len", type=int_at_least(0), help="decode: past positions held in the KV cache")
    p.add_argument("--batch-size", type=int_at_least(1), default=1, help="sequences per call of the one graph written (shapes a --graph-only graph; default 1)")
    p.add_argument("--last-logits", action="store_true", help="output the last position's logits only")
    p.add_argument("--kv-outputs", action="store_true", help="prefill: also output every layer's K/V")
    p.add_argument("--position-ids", action="store_true", help="prefill: take position_ids as an input")
    p.add_argument("--max-positions", type=int, help="rows of the RoPE tables (default: just enough)")
    p.add_argument("--attention-mask", action="store_true",
                   help="decode with --seq-len 1: take a key-padding attention_mask over the cache and the new token")


def _size_pair(text: str) -> int | tuple[int, int]:
    """`N` or `HxW` (positive integers)."""
    parts = text.lower().split("x")
    if len(parts) in (1, 2) and all(p.strip().isdigit() and int(p) > 0 for p in parts):
        return int(parts[0]) if len(parts) == 1 else (int(parts[0]), int(parts[1]))
    raise argparse.ArgumentTypeError(f"expected N or HxW with positive integers, got {text!r}")


def build_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """`from_pretrained` keyword arguments from the parsed flags."""
    vision = {k: v for k in ("image_size", "spatial_shape") if (v := getattr(args, k, None)) is not None}
    return {**vision,
        "variant": args.variant, "seq_len": args.seq_len, "cache_len": args.cache_len,
        "batch_size": args.batch_size, "last_logits": args.last_logits, "kv_outputs": args.kv_outputs,
        "position_ids": args.position_ids, "max_positions": args.max_positions, "attention_mask": args.attention_mask,
        "pooling": None if args.pooling == "none" else args.pooling, "normalize": args.normalize,
        "token_type_ids": args.token_type_ids,
    }


def convert_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """`rlx_mil.convert` keyword arguments from the parsed flags."""
    options = {"target": args.target, "precision": args.precision, "attention": args.attention,
               "compress": compress_option(args)}
    if getattr(args, "deploy", None) is not None:
        options["deploy"] = args.deploy
        options["split_logits"] = getattr(args, "split_logits", True)
    return options


def compress_option(args: argparse.Namespace) -> Any:
    """`convert(compress=...)` from --compress, --compress-budget, --max-error and
    --compress-calibration (a `CompressionConfig` when calibration inputs are given)."""
    spec = getattr(args, "compress", None)
    budget, max_error = getattr(args, "compress_budget", None), getattr(args, "max_error", None)
    calibration = getattr(args, "compress_calibration", None)
    if spec is None:
        if budget is not None or max_error is not None or calibration is not None:
            raise InvalidOptionError("--compress-budget, --max-error and --compress-calibration need --compress")
        return None
    if not spec.strip():
        raise InvalidOptionError("--compress needs a scheme (int8, int4, lut4, 4bit, auto4, ...; docs/compression.md)")
    from rlx_mil.coreml.deploy import DeployForm
    from rlx_mil.coreml.deploy.compression import four_bit_text

    spec = four_bit_text(spec, DeployForm.parse(getattr(args, "deploy", None) or "plain"))
    if budget is not None:
        spec += f";budget={budget!r}"
    if max_error is not None:
        spec += f";max_error={max_error!r}"
    import dataclasses

    from rlx_mil.compress import parse_compress

    try:
        config = parse_compress(spec)
    except InvalidOptionError as err:  # the spec's own words, under the flag that gave them
        raise InvalidOptionError(f"--compress: {err}") from None
    assert config is not None
    if calibration is not None and not (hasattr(args, "requantize") and Path(calibration).suffix.lower() == ".txt"):
        config = dataclasses.replace(config, calibration=calibration_inputs(calibration, args))  # GGUF text: its tokenizer
    elif (config.auto is not None or config.fit not in (None, "off")) and getattr(args, "model_dir", None) is not None:
        # autoN measures (and fit= fits codes) on text: the built-in calibration text through the plain graph.
        from rlx_mil.coreml.deploy.compression import form_compression
        from rlx_mil.llm.calibration import with_builtin_calibration

        formed = form_compression(config, DeployForm.parse(getattr(args, "deploy", None) or "plain"))
        config = with_builtin_calibration(config, formed, args.model_dir)
    from rlx_mil.cli.quality import quality_targets

    return dataclasses.replace(config, **quality_check_option(args), **quality_targets(args))


def quality_check_option(args: argparse.Namespace) -> dict[str, Any]:
    """How the conversion checks its quality: a stateful package or a GGUF file is checked by
    the command after converting (`rlx_mil.cli.quality.measure_stateful`); a checkpoint with a
    tokenizer on the --compress-calibration text or the built-in one; else on generated inputs."""
    if getattr(args, "stateful", False) or hasattr(args, "requantize"):
        return {"final_check": False}
    model_dir = getattr(args, "model_dir", None)
    if model_dir is None:
        return {}
    from rlx_mil.cli.quality import check_inputs_of

    found = check_inputs_of(Path(model_dir), args, getattr(args, "seq_len", None) or 128)
    return {} if found is None else {"check_inputs": found[0], "check_label": found[1]}


def calibration_inputs(path: Path, args: argparse.Namespace) -> dict[str, np.ndarray]:
    """Calibration inputs: the arrays of an .npz, or a text file tokenized with the checkpoint's
    tokenizer (convert-hf) into `--seq-len` tokens (repeated when the text is shorter)."""
    if Path(path).suffix.lower() != ".txt":
        from rlx_mil.weights import open_arrays

        with open_arrays(path, "calibration file") as archive:
            return dict(archive.items())
    model_dir = getattr(args, "model_dir", None)
    if model_dir is None:
        raise InvalidOptionError("--compress-calibration TEXT needs a checkpoint's tokenizer (convert-hf); convert takes an .npz")
    from rlx_mil.llm.text import TextTokenizer

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InvalidOptionError(f"--compress-calibration: cannot read {str(path)!r} ({err})") from None
    ids = TextTokenizer(model_dir).encode(text)
    if not ids:
        raise InvalidOptionError(f"--compress-calibration: {str(path)!r} gives no tokens")
    length = getattr(args, "seq_len", None) or 128
    import numpy as np

    row = np.resize(np.asarray(ids, np.int32), length)[None, :]
    return {"input_ids": row, "attention_mask": np.ones_like(row), "token_type_ids": np.zeros_like(row)}


def description_overrides(args: argparse.Namespace) -> dict[str, str | None]:
    """The Core ML model-description fields given on the command line."""
    return {"author": getattr(args, "author", None), "license": getattr(args, "license", None),
            "short_description": getattr(args, "description", None), "version": getattr(args, "model_version", None)}


def compress_check_inputs(args: argparse.Namespace) -> dict[str, np.ndarray] | None:
    """The --compress-check inputs (read before converting, so a bad file fails early)."""
    path = getattr(args, "compress_check", None)
    if path is None:
        return None
    if not getattr(args, "compress", None):
        raise InvalidOptionError("--compress-check needs --compress")
    from rlx_mil.weights import open_arrays

    with open_arrays(path, "inputs file") as archive:
        return dict(archive.items())


def run(args: argparse.Namespace) -> int:
    """The convert-hf command."""
    from rlx_mil.cli.arguments import announce

    announce(args, f"converting {args.model_dir} to {args.output}")
    from rlx_mil.cli.convert_whisper import is_whisper_folder
    from rlx_mil.cli.hub import resolve_checkpoint
    from rlx_mil.cli.quality import (
        check_report_path,
        print_summary,
        stored_check,
        verify_quality,
        write_report,
    )
    from rlx_mil.coreml.package_info import package_info
    from rlx_mil.llm.convert_hf import convert_checkpoint
    from rlx_mil.models import verify

    # a Whisper folder's -o is the folder the openai_whisper-<variant> folder goes into: it may exist
    if is_whisper_folder(Path(args.model_dir)):
        args.model_dir = Path(args.model_dir)
        _check_whisper_options(args)  # before the calibration or any weight is read
        return _run_whisper(args)
    _refuse_existing_output(args)  # before any download
    resolve_checkpoint(args, "model_dir")
    if is_whisper_folder(Path(args.model_dir)):
        _check_whisper_options(args)
        return _run_whisper(args)
    decoder, positions = decoder_positions(args.model_dir)
    stateful = choose_stateful(args, decoder)
    args.stateful = stateful  # what the conversion options (the quality check's place) follow
    check_inputs = compress_check_inputs(args)
    check_report_path(args)
    if stateful:
        if check_inputs is not None:
            raise InvalidOptionError(
                "--compress-check takes inputs of one stateless call; add --graph-only, or for the stateful package compare the"
                " compressed and uncompressed packages with `rlx-mil eval PACKAGE --text FILE --reference MODEL_DIR`"
            )
        return run_stateful(args, convert_kwargs(args), max_context_option(args, positions))
    progress = Progress(enabled=not (args.quiet or running_under_ci()))
    start = time.perf_counter()
    graph, params, path = convert_checkpoint(
        args.model_dir, args.output, build=build_kwargs(args), convert=convert_kwargs(args),
        progress=progress, overwrite=args.overwrite, save_graph=args.save_graph,
        description=description_overrides(args), check_inputs=check_inputs,
    )
    info = package_info(path)
    print(f"wrote {path} ({counted(info.num_ops, 'op')}, {human_bytes(info.package_bytes)}) in"
          f" {time.perf_counter() - start:.1f} s")
    print_compression(info.metadata)
    quality = stored_check(info.metadata)
    print_summary(quality)
    write_report(args, info.metadata, quality)
    if args.verify:
        vocab = _vocab_size(graph) if _takes_tokens(graph) else 1
        from rlx_mil.compress import report_of

        report = report_of(info.metadata)  # compressed: the reference computes with what its codes decode to
        params = verify.package_weights(params, path, report)
        on = "fidelity (the package" if report is not None else "the package"
        weights = f" on {verify.STORED_WEIGHTS})" if report is not None else ""
        print(f"verify: {on} on {verify.engine_label(args.engine)} vs the NumPy reference{weights}:")
        inputs = verify.example_inputs(graph, vocab)
        checks = verify.verify_package(graph, params, path, inputs, args.precision, args.engine, progress)
        for check in checks:
            print(check.to_text())
        if not all(c.ok for c in checks):
            return 1
        return verify_quality(args, quality)
    return 0


def _check_whisper_options(args: argparse.Namespace) -> None:
    from rlx_mil.cli.convert_whisper import check_options

    check_options(args)
    if args.stateful:  # rlx_mil's stateful TextDecoder keeps its cache in Core ML states
        _check_stateful_target(args)


def _run_whisper(args: argparse.Namespace) -> int:
    from rlx_mil.cli.convert_whisper import run_whisper

    if args.engine == "coreai":
        raise InvalidOptionError("--verify --engine coreai verifies one .mlpackage; a Whisper folder (three packages)"
                                 " verifies on the MIL executor: drop --engine coreai")
    # --compress-calibration of a Whisper folder is audio the autoN plan measures on
    # (rlx_mil.speech.calibration), not token ids: the speech conversion reads it.
    args.speech_calibration, args.compress_calibration = args.compress_calibration, None
    if args.speech_calibration is not None and getattr(args, "compress", None) is None:
        raise InvalidOptionError("--compress-calibration needs --compress")
    return run_whisper(args, convert_kwargs(args))


def _refuse_existing_output(args: argparse.Namespace) -> None:
    """An existing output without --overwrite is refused before anything is read or downloaded."""
    output = Path(args.output)
    if (output.exists() or output.is_symlink()) and not args.overwrite:
        raise InvalidOptionError(f"{output} exists; pass --overwrite to replace it")


def _takes_tokens(graph: Graph) -> bool:
    from rlx_mil.ir import Input

    return any(isinstance(n.op, Input) and n.op.name == "input_ids" for n in graph)


def _vocab_size(graph: Graph) -> int:
    from rlx_mil.ir import Param

    for node in graph:
        if isinstance(node.op, Param) and node.op.name in (
                "model.embed_tokens.weight", "model.language_model.embed_tokens.weight", "embeddings.word_embeddings.weight",
                "embeddings.tok_embeddings.weight"):
            return node.shape.sizes()[0]
    raise InvalidOptionError(f"graph {graph.name!r} has no token embedding to draw example ids for")


def add_stateful_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that choose between the stateful package (decoders' default) and one graph."""
    p.add_argument("--stateful", action="store_true", default=None,
                   help="decoders (the default for them): one stateful package (KV cache as Core ML state) with the"
                        " prefill buckets and decode as functions sharing the weights (docs/llm.md)")
    p.add_argument("--graph-only", "--no-stateful", dest="stateful", action="store_false", default=None,
                   help="decoders: one stateless graph instead (a prefill of --seq-len tokens, or --variant decode);"
                        " implied by the graph flags (--seq-len, --variant, ...). Encoders and vision models always"
                        " convert this way")
    p.add_argument("--max-context", type=int_at_least(2), help=f"stateful: cache capacity in tokens (default {DEFAULT_MAX_CONTEXT}, or the positions the model"
                        " was trained for when fewer)")
    p.add_argument("--prefill", metavar="N,N,...",
                   help=f"stateful: prefill bucket lengths, e.g. 64,512 (default {DEFAULT_PREFILL}; 'none' for"
                        " decode only, which reads prompts token by token)")
    p.add_argument("--all-logits", action="store_true",
                   help="stateful: prefill buckets return every position's logits, so `rlx-mil eval` scores a"
                        " bucket of tokens per call (bigger prefill outputs; generation is unchanged)")
    p.add_argument("--cache-layout", choices=["stacked", "per_layer"],
                   help="stateful: two stacked states (default) or one state per layer's K and V")
    p.add_argument("--chunk-bytes", metavar="SIZE",
                   help="stateful: write a chunked set to the folder -o DIR instead, cut at layer boundaries so"
                        " every chunk's weight file stays under SIZE (200KB, 1GB = 10^9 bytes, 1GiB = 2^30 bytes;"
                        " docs/deploying.md)")


#: --max-context when not given.
DEFAULT_MAX_CONTEXT = 2048
#: --prefill when not given: one bucket, so that prompts are read 128 tokens per call.
DEFAULT_PREFILL = 128


def prefill_option(args: argparse.Namespace, max_context: int) -> str:
    """The prefill buckets of a stateful conversion: --prefill, 'none' for decode only, or by
    default one bucket of `DEFAULT_PREFILL` tokens (smaller when the context is shorter)."""
    given = args.prefill
    if given is None and args.attention_mask:
        return ""  # the key-padding mask is the decode function's alone
    if given is None:
        bucket = min(DEFAULT_PREFILL, max_context // 2)
        return str(bucket) if bucket >= 2 else ""
    return "" if str(given).strip().lower() == "none" else str(given)


def _stateful_flags(args: argparse.Namespace) -> list[str]:
    return [flag for flag, value in (("--prefill", args.prefill), ("--max-context", args.max_context),
                                     ("--cache-layout", args.cache_layout),
                                     ("--chunk-bytes", getattr(args, "chunk_bytes", None)),
                                     ("--all-logits", getattr(args, "all_logits", False) or None)) if value is not None]


def _graph_flags(args: argparse.Namespace) -> list[str]:
    own_graph_flags = {
        "--variant decode": args.variant == "decode", "--seq-len": args.seq_len is not None,
        "--cache-len": args.cache_len is not None, "--kv-outputs": args.kv_outputs,
        "--last-logits": args.last_logits, "--position-ids": args.position_ids,
        "--max-positions": args.max_positions is not None, "--save-graph": args.save_graph is not None,
        "--batch-size": args.batch_size != 1,
    }
    return [flag for flag, given in own_graph_flags.items() if given]


def choose_stateful(args: argparse.Namespace, decoder: bool) -> bool:
    """Whether to write the stateful package: decoders do unless --graph-only (or a flag that
    shapes one graph) says otherwise; encoders and vision models never. Every clash between the
    two kinds of flags is refused here, before anything is read."""
    stateful_flags, graph_flags = _stateful_flags(args), _graph_flags(args)
    many = len(stateful_flags) != 1
    if args.stateful is False:
        if stateful_flags:
            raise InvalidOptionError(
                f"{', '.join(stateful_flags)} shape{'s' * (not many)} the stateful package; drop --graph-only or"
                f" drop {'them' if many else 'it'}"
            )
        return False
    if not decoder:
        if args.stateful or stateful_flags:
            given = ["--stateful"] * bool(args.stateful) + stateful_flags
            raise InvalidOptionError(
                f"{', '.join(given)}: only decoders keep a KV cache; this checkpoint converts as one graph, drop"
                f" {'them' if len(given) != 1 else 'it'}"
            )
        return False
    if args.stateful is None and graph_flags and not stateful_flags:
        return False  # the graph flags ask for one graph: the old output, as before
    if graph_flags:
        raise InvalidOptionError(
            f"the stateful package builds its own decode graphs (one per prefill bucket and decode, sized by"
            f" --max-context); drop {', '.join(graph_flags)}, or add --graph-only for one graph"
        )
    _check_stateful_target(args)
    return True


def _check_stateful_target(args: argparse.Namespace) -> None:
    """A stateful package keeps its KV cache in Core ML states (iOS18 on): an older --target
    (with any --deploy form) cannot hold it; refused before anything is read, naming both."""
    from rlx_mil.lowering.target import Target

    target = Target.parse(args.target)
    if target >= Target.IOS18:
        return
    deploy = getattr(args, "deploy", "plain")
    given = f"--target {target.label}" + (f" with --deploy {deploy}" if deploy != "plain" else "")
    raise InvalidOptionError(
        f"{given}: the stateful package keeps its KV cache in Core ML states, which exist from iOS18 on; use"
        " --target iOS18 (or later), or --graph-only for one stateless graph"
    )


def decoder_positions(model: Path, gguf: bool = False) -> tuple[bool, int | None]:
    """Whether a checkpoint folder (or GGUF file) holds a decoder, and the positions it was
    trained for (None when unknown). A source that cannot be read counts as a decoder: the
    conversion then reports what is wrong with it."""
    import json

    from rlx_mil.errors import RlxMilError

    try:
        if gguf:
            from rlx_mil.models.gguf.metadata import decoder_spec
            from rlx_mil.models.gguf.reader import GGUFFile

            return True, int(decoder_spec(GGUFFile(model)).max_position_embeddings)
        config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
        from rlx_mil.models.families import model_spec
        from rlx_mil.models.hf_config import DecoderSpec

        spec = model_spec(config)
        if not isinstance(spec, DecoderSpec):
            return False, None
        return True, int(spec.max_position_embeddings)
    except (OSError, ValueError, TypeError, AttributeError, KeyError, RlxMilError):
        return True, None


def max_context_option(args: argparse.Namespace, positions: int | None) -> int:
    """--max-context, else `DEFAULT_MAX_CONTEXT` capped at the positions the model was trained for."""
    if args.max_context is not None:
        return int(args.max_context)
    return DEFAULT_MAX_CONTEXT if positions is None else max(2, min(DEFAULT_MAX_CONTEXT, positions))


#: Greedy steps `convert-hf --stateful --verify` compares.
VERIFY_STEPS = 8


def run_stateful(args: argparse.Namespace, convert_options: dict[str, Any], max_context: int) -> int:
    """`convert-hf --stateful`: build, convert and save the package; `--verify` checks that the
    MIL executor generates the reference's greedy tokens."""
    import time

    from rlx_mil.coreml.package_info import package_info
    from rlx_mil.llm.package import convert_llm_checkpoint

    chunk_bytes = check_stateful_output(args)
    start = time.perf_counter()
    result = convert_llm_checkpoint(
        args.model_dir, args.output, max_context=max_context,
        prefill=prefill_option(args, max_context), overwrite=args.overwrite, cache_layout=args.cache_layout or "stacked",
        attention_mask=args.attention_mask, chunk_bytes=chunk_bytes, all_logits=getattr(args, "all_logits", False),
        description=description_overrides(args), progress=Progress(enabled=not (args.quiet or running_under_ci())),
        **convert_options,
    )
    from rlx_mil.cli.quality import measure_stateful, print_summary, verify_quality, write_report
    from rlx_mil.models.pretrained import from_pretrained

    if chunk_bytes is not None:
        seconds = time.perf_counter() - start
        metadata = result.metadata()
        quality = measure_stateful(args.model_dir, metadata, from_pretrained, args, package=args.output)
        write_report(args, metadata, quality)
        return report_chunked(args, args.model_dir, result, seconds, quality=quality)
    info = package_info(args.output)
    names = ", ".join(info.functions)
    print(f"wrote {args.output} (functions {names}; {human_bytes(info.weight_bytes)} of weights) in"
          f" {time.perf_counter() - start:.1f} s")
    del result  # the checks read the saved package: its codes do not sit under the check's float32 runs
    quality = measure_stateful(args.model_dir, info.metadata, from_pretrained, args, package=args.output)
    print_summary(quality)
    write_report(args, info.metadata, quality)
    if args.verify:
        return (verify_stateful_command(args.model_dir, args.output, args.precision, info.metadata, quiet=args.quiet,
                                        engine=args.engine)
                or verify_quality(args, quality))
    return 0


def check_stateful_output(args: argparse.Namespace) -> str | None:
    """Refuse a bad output (a .mlpackage path, or a folder with --chunk-bytes) before any work;
    returns --chunk-bytes."""
    chunk_bytes: str | None = getattr(args, "chunk_bytes", None)
    if chunk_bytes is None:
        check_output(args.output, args.overwrite)
    else:
        from rlx_mil.llm.chunked import check_output_folder

        check_output_folder(args.output, args.overwrite)
    return chunk_bytes


def report_chunked(args: argparse.Namespace, model: Any, chunked: Any, seconds: float, loader: Any = None,
                   quality: Any = None) -> int:
    """What a stateful conversion prints for a chunked set (and its quality check's line);
    `--verify` runs the whole set, then judges `quality`."""
    from rlx_mil.cli.quality import print_summary, verify_quality

    sizes = ", ".join(human_bytes(c.weight_bytes) for c in chunked.chunks)
    print(f"wrote {args.output} ({counted(len(chunked.chunks), 'chunk')}, weights {sizes}; functions"
          f" {', '.join(chunked.functions)}) in {seconds:.1f} s")
    print_summary(quality)
    if args.verify:
        return (verify_stateful_command(model, args.output, args.precision, chunked.metadata(), loader=loader,
                                        quiet=args.quiet)
                or verify_quality(args, quality))
    return 0


def verify_stateful_command(model: Any, package: Any, precision: str, metadata: Any, loader: Any = None,
                            quiet: bool = False, engine: str = "milexec", codes: Any = None) -> int:
    """`--verify` of a stateful package: tie-aware greedy steps against the reference, one line
    each, then what was compared; the exit code. `engine` runs the package: the MIL executor or
    Apple's Core AI runtime ("coreai")."""
    from rlx_mil.compress import report_of
    from rlx_mil.llm.package import verify_stateful
    from rlx_mil.models.verify import STORED_WEIGHTS, engine_label

    weights = f"{STORED_WEIGHTS} (fidelity)" if report_of(metadata) is not None else "its weights"
    print(f"verify: {VERIFY_STEPS} greedy steps, the package on {engine_label(engine)} against the NumPy reference"
          f" of the checkpoint's plain graph on {weights} (teacher-forced on the reference's tokens)", flush=True)
    progress = Progress(enabled=not (quiet or running_under_ci()))
    # On a terminal a bar counts the steps (each step's line beside it); elsewhere one line each.
    bar = progress.interactive and sys.stdout.isatty()

    def step(line: str) -> None:
        if bar and line.endswith(("match", "near-tie")):
            progress.advance()
            detail(line)
        else:  # a failing step keeps its line (the comparison stops there)
            print(f"verify: {line}", flush=True)

    where = "Apple's Core AI runtime" if engine == "coreai" else "the executor"
    progress.begin(f"verify: opening the package on {where}", unit=" weights")
    comparison = verify_stateful(
        model, package, None, VERIFY_STEPS, precision=precision, compression=report_of(metadata),
        report=step, loader=loader, engine=engine, codes=codes,
        opened=lambda: progress.begin("verify: greedy steps", total=VERIFY_STEPS, unit=" steps"),
    )
    progress.end(counted(len(comparison.steps), "step"))
    print(f"verify: {comparison.summary()}")
    return 0 if comparison.ok else 1
