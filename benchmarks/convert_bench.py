"""Conversion benchmark: rlx_mil vs PyTorch -> coremltools on the same architectures, same run.

Every conversion runs in a fresh subprocess (so its peak RSS is its own), `--repeat` times.
Per conversion: wall time (convert + save, and where it went: lowering or trace / Core ML
passes / serialisation and save), peak RSS, MIL ops by type after the pass pipeline, fused
`scaled_dot_product_attention` count, `tile` count (K/V repeated per query head), bytes of
mask constants (consts whose last two dims are Sq x Sk) and of other constants, package size;
then the ratios rlx_mil / PyTorch. Results go to JSON lines (`--json`) and a Markdown table
(stdout, and `--markdown`).

Cases:
  decoder16    16-layer Llama-style decoder, hidden 1024, 16/4 heads, SwiGLU 2816, S=128; weights
               from a safetensors file (float32) written by the script.
  llama1b      Llama-3.2-1B-shaped (16 layers, hidden 2048, 32/8 heads, SwiGLU 8192, vocab
               128256 tied, S=128) from a BF16 Hugging Face checkpoint written by the script
               (rlx_mil.models.from_pretrained; PyTorch loads the same file, in float32).
  attention    single attention nodes: no mask, causal, GQA (causal, 8/2 heads), explicit scale,
               sliding window (256) at S=128/1024/4096.
  big          (--big) 8B-shaped BF16 checkpoint with int4 weight compression, rlx_mil only.
  stateful     (--stateful) the stateful 3-function package (decode, prefill 64, prefill 512) of
               the Qwen3-0.6B- and Llama-3.2-1B-shaped checkpoints against their plain prefill
               conversion (time ratio, peak RSS over fp16 weight bytes): stateful_convert_bench.py,
               run from here for each shape, rlx_mil only (PyTorch has no stateful conversion).

    pip install -e ".[bench]"   # PyTorch (CPU) for the peer
    python benchmarks/convert_bench.py --cases decoder16,attention --repeat 3 --json out.jsonl

Run it alone on the machine: llama1b's PyTorch conversion needs ~16 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_models import (  # noqa: E402
    ATTENTION_LENGTHS,
    ATTENTION_VARIANTS,
    BIG_CONFIG,
    DECODER16,
    LLAMA_1B_CONFIG,
    attention_graph,
    torch_attention,
    torch_decoder,
    torch_llama,
)
from peak_rss import peak_rss_bytes  # noqa: E402

SEQ = 128


def _quiet() -> None:
    import logging
    import warnings

    os.environ.setdefault("TQDM_DISABLE", "1")
    logging.getLogger("coremltools").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


class PassTimer:
    """Time spent in coremltools' pass pipelines (wraps PassPipelineManager.apply_pipeline)."""

    def __init__(self) -> None:
        from coremltools.converters.mil.mil.passes import pass_pipeline

        self.seconds = 0.0
        manager = pass_pipeline.PassPipelineManager
        original = manager.apply_pipeline

        def timed(prog: Any, pipeline: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(prog, pipeline)
            finally:
                self.seconds += time.perf_counter() - start

        manager.apply_pipeline = staticmethod(timed)


def program_stats(model: Any, q_len: int, kv_len: int) -> dict[str, Any]:
    """Ops by type after the pipeline, SDPA/tile counts and constant bytes (mask vs other)."""
    ops = list(model._mil_program.functions["main"].operations)
    hist = Counter(op.op_type for op in ops)
    mask_bytes = other_bytes = 0
    for op in ops:
        if not op.op_type.startswith("const"):
            continue
        for out in op.outputs:
            val = out.val if op.op_type == "const" else None
            shape = tuple(out.shape) if out.shape is not None else ()
            nbytes = int(np.asarray(val).nbytes) if val is not None else 0
            if len(shape) >= 2 and shape[-2:] == (q_len, kv_len):
                mask_bytes += nbytes
            else:
                other_bytes += nbytes
    return {
        "ops": dict(sorted(hist.items())),
        "non_const_ops": sum(v for k, v in hist.items() if not k.startswith("const")),
        "sdpa": hist.get("scaled_dot_product_attention", 0),
        "tile": hist.get("tile", 0),
        "mask_const_bytes": mask_bytes,
        "other_const_bytes": other_bytes,
    }


def package_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ---------------------------------------------------------------------------------- workers


def _rlx_worker(case: str, data: Path, out: Path) -> dict[str, Any]:
    import rlx_mil
    from rlx_mil import api

    timer = PassTimer()
    lowering = [0.0]
    original_lower = api.lower_graph

    def timed_lower(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        try:
            return original_lower(*a, **k)
        finally:
            lowering[0] += time.perf_counter() - start

    api.lower_graph = timed_lower
    start = time.perf_counter()
    kwargs: dict[str, Any] = {}
    if case == "decoder16":
        from rlx_mil.models.transformer import llama_decoder
        from rlx_mil.weights import open_safetensors

        graph = llama_decoder(DECODER16)
        params: Any = open_safetensors(data / "decoder16.safetensors")
    elif case in ("llama1b", "big"):
        from rlx_mil.models import from_pretrained

        graph, params = from_pretrained(data / case, seq_len=SEQ)
        if case == "big":
            kwargs["compress"] = "int4"
    else:
        graph, params = attention_graph(case), {}
    loaded = time.perf_counter()
    model = rlx_mil.convert(graph, params, target="iOS18", precision="fp16", **kwargs)
    converted = time.perf_counter()
    rlx_mil.save(model, out, overwrite=True)
    saved = time.perf_counter()
    convert_s = converted - loaded
    return {
        "wall_s": saved - start,
        "stages": {
            "load_graph": loaded - start,
            "lowering": lowering[0],
            "passes": timer.seconds,
            "serialise": convert_s - lowering[0] - timer.seconds,
            "save": saved - converted,
        },
        "model": model,
    }


def _torch_worker(case: str, data: Path, out: Path) -> dict[str, Any]:
    import coremltools as ct
    import torch

    timer = PassTimer()
    start = time.perf_counter()
    if case == "decoder16":
        from safetensors.numpy import load_file

        weights = {k: torch.from_numpy(v) for k, v in load_file(str(data / "decoder16.safetensors")).items()}
        module, example = torch_decoder(DECODER16, weights), torch.zeros(1, SEQ, DECODER16.hidden)
    elif case == "llama1b":
        from safetensors.torch import load_file as load_torch

        weights = {}
        for file in sorted((data / case).glob("*.safetensors")):
            weights.update({k: v.float() for k, v in load_torch(str(file)).items()})
        module, example = torch_llama(LLAMA_1B_CONFIG, weights, SEQ), torch.zeros(1, SEQ, dtype=torch.int32)
    else:
        module, example = torch_attention(case)  # type: ignore[assignment]
    loaded = time.perf_counter()
    with torch.no_grad():
        if isinstance(example, tuple):
            traced = torch.jit.trace(module, example)
            inputs = [ct.TensorType(name=f"in{i}", shape=e.shape) for i, e in enumerate(example)]
        else:
            traced = torch.jit.trace(module, example)
            dtype = np.int32 if example.dtype == torch.int32 else np.float32
            inputs = [ct.TensorType(name="in0", shape=example.shape, dtype=dtype)]
    traced_at = time.perf_counter()
    model = ct.convert(
        traced, inputs=inputs, minimum_deployment_target=ct.target.iOS18, compute_precision=ct.precision.FLOAT16,
        convert_to="mlprogram", skip_model_load=True,
    )
    converted = time.perf_counter()
    model.save(str(out))
    saved = time.perf_counter()
    return {
        "wall_s": saved - start,
        "stages": {
            "load_graph": loaded - start,
            "trace": traced_at - loaded,
            "passes": timer.seconds,
            "frontend_and_serialise": converted - traced_at - timer.seconds,
            "save": saved - converted,
        },
        "model": model,
    }


def worker(converter: str, case: str, data: Path) -> None:
    _quiet()
    if converter == "rlx_mil":
        # rlx_mil never uses PyTorch, but coremltools imports it whenever it is installed
        # (~200 MB of RSS): measure rlx_mil as it runs without the bench extra.
        sys.modules["torch"] = None  # type: ignore[assignment]
    out_dir = Path(tempfile.mkdtemp(prefix="rlx_bench_", dir=data))
    try:
        out = out_dir / "model.mlpackage"
        result = (_rlx_worker if converter == "rlx_mil" else _torch_worker)(case, data, out)
        model = result.pop("model")
        q_len, kv_len = (SEQ, SEQ) if case in ("decoder16", "llama1b", "big") else _attention_lengths(case)
        result.update(program_stats(model, q_len, kv_len))
        result["package_bytes"] = package_bytes(out)
        result["peak_rss_bytes"] = peak_rss_bytes()
        import rlx_mil  # after the peak: preflight reads the saved package (issue 26's check of both paths)

        result["preflight_ane"] = dict(Counter(f.rule for f in rlx_mil.preflight(out, device="ane") if f.severity != "note"))
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    print("BENCH_RESULT " + json.dumps(result))


def _attention_lengths(case: str) -> tuple[int, int]:
    seq = int(case.rsplit("_s", 1)[1])
    return seq, seq


# ---------------------------------------------------------------------------------- driver


def prepare(case: str, data: Path) -> None:
    """Write the checkpoint a case reads (once per run)."""
    if case == "decoder16" and not (data / "decoder16.safetensors").exists():
        from safetensors.numpy import save_file

        from rlx_mil.models.transformer import llama_decoder, random_params

        graph = llama_decoder(DECODER16)
        save_file(random_params(graph, DECODER16), str(data / "decoder16.safetensors"))
    elif case in ("llama1b", "big") and not (data / case).exists():
        from rlx_mil.models.random_checkpoint import write_random_checkpoint

        config = LLAMA_1B_CONFIG if case == "llama1b" else BIG_CONFIG
        write_random_checkpoint(data / case, config, dtype="bfloat16", shards=8 if case == "llama1b" else 32)


def run_one(converter: str, case: str, data: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", converter, "--case", case, "--data", str(data)],
        capture_output=True, text=True, check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            return dict(json.loads(line[len("BENCH_RESULT "):]))
    return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[0]["error"] if runs else "not run"}
    out = dict(ok[0])
    out["wall_s"] = statistics.median(r["wall_s"] for r in ok)
    out["wall_s_runs"] = [round(r["wall_s"], 3) for r in ok]
    out["peak_rss_bytes"] = statistics.median(r["peak_rss_bytes"] for r in ok)
    out["stages"] = {k: statistics.median(r["stages"][k] for r in ok) for k in ok[0]["stages"]}
    return out


def _cases(names: list[str], big: bool) -> list[str]:
    cases: list[str] = []
    for name in names:
        if name == "attention":
            cases += [f"attn_{v}_s{s}" for s in ATTENTION_LENGTHS for v in ATTENTION_VARIANTS]
        elif name:
            cases.append(name)
    if big:
        cases.append("big")
    return cases


def _mb(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.1f} MB"


def _ratio(a: float | None, b: float | None) -> str:
    return "" if not a or not b else f" ({a / b:.2f}x)"


def _pair(a: dict[str, Any], b: dict[str, Any], key: str, fmt: Any = str) -> str:
    theirs = b.get(key)
    return f"{fmt(a[key])} / {'n/a' if theirs is None else fmt(theirs)}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """One row per case: rlx_mil / PyTorch for each metric, ratios in parentheses."""
    head = ("| case | time (rlx_mil / PyTorch) | peak RSS | non-const ops | SDPA | tile | mask const bytes"
            " | other const bytes | package |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        a, b = row["rlx_mil"], row.get("torch") or {}
        if "error" in a:
            lines.append(f"| {row['case']} | rlx_mil failed: {a['error']} |" + " |" * 7)
            continue
        if "error" in b:
            b = {}
        lines.append(
            f"| {row['case']} | {_pair(a, b, 'wall_s', lambda v: f'{v:.2f} s')}{_ratio(a['wall_s'], b.get('wall_s'))}"
            f" | {_pair(a, b, 'peak_rss_bytes', _mb)}{_ratio(a['peak_rss_bytes'], b.get('peak_rss_bytes'))}"
            f" | {_pair(a, b, 'non_const_ops')} | {_pair(a, b, 'sdpa')} | {_pair(a, b, 'tile')}"
            f" | {_pair(a, b, 'mask_const_bytes', lambda v: f'{v:,}')} | {_pair(a, b, 'other_const_bytes', _mb)}"
            f" | {_pair(a, b, 'package_bytes', _mb)} |"
        )
    return "\n".join(lines)


def preflight_lines(rows: list[dict[str, Any]]) -> str:
    """Each package's Neural Engine preflight findings per rule (`rlx_mil.preflight`)."""
    lines = []
    for row in rows:
        for converter in ("rlx_mil", "torch"):
            found = (row.get(converter) or {}).get("preflight_ane")
            if found is not None:
                text = ", ".join(f"{rule} x{n}" for rule, n in sorted(found.items())) or "none"
                lines.append(f"- {row['case']} ({converter}): preflight --device ane: {text}")
    return "\n".join(lines)


def stage_lines(rows: list[dict[str, Any]]) -> str:
    out = []
    for row in rows:
        for conv in ("rlx_mil", "torch"):
            r = row.get(conv)
            if r and "error" not in r:
                parts = ", ".join(f"{k} {v:.2f} s" for k, v in r["stages"].items())
                out.append(f"{row['case']} {conv}: {parts}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="decoder16,llama1b,attention")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--torch-repeat", type=int, default=None, help="repetitions of the PyTorch peer (default: --repeat)")
    parser.add_argument("--big", action="store_true", help="add the 8B-shaped int4 case (rlx_mil only)")
    parser.add_argument("--no-torch", action="store_true", help="measure rlx_mil only")
    parser.add_argument("--stateful", action="store_true",
                        help="also the stateful 3-function conversions of the 0.6B and 1B shapes (see the module doc)")
    parser.add_argument("--data", type=Path, default=None, help="folder for checkpoints (default: a temp folder)")
    parser.add_argument("--json", type=Path, default=None, help="append one JSON line per case")
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--worker", choices=["rlx_mil", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.case, args.data)
        return
    try:
        import torch  # noqa: F401

        have_torch = not args.no_torch
    except ImportError:
        have_torch = False
        print("PyTorch is not installed (pip install -e '.[bench]'): measuring rlx_mil only", file=sys.stderr)
    data = args.data or Path(tempfile.mkdtemp(prefix="rlx_bench_data_"))
    data.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in _cases(args.cases.split(","), args.big):
        prepare(case, data)
        row: dict[str, Any] = {"case": case}
        for conv in ("rlx_mil", "torch"):
            if conv == "torch" and (not have_torch or case == "big"):
                continue
            runs = []
            repeat = args.repeat if conv == "rlx_mil" or args.torch_repeat is None else args.torch_repeat
            for i in range(repeat):
                print(f"{case}: {conv} run {i + 1}/{repeat}", file=sys.stderr, flush=True)
                runs.append(run_one(conv, case, data))
            row[conv] = summarise(runs)
        rows.append(row)
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps(row) + "\n")
    table = markdown(rows)
    print(table)
    print()
    print(stage_lines(rows))
    print()
    print(preflight_lines(rows))
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.stateful:
        for model in ("qwen3_0.6b", "llama1b"):
            print(f"stateful: {model}", file=sys.stderr, flush=True)
            print()
            # --work data: the llama1b case's checkpoint (data/llama1b) is reused, not written again
            command = [sys.executable, str(HERE / "stateful_convert_bench.py"), "--model", model, "--work", str(data)]
            if args.json:
                command += ["--json", str(args.json.with_name(f"{args.json.stem}_stateful_{model}.json"))]
            subprocess.run(command, check=True)
    if args.data is None:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
