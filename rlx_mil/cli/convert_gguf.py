"""`rlx-mil convert-gguf`: a llama.cpp GGUF file -> a verified `.mlpackage`, its quantized
tensors kept as compressed weights and its tokenizer stored with the package."""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path
from typing import Any

from rlx_mil.cli.convert_hf import (
    _vocab_size,
    add_decoder_arguments,
    add_stateful_arguments,
    check_stateful_output,
    choose_stateful,
    compress_check_inputs,
    convert_kwargs,
    decoder_positions,
    description_overrides,
    max_context_option,
    prefill_option,
    print_compression,
    report_chunked,
    verify_stateful_command,
)
from rlx_mil.errors import InvalidOptionError
from rlx_mil.progress import Progress, running_under_ci
from rlx_mil.units import counted, human_bytes


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The convert-gguf flags (besides the shared --target/--precision/--compress flags)."""
    p.add_argument("model", type=Path, help="a GGUF file (llama, qwen2, qwen3, gemma2, gemma3 or phi3 architecture),"
                   " or REPO:FILE.gguf of a Hugging Face Hub repository, downloaded into the Hub's cache")
    add_decoder_arguments(p)
    from rlx_mil.cli.arguments import DEPLOY_FORMS

    p.add_argument("--deploy", default="plain", choices=DEPLOY_FORMS,
                   help="shape the package for a device (docs/deploying.md): plain (default) and gpu keep the file's"
                   " codes (per-block, the GPU's form); ane re-quantizes every quantized tensor to the Neural Engine's"
                   " per-channel forms with --compress (default auto4: the measured plan, codes fitted to calibration"
                   " text), judged against the file's own decode (lossy, see --requantize)")
    p.add_argument("--requantize", metavar="SPEC",
                   help="re-quantize the file's quantized tensors instead of keeping their codes: one scheme for all"
                   " (lut4) or TYPE=SCHEME pairs (Q6_K=lut6,Q5_K=lut6); 'compress' hands them to --compress as float"
                   " weights; lossy, the report gives the error (default with --deploy ane: compress; else none)")
    p.add_argument("--save-graph", type=Path, metavar="GRAPH_JSON", help="also write the RLX graph as JSON")
    p.add_argument("--verify", action="store_true",
                   help="run the package through the NumPy MIL executor (--engine coreai: Apple's runtime) and compare"
                   " with the reference on the same codes; a requantized or compressed package is also judged against"
                   " the float model the file's codes decode to, and fails below the quality thresholds unless"
                   " --allow-quality-loss")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output (also off when CI is set)")
    p.add_argument("--author", help="Core ML model author (default: the file's general.author / organization)")
    p.add_argument("--license", help="Core ML model license (default: the file's general.license)")
    p.add_argument("--description", help="Core ML short description (default: the model's name and architecture)")
    p.add_argument("--model-version", metavar="VERSION", help="Core ML model version string (default: general.version)")
    add_stateful_arguments(p)


#: `rlx_mil.models.gguf.requantize.COMPRESS` (tests/test_cli_startup.py checks that they agree).
COMPRESS = "compress"
#: --compress of `--deploy ane` when neither it nor --requantize is given: the form's measured plan.
ANE_COMPRESS = "auto4"


def requantize_spec(args: argparse.Namespace) -> str | None:
    """What `from_gguf(requantize=...)` gets: --requantize, else for --deploy ane `COMPRESS`
    (the quantized tensors become float weights --compress plans)."""
    if args.requantize is not None:
        return str(args.requantize)
    return COMPRESS if args.deploy == "ane" else None


def apply_deploy_default(args: argparse.Namespace) -> None:
    """--deploy ane without --requantize and --compress: --compress auto4 (`ANE_COMPRESS`)."""
    if args.deploy == "ane" and args.requantize is None and getattr(args, "compress", None) is None:
        args.compress = ANE_COMPRESS


def gguf_convert_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """`convert_kwargs`, with an autoN plan / fitted codes calibrated on the --compress-calibration
    text (else the built-in text) tokenized by the file's own tokenizer, through its plain graph."""
    options = convert_kwargs(args)
    if options.get("compress") is not None:
        from rlx_mil.cli.quality import user_text
        from rlx_mil.llm.calibration import gguf_compress

        options["compress"] = gguf_compress(options["compress"], args.model, deploy=args.deploy, text=user_text(args))
    return options


def build_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """`from_gguf` keyword arguments from the parsed flags."""
    return {
        "variant": args.variant, "seq_len": args.seq_len, "cache_len": args.cache_len,
        "batch_size": args.batch_size, "last_logits": args.last_logits, "kv_outputs": args.kv_outputs,
        "position_ids": args.position_ids, "max_positions": args.max_positions, "attention_mask": args.attention_mask,
        "requantize": requantize_spec(args),
    }


def gguf_loader(args: argparse.Namespace) -> Any:
    """`from_gguf` with the re-quantization the flags ask for (what the stateful path and its
    verification build every graph with)."""
    from rlx_mil.models.gguf import from_gguf

    return functools.partial(from_gguf, requantize=requantize_spec(args))


