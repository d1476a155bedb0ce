"""Hugging Face checkpoint benchmark: a Qwen3-0.6B-shaped BF16 checkpoint (random weights,
28 layers, hidden 1024, 16/8 heads, head_dim 128, vocab 151936, tied embeddings) converted
by `rlx-mil convert-hf` in one command.

Writes the checkpoint once (sharded safetensors, as transformers does), then runs the
conversion in a fresh subprocess and reports its wall time and peak RSS next to the sizes
that bound it: the checkpoint's bytes and one float32 copy of its largest tensor.

    flock /tmp/rlx_bigmem.lock python benchmarks/bench_hf_checkpoint.py [--seq-len 128] [--variant decode]

Needs ~6 GB of RAM and ~3 GB of disk; run it under the lock where several big jobs share a machine.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _largest_tensor(config: dict[str, Any]) -> tuple[str, int]:
    from rlx_mil.models.families import model_spec
    from rlx_mil.models.pretrained import build

    _, expected, _ = build(model_spec(config), seq_len=1)
    name = max(expected, key=lambda n: math.prod(expected[n]))
    return name, math.prod(expected[name])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, help="checkpoint folder (written if absent; default: a temp folder)")
    parser.add_argument("--variant", default="prefill", choices=["prefill", "decode"])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--cache-len", type=int, default=512)
    parser.add_argument("--precision", default="fp16", choices=["fp16", "fp32"])
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--layers", type=int, help="override num_hidden_layers (smaller runs)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(HERE.parent))
    from rlx_mil.models.random_checkpoint import QWEN3_0_6B, write_random_checkpoint

    config = dict(QWEN3_0_6B)
    if args.layers:
        config["num_hidden_layers"] = args.layers
    work = Path(tempfile.mkdtemp(prefix="rlx_mil_bench_hf_"))
    folder = args.checkpoint or work / "qwen3-0.6b-random-bf16"
    try:
        if not (folder / "config.json").is_file():
            t0 = time.perf_counter()
            write_random_checkpoint(folder, config, dtype="bfloat16", shards=args.shards, seed=0)
            print(f"wrote {folder} ({_tree_bytes(folder) / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s", flush=True)
        output = work / "model.mlpackage"
        peak_file = work / "peak_rss"
        # The CLI run through peak_rss.py, which records the command's own VmHWM.
        command = [sys.executable, str(HERE / "peak_rss.py"), str(peak_file), "rlx_mil.cli", "convert-hf", str(folder), "-o", str(output),
                   "--variant", args.variant, "--seq-len", str(args.seq_len), "--precision", args.precision]
        if args.variant == "decode":
            command += ["--cache-len", str(args.cache_len)]
        print("+", " ".join(command), flush=True)
        start = time.perf_counter()
        done = subprocess.run(command, cwd=HERE.parent, check=False)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            print(f"conversion failed with exit code {done.returncode}", file=sys.stderr)
            return done.returncode
        peak_rss = int(peak_file.read_text())
        name, count = _largest_tensor(config)
        results = {
            "model": "Qwen3-0.6B shape, random BF16", "layers": config["num_hidden_layers"], "variant": args.variant,
            "seq_len": args.seq_len, "cache_len": args.cache_len if args.variant == "decode" else None,
            "precision": args.precision, "checkpoint_bytes": _tree_bytes(folder), "convert_seconds": round(seconds, 1),
            "peak_rss_bytes": peak_rss, "package_bytes": _tree_bytes(output), "largest_tensor": name,
            "largest_tensor_f32_bytes": 4 * count,
        }
        gb = 1e9
        print(f"convert time:      {seconds:.1f} s (one command, including Python and coremltools start-up)")
        print(f"peak RSS:          {peak_rss / gb:.2f} GB")
        print(f"checkpoint:        {results['checkpoint_bytes'] / gb:.2f} GB BF16")
        print(f"package:           {results['package_bytes'] / gb:.2f} GB ({args.precision})")
        print(f"largest tensor:    {name}, {4 * count / gb:.2f} GB as float32")
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
