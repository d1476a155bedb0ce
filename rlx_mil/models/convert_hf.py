"""`rlx-mil convert-hf`: a Hugging Face checkpoint folder -> a verified `.mlpackage`.

The command's options come in two groups, each turned into keyword arguments by one
function: `build_kwargs` (how `from_pretrained` builds the graph) and `convert_kwargs` (how
`rlx_mil.convert` lowers it). A new flag is one `add_argument` in `add_arguments` plus one
entry in the matching function.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import InvalidOptionError
from rlx_mil.ir import Graph
from rlx_mil.progress import CountingParams, Progress, human_bytes, running_under_ci

VARIANTS = ("prefill", "decode")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The convert-hf flags (besides the shared --target/--precision/... conversion flags)."""
    p.add_argument("model_dir", type=Path, help="checkpoint folder: config.json + model.safetensors (or shards)")
    p.add_argument("-o", "--output", type=Path, required=True, help="output .mlpackage path")
    p.add_argument("--overwrite", action="store_true", help="replace an existing package")
    p.add_argument("--variant", default="prefill", choices=VARIANTS,
                   help="decoders: prefill (S tokens, causal) or decode (new tokens against a KV cache)")
    p.add_argument("--seq-len", type=int, help="tokens per call (prefill default 128, decode default 1)")
    p.add_argument("--cache-len", type=int, help="decode: past positions held in the KV cache")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--last-logits", action="store_true", help="output the last position's logits only")
    p.add_argument("--kv-outputs", action="store_true", help="prefill: also output every layer's K/V")
    p.add_argument("--position-ids", action="store_true", help="prefill: take position_ids as an input")
    p.add_argument("--max-positions", type=int, help="rows of the RoPE tables (default: just enough)")
    p.add_argument("--attention-mask", action="store_true",
                   help="decode with --seq-len 1: take a key-padding attention_mask over the cache and the new token")
    p.add_argument("--pooling", default="auto", choices=["auto", "mean", "cls", "none"],
                   help="encoders: sentence embedding pooling (auto: the sentence-transformers config)")
    p.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                   help="encoders: L2-normalise the pooled embedding (default: the sentence-transformers config)")
    p.add_argument("--token-type-ids", action="store_true", help="encoders: take token_type_ids as an input")
    p.add_argument("--save-graph", type=Path, metavar="GRAPH_JSON", help="also write the RLX graph as JSON")
    p.add_argument("--verify", action="store_true",
                   help="run the package through the NumPy MIL executor and compare with the reference")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output (also off when CI is set)")
    from rlx_mil.llm_package import add_arguments as add_stateful_arguments

    add_stateful_arguments(p)


def build_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """`from_pretrained` keyword arguments from the parsed flags."""
    return {
        "variant": args.variant, "seq_len": args.seq_len, "cache_len": args.cache_len,
        "batch_size": args.batch_size, "last_logits": args.last_logits, "kv_outputs": args.kv_outputs,
        "position_ids": args.position_ids, "max_positions": args.max_positions, "attention_mask": args.attention_mask,
        "pooling": None if args.pooling == "none" else args.pooling, "normalize": args.normalize,
        "token_type_ids": args.token_type_ids,
    }


def convert_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """`rlx_mil.convert` keyword arguments from the parsed flags."""
    return {"target": args.target, "precision": args.precision, "compute_units": args.compute_units,
            "attention": args.attention, "compress": getattr(args, "compress", None)}


def check_output(output: Path, overwrite: bool) -> None:
    """Refuse a bad output path before any work."""
    if output.suffix != ".mlpackage":
        raise InvalidOptionError(f"the output is a .mlpackage folder, got {str(output)!r}")
    if output.exists() and not overwrite:
        raise InvalidOptionError(f"{output} exists; pass --overwrite to replace it")


def convert_checkpoint(
    model_dir: str | Path,
    output: str | Path,
    *,
    build: Mapping[str, Any],
    convert: Mapping[str, Any],
    progress: Progress,
    overwrite: bool = False,
    save_graph: Path | None = None,
) -> tuple[Graph, Mapping[str, Any], Path]:
    """from_pretrained -> rlx_mil.convert -> rlx_mil.save, each stage reported on `progress`.
    Returns the graph, its params and the package path."""
    import rlx_mil
    from rlx_mil.models.pretrained import from_pretrained

    out = Path(output)
    check_output(out, overwrite)
    progress.begin("reading the checkpoint")
    graph, params = from_pretrained(model_dir, **build)
    progress.end(f"{graph.name}: {len(graph)} IR nodes, {len(params)} params")
    if save_graph is not None:
        graph.to_json_file(save_graph)
        progress.note(f"  wrote the graph to {save_graph}")

    total = len(params)
    seen: set[str] = set()
    loaded = [0]

    def on_read(name: str, value: np.ndarray) -> None:
        if not seen:
            progress.begin("loading weights", total=total, unit=" tensors")
        if name in seen:
            return
        seen.add(name)
        loaded[0] += int(np.asarray(value).nbytes)
        progress.advance()
        if len(seen) == total:
            progress.end(f"{total} tensors, {human_bytes(loaded[0])}")
            progress.begin("building the MIL program")

    progress.begin("loading coremltools")
    import coremltools  # noqa: F401  (its import takes seconds; shown as its own stage)

    progress.end()
    with progress.coreml_passes():
        model = rlx_mil.convert(graph, CountingParams(params, on_read), **convert)
    progress.begin("writing the package")
    path = rlx_mil.save(model, out, overwrite=overwrite)
    progress.end(str(path))
    return graph, params, path


def run(args: argparse.Namespace) -> int:
    """The convert-hf command."""
    from rlx_mil.models.verify import example_inputs, verify_package
    from rlx_mil.package_info import package_info

    if args.stateful:
        from rlx_mil.llm_package import run_stateful

        return run_stateful(args, convert_kwargs(args))
    progress = Progress(enabled=not (args.quiet or running_under_ci()))
    start = time.perf_counter()
    graph, params, path = convert_checkpoint(
        args.model_dir, args.output, build=build_kwargs(args), convert=convert_kwargs(args),
        progress=progress, overwrite=args.overwrite, save_graph=args.save_graph,
    )
    info = package_info(path)
    print(f"wrote {path} ({info.num_ops} ops, {human_bytes(info.package_bytes)}) in {time.perf_counter() - start:.1f} s")
    if args.verify:
        vocab = _vocab_size(graph)
        if getattr(args, "compress", None):
            # A compressed package computes with the dequantized weights: verify against those.
            from rlx_mil.compress import dequantized_params, report_of

            params = dequantized_params(params, report_of(info.metadata))
        checks = verify_package(graph, params, path, example_inputs(graph, vocab), args.precision)
        for check in checks:
            print(check.to_text())
        if not all(c.ok for c in checks):
            return 1
    return 0


def _vocab_size(graph: Graph) -> int:
    from rlx_mil.ir import Param

    for node in graph:
        if isinstance(node.op, Param) and node.op.name in ("model.embed_tokens.weight", "embeddings.word_embeddings.weight"):
            return node.shape.sizes()[0]
    raise InvalidOptionError(f"graph {graph.name!r} has no token embedding to draw example ids for")
