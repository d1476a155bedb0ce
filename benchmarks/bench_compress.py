"""Compression benchmark: package size, conversion time, peak memory and error per scheme.

Writes a random Llama-layout Hugging Face checkpoint (bfloat16 by default), then converts it
once uncompressed (fp16) and once per scheme, each in a fresh subprocess so peak RSS is that
conversion's own, reading the checkpoint lazily through `rlx_mil.models.from_pretrained`. For
each it reports the package's weight bytes (and the ratio to the fp16 package), conversion
wall time, peak RSS, the largest per-weight relative error, and the relative error of the saved
package's logits (NumPy MIL executor) against the fp16 package's on the same tokens.

    python benchmarks/bench_compress.py [--hidden 512 --layers 4 --vocab 8192 --dtype bfloat16] \
        [--schemes int8 int4 lut4 lut6 "lut4;lm_head=int8"] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from convert_bench import _quiet  # noqa: E402  (the same quiet set-up)
from peak_rss import peak_rss_bytes  # noqa: E402

DEFAULT_SCHEMES = ["int8", "int4", "lut4", "lut6", "int4-block64", "lut4-group16"]


def _hf_config(args: argparse.Namespace) -> dict[str, Any]:
    from rlx_mil.models.random_checkpoint import TINY_CONFIGS

    return {**TINY_CONFIGS["llama"], "vocab_size": args.vocab, "hidden_size": args.hidden,
            "intermediate_size": args.intermediate or 2 * args.hidden, "num_hidden_layers": args.layers,
            "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads}


def child(args: argparse.Namespace) -> None:
    """Convert the checkpoint with --scheme and print one JSON line of measurements."""
    _quiet()
    import rlx_mil
    from rlx_mil.compress import report_of
    from rlx_mil.coreml.package_info import package_info
    from rlx_mil.models.pretrained import from_pretrained

    graph, params = from_pretrained(args.checkpoint, seq_len=args.seq)
    scheme = None if args.scheme == "fp16" else args.scheme
    start = time.perf_counter()
    model = rlx_mil.convert(graph, params, compress=scheme)
    path = rlx_mil.save(model, args.output, overwrite=True)
    seconds = time.perf_counter() - start
    report = report_of(model)
    print(json.dumps({
        "scheme": args.scheme,
        "seconds": seconds,
        "peak_rss": peak_rss_bytes(),
        "weight_bytes": package_info(path).weight_bytes,
        "max_weight_error": max((w.relative_error for w in report.weights), default=0.0) if report else 0.0,
        "compressed": len(report.weights) if report else 0,
    }))


def _write_checkpoint(args: argparse.Namespace, folder: Path) -> int:
    from rlx_mil.models.random_checkpoint import write_random_checkpoint

    write_random_checkpoint(folder, _hf_config(args), dtype=args.dtype)
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def _run_child(args: argparse.Namespace, scheme: str, checkpoint: Path, output: Path) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--scheme", scheme, "--checkpoint", str(checkpoint),
           "--output", str(output), "--hidden", str(args.hidden), "--heads", str(args.heads), "--kv-heads",
           str(args.kv_heads), "--layers", str(args.layers), "--seq", str(args.seq), "--vocab", str(args.vocab)]
    if args.intermediate:
        cmd += ["--intermediate", str(args.intermediate)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{scheme}: conversion failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _output_error(args: argparse.Namespace, package: Path, baseline: Path) -> float:
    from rlx_mil import milexec

    ids = np.random.default_rng(0).integers(0, args.vocab, size=(1, args.seq)).astype(np.int32)
    got = milexec.run(package, {"input_ids": ids})["logits"].astype(np.float64)
    want = milexec.run(baseline, {"input_ids": ids})["logits"].astype(np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=0)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="bfloat16",
                        help="checkpoint dtype of the matrices")
    parser.add_argument("--schemes", nargs="+", default=DEFAULT_SCHEMES)
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--no-output-error", action="store_true", help="skip running the packages")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--scheme", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    _quiet()
    with tempfile.TemporaryDirectory(prefix="rlx_mil_bench_compress_") as tmp:
        root = Path(tmp)
        checkpoint = root / "checkpoint"
        ckpt_bytes = _write_checkpoint(args, checkpoint)
        rows: list[dict[str, Any]] = []
        baseline = root / "fp16.mlpackage"
        for scheme in ["fp16", *args.schemes]:
            package = baseline if scheme == "fp16" else root / f"pkg{len(rows)}.mlpackage"
            row = _run_child(args, scheme, checkpoint, package)
            if scheme != "fp16" and not args.no_output_error:
                row["output_error"] = _output_error(args, package, baseline)
            rows.append(row)
    base = rows[0]["weight_bytes"]
    config = _hf_config(args)
    print(f"Llama-layout decoder: vocab {args.vocab}, hidden {args.hidden}, layers {args.layers}, intermediate"
          f" {config['intermediate_size']}, seq {args.seq}; {args.dtype} checkpoint {ckpt_bytes / 2**20:.1f} MiB")
    header = ["scheme", "weight MiB", "x fp16", "convert s", "peak RSS MiB", "max weight rel.err", "output rel.err"]
    lines = []
    for r in rows:
        lines.append([
            r["scheme"], f"{r['weight_bytes'] / 2**20:.2f}", f"{r['weight_bytes'] / base:.3f}", f"{r['seconds']:.1f}",
            f"{r['peak_rss'] / 2**20:.0f}", f"{r['max_weight_error']:.4f}" if r["compressed"] else "-",
            f"{r['output_error']:.4f}" if "output_error" in r else "-",
        ])
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" for _ in header) + "|")
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
        print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
        for line in lines:
            print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
