"""Chunked-set benchmark: a Llama-3.2-1B-shaped fp16 checkpoint (random weights, 16 layers,
hidden 2048, vocab 128,256, tied embeddings) converted once as one stateful package and once
with `--chunk-bytes 1GB`, then greedy generation through `Session` (MIL executor) on both.

Reports the chunks (layers, weight-file bytes: each must be under the limit), the conversion
wall times and whether the set generates the single package's tokens.

    flock /tmp/rlx_bigmem.lock python benchmarks/bench_chunked.py [--tokens 4] [--chunk-bytes 1GB]

Needs ~8 GB of RAM and ~10 GB of disk (checkpoint, package and set); the decode steps run
through the NumPy executor, a few seconds each at this size.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _convert(checkpoint: Path, out: Path, max_context: int, extra: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "rlx_mil.cli", "convert-hf", str(checkpoint), "-o", str(out), "--stateful",
         "--max-context", str(max_context), "--precision", "fp16", "-q", *extra],
        check=True,
    )
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, help="folder for the checkpoint and packages (default: a temp folder)")
    parser.add_argument("--chunk-bytes", default="1GB")
    parser.add_argument("--max-context", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=4, help="greedy tokens to compare")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from bench_models import LLAMA_1B_CONFIG

    from rlx_mil.llm.chunked import read_chunked_set
    from rlx_mil.llm.generate import Session
    from rlx_mil.models.random_checkpoint import write_random_checkpoint
    from rlx_mil.units import parse_bytes

    work = args.work or Path(tempfile.mkdtemp(prefix="bench_chunked_"))
    checkpoint = work / "llama-1b"
    if not (checkpoint / "config.json").is_file():
        write_random_checkpoint(checkpoint, LLAMA_1B_CONFIG, dtype="float16", shards=2, seed=0)
    single, folder = work / "one.mlpackage", work / "llama-1b-chunks"
    results: dict[str, object] = {}
    if not single.exists():
        results["single_seconds"] = round(_convert(checkpoint, single, args.max_context, []), 1)
    if not folder.exists():
        results["chunked_seconds"] = round(
            _convert(checkpoint, folder, args.max_context, ["--chunk-bytes", args.chunk_bytes]), 1)
    chunked = read_chunked_set(folder)
    limit = parse_bytes(args.chunk_bytes)
    results["chunks"] = [{"package": c.package, "layers": c.layers, "weight_bytes": c.weight_bytes,
                          "under_limit": c.weight_bytes < limit} for c in chunked.chunks]
    prompt = [128000, 791, 6864, 315]
    tokens = {}
    for label, path in (("single", single), ("chunked", folder)):
        session = Session(path, engine="milexec", memory="lean")
        start = time.perf_counter()
        tokens[label] = session.generate(prompt, args.tokens)
        results[f"{label}_generate_seconds"] = round(time.perf_counter() - start, 1)
        del session
    results["tokens"] = tokens
    results["same_tokens"] = tokens["single"] == tokens["chunked"]
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    ok = results["same_tokens"] and len(chunked.chunks) >= 3 and all(c["under_limit"] for c in results["chunks"])  # type: ignore[union-attr, index]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
