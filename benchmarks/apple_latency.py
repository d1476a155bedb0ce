"""On-device latency of rlx_mil packages on Apple silicon (macOS only).

For each compute-unit setting (CPU_ONLY, CPU_AND_GPU, CPU_AND_NE, ALL):
  * load time: first load (compiles the model) and cached load, median and p90;
  * attention variants at S=128/1024 (fused `scaled_dot_product_attention` vs decomposed):
    prediction latency, median and p90 over --runs after --warmup;
  * the 16-layer decoder (prefill latency) and, from a random Llama checkpoint, a stateful
    package (prefill bucket + decode, `rlx_mil.llm.package`) in each deployment form
    (`deploy="plain"`, `"gpu"`, `"ane"`; docs/deploying.md): prefill latency, decode tokens/s
    and the op placement counts;
  * where the OS offers MLComputePlan (macOS 14.4+, coremltools' `MLComputePlan`), the device
    each op is placed on, counted per device.
Results print as a Markdown table and go to --json as JSON lines.

    python benchmarks/apple_latency.py [--runs 20 --warmup 3 --json latency.jsonl]

On any other OS it prints one line saying it needs macOS and exits 0.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
COMPUTE_UNITS = ("CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE", "ALL")
#: The deployment forms of `rlx_mil.convert(deploy=...)` measured on the stateful package.
DEPLOY_FORMS = ("plain", "gpu", "ane")
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000, "hidden_size": 1024,
    "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 2816,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
    "tie_word_embeddings": True,
}


def median_p90(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def timed(fn: Callable[[], Any], runs: int, warmup: int) -> tuple[float, float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return median_p90(times)


def placement(path: Path, units: str) -> dict[str, int] | None:
    """Ops per device from MLComputePlan, or None where the OS / coremltools cannot say."""
    try:
        import coremltools as ct
        from coremltools.models.compute_plan import MLComputePlan

        compiled = ct.models.utils.compile_model(str(path))
        plan = MLComputePlan.load_from_path(path=compiled, compute_units=getattr(ct.ComputeUnit, units))
        program = plan.model_structure.program
        if program is None:
            return None
        counts: Counter[str] = Counter()
        for function in program.functions.values():
            for op in function.block.operations:
                usage = plan.get_compute_device_usage_for_mlprogram_operation(op)
                if usage is not None:
                    counts[type(usage.preferred_compute_device).__name__.replace("ML", "").replace("ComputeDevice", "")] += 1
        return dict(counts)
    except Exception:  # older OS or coremltools: placement is optional
        return None


def measure_package(name: str, path: Path, feeds: dict[str, np.ndarray], args: argparse.Namespace) -> list[dict[str, Any]]:
    import coremltools as ct

    rows = []
    for units in COMPUTE_UNITS:
        cu = getattr(ct.ComputeUnit, units)
        start = time.perf_counter()
        model = ct.models.MLModel(str(path), compute_units=cu)
        first_load = time.perf_counter() - start
        loads = []
        for _ in range(3):
            start = time.perf_counter()
            ct.models.MLModel(str(path), compute_units=cu)
            loads.append(time.perf_counter() - start)
        median, p90 = timed(lambda model=model: model.predict(feeds), args.runs, args.warmup)
        rows.append({
            "case": name, "compute_units": units, "first_load_s": first_load, "cached_load_s": statistics.median(loads),
            "latency_median_s": median, "latency_p90_s": p90, "placement": placement(path, units),
        })
    return rows


def measure_stateful(path: Path, prompt: int, steps: int, args: argparse.Namespace, form: str = "plain") -> list[dict[str, Any]]:
    from rlx_mil.generate import Session

    rows = []
    for units in COMPUTE_UNITS:
        session = Session(path, engine="coreml", compute_units=units)
        tokens = list(range(1, prompt + 1))

        def prefill(session: Any = session, tokens: list[int] = tokens) -> None:
            session.reset()
            session.feed(tokens)

        prefill_median, prefill_p90 = timed(prefill, args.runs, args.warmup)
        decode_times = []
        for _ in range(max(1, args.runs // 4)):
            prefill()
            start = time.perf_counter()
            for t in range(steps):
                session.feed([t + 1])
            decode_times.append(steps / (time.perf_counter() - start))
        rate_median, _ = median_p90(decode_times)
        rows.append({
            "case": f"llama_stateful_{form}_p{prompt}", "compute_units": units, "prefill_median_s": prefill_median,
            "prefill_p90_s": prefill_p90, "decode_tokens_per_s_median": rate_median, "decode_tokens_per_s_p10": min(decode_times),
            "placement": placement(path, units),
        })
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if sys.platform != "darwin":
        print(f"apple_latency.py measures Core ML on Apple silicon and needs macOS (this is {platform.system()}); nothing to do")
        return 0

    sys.path.insert(0, str(HERE))
    from bench_models import DECODER16, attention_graph

    import rlx_mil
    from rlx_mil.llm.package import convert_llm_checkpoint
    from rlx_mil.models.random_checkpoint import write_random_checkpoint
    from rlx_mil.models.transformer import example_inputs, llama_decoder, random_params

    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for seq in (128, 1024):
            for variant in ("causal", "gqa", "window"):
                graph = attention_graph(f"attn_{variant}_s{seq}")
                feeds = {
                    n.op.name: rng.standard_normal(n.shape.sizes()).astype(np.float32)
                    for n in graph if n.op.type_name == "Input"
                }
                for attention in ("fused", "decomposed"):
                    path = rlx_mil.save(rlx_mil.convert(graph, {}, attention=attention), work / f"a_{variant}_{seq}_{attention}.mlpackage")
                    rows += measure_package(f"attn_{variant}_s{seq}_{attention}", path, feeds, args)
        decoder = llama_decoder(DECODER16)
        path = rlx_mil.save(rlx_mil.convert(decoder, random_params(decoder, DECODER16)), work / "decoder16.mlpackage")
        rows += measure_package("decoder16_prefill", path, example_inputs(DECODER16), args)
        checkpoint = write_random_checkpoint(work / "llama", TINY_LLAMA, dtype="bfloat16")
        for form in DEPLOY_FORMS:
            stateful = work / f"llama_stateful_{form}.mlpackage"
            convert_llm_checkpoint(checkpoint, stateful, max_context=512, prefill=[64], deploy=form)
            rows += measure_stateful(stateful, prompt=64, steps=32, args=args, form=form)

    keys = sorted({k for r in rows for k in r if k not in ("case", "compute_units", "placement")})
    print("| case | compute units | " + " | ".join(keys) + " | placement |")
    print("|" + "---|" * (len(keys) + 3))
    for r in rows:
        cells = ["" if k not in r else f"{r[k] * 1000:.2f} ms" if k.endswith("_s") else f"{r[k]:.1f}" for k in keys]
        print(f"| {r['case']} | {r['compute_units']} | " + " | ".join(cells) + f" | {r.get('placement') or ''} |")
    if args.json:
        with args.json.open("a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