def run(args: argparse.Namespace) -> int:
    """The convert-gguf command."""
    from rlx_mil.cli.arguments import announce

    announce(args, f"converting {args.model} to {args.output}")
    from rlx_mil.cli.convert_hf import _refuse_existing_output
    from rlx_mil.cli.hub import resolve_gguf

    _refuse_existing_output(args)  # before any download
    resolve_gguf(args, "model")
    from rlx_mil.cli.quality import check_report_path
    from rlx_mil.coreml.package_info import package_info
    from rlx_mil.llm.convert_hf import convert_checkpoint
    from rlx_mil.llm.gguf_package import prepare_gguf_package
    from rlx_mil.models.gguf import from_gguf
    from rlx_mil.models.verify import engine_label, example_inputs, verify_package

    apply_deploy_default(args)
    stateful = choose_stateful(args, decoder=True)  # every GGUF architecture rlx_mil reads is a decoder
    check_inputs = compress_check_inputs(args)
    check_report_path(args)
    if stateful:
        if check_inputs is not None:
            raise InvalidOptionError("--compress-check takes inputs of one stateless call; add --graph-only for one")
        return run_stateful(args)
    progress = Progress(enabled=not (args.quiet or running_under_ci()))
    start = time.perf_counter()
    graph, params, path = convert_checkpoint(
        args.model, args.output, build=build_kwargs(args), convert=gguf_convert_kwargs(args), progress=progress,
        overwrite=args.overwrite, save_graph=args.save_graph, description=description_overrides(args),
        check_inputs=check_inputs, loader=from_gguf, prepare=prepare_gguf_package,
    )
    info = package_info(path)
    print(f"wrote {path} ({counted(info.num_ops, 'op')}, {human_bytes(info.package_bytes)}) in {time.perf_counter() - start:.1f} s")
    print_compression(info.metadata)
    quality = gguf_quality(args, info.metadata, package=path)
    if args.verify:
        from rlx_mil.cli.quality import verify_quality
        from rlx_mil.compress import report_of
        from rlx_mil.models.verify import STORED_WEIGHTS, package_weights

        report = report_of(info.metadata)
        if report is not None:  # the package computes with its codes: verify against what they decode to
            params = package_weights(params, path, report)
            print(f"verify: fidelity (the package on {engine_label(args.engine)} vs the NumPy reference on"
                  f" {STORED_WEIGHTS}):")
        else:
            print(f"verify: the package on {engine_label(args.engine)} vs the NumPy reference:")
        checks = verify_package(graph, params, path, example_inputs(graph, _vocab_size(graph)), args.precision,
                                engine=args.engine)
        for check in checks:
            print(check.to_text())
        if not all(c.ok for c in checks):
            return 1
        return verify_quality(args, quality)
    return 0


def run_stateful(args: argparse.Namespace) -> int:
    """`convert-gguf --stateful`: one stateful package (prefill buckets and decode sharing the
    weights and the KV cache); `--verify` checks the executor's greedy tokens against the
    reference on the same codes."""
    from rlx_mil.coreml.package_info import package_info
    from rlx_mil.llm.gguf_package import prepare_gguf_package
    from rlx_mil.llm.package import convert_llm_checkpoint

    from_gguf = gguf_loader(args)
    chunk_bytes = check_stateful_output(args)
    start = time.perf_counter()
    max_context = max_context_option(args, decoder_positions(args.model, gguf=True)[1])
    result = convert_llm_checkpoint(
        args.model, args.output, max_context=max_context,
        prefill=prefill_option(args, max_context), overwrite=args.overwrite, cache_layout=args.cache_layout or "stacked", attention_mask=args.attention_mask, description=description_overrides(args),
        loader=from_gguf, prepare=prepare_gguf_package, progress=Progress(enabled=not (args.quiet or running_under_ci())),
        chunk_bytes=chunk_bytes, all_logits=getattr(args, "all_logits", False), **gguf_convert_kwargs(args),
    )
    if chunk_bytes is not None:
        seconds = time.perf_counter() - start
        quality = gguf_quality(args, result.metadata(), printed=False, package=args.output)
        return report_chunked(args, args.model, result, seconds, loader=from_gguf, quality=quality)
    info = package_info(args.output)
    print(f"wrote {args.output} (functions {', '.join(info.functions)}; {human_bytes(info.weight_bytes)} of weights)"
          f" in {time.perf_counter() - start:.1f} s")
    print_compression(info.metadata)
    del result  # the checks read the saved package: its codes do not sit under the check's float32 runs
    quality = gguf_quality(args, info.metadata, package=args.output)
    if args.verify:
        from rlx_mil.cli.quality import verify_quality

        return (verify_stateful_command(args.model, args.output, args.precision, info.metadata, loader=from_gguf,
                                        quiet=args.quiet, engine=args.engine)
                or verify_quality(args, quality))
    return 0


def gguf_quality(args: argparse.Namespace, metadata: Any, printed: bool = True, model: Any = None,
                 package: Any = None) -> Any:
    """The quality check of a package whose weights were encoded anew (--requantize, --deploy
    ane's plan, --compress) against the float model the file's own codes decode to; printed,
    written to --report, warned about. None when the file's codes were kept (they are the model).
    The compressed side is what the saved `package` stores (`measure_stateful`)."""
    from rlx_mil.cli.quality import measure_stateful, print_summary, write_report

    quality = None
    if requantize_spec(args) is not None or getattr(args, "compress", None):
        quality = measure_stateful(args.model, metadata, gguf_loader(args), args, gguf=True, model=model, package=package)
    if printed:
        print_summary(quality)
    write_report(args, metadata, quality)
    return quality
