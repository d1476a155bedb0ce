"""Conversion benchmark: rlx_mil vs PyTorch -> coremltools on the same Llama-style decoder.

Measures, for each converter, in fresh subprocesses (so peak memory is per conversion):
conversion wall time (best of --repeat), peak RSS, package size, non-const op count, and on
macOS the median prediction latency on --compute-units. Prints each metric and the ratio
rlx_mil / PyTorch measured in the same run.

    pip install -e . torch && python benchmarks/bench_convert.py [--layers 4 --hidden 512 --seq 128]

PyTorch is only needed here (an optional extra), never by rlx_mil itself.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent


def _quiet() -> None:
    import logging
    import warnings

    os.environ.setdefault("TQDM_DISABLE", "1")
    logging.getLogger("coremltools").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def _config(args: argparse.Namespace) -> Any:
    from rlx_mil.models.transformer import DecoderConfig

    return DecoderConfig(hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                         intermediate=args.intermediate or 2 * args.hidden, layers=args.layers, seq=args.seq)


def torch_decoder(config: Any, params: dict[str, np.ndarray]) -> Any:
    """The same decoder as rlx_mil.models.transformer.llama_decoder, written in PyTorch."""
    import torch

    c = config
    d = c.head_dim
    p = {k: torch.from_numpy(v) for k, v in params.items()}

    def rms(x: Any, w: Any, b: Any) -> Any:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.eps) * w + b

    def rope(x: Any, heads: int) -> Any:
        x = x.view(c.batch, c.seq, heads, d)
        cos = p["rope.cos"][:, None, :]
        sin = p["rope.sin"][:, None, :]
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    class Decoder(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            for i in range(c.layers):
                w = {k[len(f"layers.{i}."):]: v for k, v in p.items() if k.startswith(f"layers.{i}.")}
                h = rms(x, w["input_layernorm.weight"], w["input_layernorm.bias"])
                q = rope(h @ w["self_attn.q_proj.weight"], c.heads).transpose(1, 2)
                k = rope(h @ w["self_attn.k_proj.weight"], c.kv_heads).transpose(1, 2)
                v = (h @ w["self_attn.v_proj.weight"]).view(c.batch, c.seq, c.kv_heads, d).transpose(1, 2)
                k = k.repeat_interleave(c.heads // c.kv_heads, dim=1)
                v = v.repeat_interleave(c.heads // c.kv_heads, dim=1)
                a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                a = a.transpose(1, 2).reshape(c.batch, c.seq, c.heads * d)
                x = x + a @ w["self_attn.o_proj.weight"]
                h = rms(x, w["post_attention_layernorm.weight"], w["post_attention_layernorm.bias"])
                g = h @ w["mlp.gate_proj.weight"]
                x = x + (torch.nn.functional.silu(g) * (h @ w["mlp.up_proj.weight"])) @ w["mlp.down_proj.weight"]
            return x

    return Decoder().eval()


def _package_stats(model: Any, out_dir: Path) -> dict[str, Any]:
    from rlx_mil.package_info import package_info

    path = out_dir / "model.mlpackage"
    model.save(str(path))
    info = package_info(path)
    return {"package_bytes": info.package_bytes, "ops": info.num_ops, "histogram": info.op_histogram}


def _latency(path: Path, inputs: dict[str, np.ndarray], units: str, runs: int = 20) -> float | None:
    if sys.platform != "darwin":
        return None
    import coremltools as ct

    model = ct.models.MLModel(str(path), compute_units=getattr(ct.ComputeUnit, units))
    model.predict(inputs)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        model.predict(inputs)
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def worker(args: argparse.Namespace) -> None:
    _quiet()
    import coremltools as ct

    import rlx_mil
    from rlx_mil.models.transformer import example_inputs, llama_decoder, random_params

    config = _config(args)
    graph = llama_decoder(config)
    params = random_params(graph, config)
    inputs = example_inputs(config)
    target = getattr(ct.target, args.target)
    best = float("inf")
    model: Any = None
    for _ in range(args.repeat):
        start = time.perf_counter()
        if args.worker == "rlx_mil":
            model = rlx_mil.convert(graph, params, target=args.target, precision=args.precision)
        else:
            import torch

            module = torch_decoder(config, params)
            example = torch.from_numpy(inputs["hidden"])
            traced = torch.jit.trace(module, example)
            model = ct.convert(
                traced, inputs=[ct.TensorType(name="hidden", shape=example.shape)],
                minimum_deployment_target=target, skip_model_load=True,
                compute_precision=ct.precision.FLOAT16 if args.precision == "fp16" else ct.precision.FLOAT32,
            )
        best = min(best, time.perf_counter() - start)
    out_dir = Path(tempfile.mkdtemp(prefix="rlx_bench_"))
    try:
        stats = _package_stats(model, out_dir)
        stats["latency_s"] = _latency(out_dir / "model.mlpackage", inputs, args.compute_units)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    stats["convert_s"] = best
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    stats["peak_rss_bytes"] = peak * (1 if sys.platform == "darwin" else 1024)
    print("BENCH_RESULT " + json.dumps(stats))


def _run_worker(name: str, argv: list[str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--worker", name, *argv], capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            return dict(json.loads(line[len("BENCH_RESULT "):]))
    raise SystemExit(f"{name} worker failed:\n{proc.stderr[-4000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=0)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--target", default="iOS18")
    parser.add_argument("--precision", default="fp16", choices=["fp16", "fp32"])
    parser.add_argument("--compute-units", default="ALL")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--worker", choices=["rlx_mil", "torch"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    argv = [a for a in sys.argv[1:]]
    print(f"decoder: {args.layers} layers, hidden {args.hidden}, heads {args.heads}/{args.kv_heads}, "
          f"seq {args.seq}, {args.target} {args.precision}")
    ours = _run_worker("rlx_mil", argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("PyTorch is not installed: only rlx_mil was measured (pip install torch for the comparison)")
        print(json.dumps({k: v for k, v in ours.items() if k != "histogram"}, indent=2))
        return
    theirs = _run_worker("torch", argv)
    print(f"{'metric':<22}{'rlx_mil':>14}{'torch->ct':>14}{'ratio':>10}")
    for key, label in (("convert_s", "convert time (s)"), ("peak_rss_bytes", "peak RSS (MB)"),
                       ("package_bytes", "package (MB)"), ("ops", "non-const ops"),
                       ("latency_s", "predict latency (ms)")):
        a, b = ours.get(key), theirs.get(key)
        if a is None or b is None:
            print(f"{label:<22}{'n/a':>14}{'n/a':>14}{'(macOS only)' if key == 'latency_s' else '':>10}")
            continue
        scale = {"peak_rss_bytes": 1 / 2**20, "package_bytes": 1 / 2**20, "latency_s": 1000.0}.get(key, 1.0)
        print(f"{label:<22}{a * scale:>14.3f}{b * scale:>14.3f}{a / b:>10.2f}")
    print("ratio = rlx_mil / (PyTorch -> coremltools); below 1 means rlx_mil is smaller/faster.")
    for name, stats in (("rlx_mil", ours), ("torch->ct", theirs)):
        hist = ", ".join(f"{k} {v}" for k, v in sorted(stats["histogram"].items(), key=lambda kv: -kv[1]) if k != "const")
        print(f"{name} ops: {hist}")


if __name__ == "__main__":
    main()
