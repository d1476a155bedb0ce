"""Where a GGUF-converted package's weight bytes go, per llama.cpp tensor type.

For each file kind (every 2-D tensor of one type, or a Q4_K_M-style mix) a small Llama GGUF
file is written the way the tests write them (tests/models/gguf/gguf_files.py), converted with
`from_gguf` + `rlx_mil.convert` (stateless, the target and precision asked: iOS18 and fp16 by
default) and saved. The table
gives the file's tensor bytes, the package's `weight.bin`, their ratio, and the package's
bytes split by what the constexpr ops hold: codes (data / indices), block scales, block
offsets, LUT entries (with the scales of a quantized LUT). Nothing is downloaded.

    python benchmarks/gguf_size.py [--hidden 512] [--layers 2] [--precision fp16] [--target iOS18|iOS26]
                                   [--kinds Q4_K Q6_K ...]

`--gguf FILE` measures an existing file instead (converted stateless, `--seq-len 8`): per
llama.cpp type the file's tensor bytes against the package's (from its compression report),
and the whole `weight.bin` against all the file's tensor bytes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: llama.cpp's Q4_K_M keeps these at Q6_K (all layers here; llama.cpp does about half of
#: attn_v / ffn_down, and the output or, tied, the token embedding).
Q6_TENSORS = ("output.weight", "attn_v.weight", "ffn_down.weight")
KINDS = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "Q4_K_M")


def q6_k_blocks(x: np.ndarray) -> np.ndarray:
    """Q6_K blocks of `[rows, K]` float weights as llama.cpp's reference quantizer makes them,
    without its scale search: per 16 weights the scale puts the largest on -32, the int8
    sub-scales are against d = max |scale| / 127 per 256 (block layout of ggml-common.h)."""
    rows = x.shape[0]
    sb = x.reshape(-1, 256).astype(np.float64)
    sub = sb.reshape(-1, 16, 16)
    amax_idx = np.argmax(np.abs(sub), axis=2)
    peak = np.take_along_axis(sub, amax_idx[..., None], axis=2)[..., 0]
    scale = -peak / 32.0
    d = np.max(np.abs(scale), axis=1) / 127.0
    d16 = d.astype(np.float16)
    dd = d16.astype(np.float64)
    sc = np.clip(np.rint(np.divide(scale, dd[:, None], out=np.zeros_like(scale), where=dd[:, None] > 0)), -128, 127).astype(np.int8)
    eff = dd[:, None] * sc
    q = np.clip(np.rint(np.divide(sub, eff[..., None], out=np.zeros_like(sub), where=eff[..., None] != 0)), -32, 31).astype(np.int16) + 32
    q = q.reshape(-1, 256).astype(np.uint8)
    out = np.zeros((sb.shape[0], 210), np.uint8)
    for half in range(2):
        qq = q[:, 128 * half:128 * (half + 1)]
        i = np.arange(32)
        q1, q2, q3, q4 = qq[:, i], qq[:, i + 32], qq[:, i + 64], qq[:, i + 96]
        out[:, 64 * half + i] = (q1 & 0xF) | ((q3 & 0xF) << 4)
        out[:, 64 * half + 32 + i] = (q2 & 0xF) | ((q4 & 0xF) << 4)
        out[:, 128 + 32 * half + i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = d16.reshape(-1, 1).view(np.uint8)
    return out.reshape(rows, -1)


def type_picker(kind: str) -> Callable[[str, tuple[int, ...]], str]:
    if kind == "Q4_K_M":
        return lambda name, shape: "Q6_K" if name.endswith(Q6_TENSORS) else "Q4_K"
    return lambda name, shape: kind


def _bits(dtype: Any) -> int:
    from coremltools.converters.mil.mil import types

    return int(types.type_mapping.nptype_from_builtin(dtype).itemsize * 8) if not hasattr(dtype, "get_bitwidth") \
        else int(dtype.get_bitwidth())


def _var_bytes(var: Any) -> int:
    count = int(np.prod(var.shape)) if var.shape else 1
    return (count * _bits(var.dtype) + 7) // 8


def component_bytes(program: Any) -> dict[str, int]:
    """Bytes of the program's compressed-weight constants by role, each const once (Core ML's
    const_deduplication shares equal tables, e.g. the LUT of same-shaped IQ4 tensors)."""
    roles: dict[int, tuple[str, Any]] = {}

    def note(var: Any, role: str) -> None:
        if var is not None and var.op is not None and var.op.op_type == "const":
            roles.setdefault(id(var), (role, var))

    for fn in program.functions.values():
        for op in fn.operations:
            if op.op_type == "constexpr_lut_to_dense":
                note(op.indices, "codes")
                note(op.lut, "lut")
            elif op.op_type == "constexpr_blockwise_shift_scale":
                into_lut = any(c.op_type == "constexpr_lut_to_dense" for c in op.outputs[0].child_ops)
                prefix = "lut " if into_lut else ""
                note(op.data, "lut" if into_lut else "codes")
                note(op.scale, prefix + "scales")
                note(op.offset, prefix + "offsets")
        for op in fn.operations:
            var = op.outputs[0] if op.op_type == "const" else None
            if var is not None and var.shape and int(np.prod(var.shape)) >= 64:
                note(var, "dense")
    out: dict[str, int] = defaultdict(int)
    for role, var in roles.values():
        out[role] += _var_bytes(var)
    return dict(out)


def measure(kind: str, hidden: int, layers: int, precision: str, work: Path, requantize: str | None = None,
            realistic: bool = False, target: str = "iOS18") -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests"))
    from models.gguf.gguf_files import write_gguf

    import rlx_mil
    from rlx_mil.compress import report_of
    from rlx_mil.models import from_gguf
    from rlx_mil.models.checkpoint import Checkpoint
    from rlx_mil.models.gguf.reader import GGUFFile
    from rlx_mil.models.random_checkpoint import write_random_checkpoint

    cfg = {"model_type": "llama", "vocab_size": 1024, "hidden_size": hidden, "num_hidden_layers": layers,
           "num_attention_heads": hidden // 64, "num_key_value_heads": max(1, hidden // 128), "head_dim": 64,
           "intermediate_size": 3 * hidden, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
           "architectures": ["LlamaForCausalLM"]}
    folder = work / kind
    if realistic:  # Q6_K from the float weights, not the tests' random block fields
        import models.gguf.gguf_files as files

        random_fields = files.encode
        files.encode = lambda values, type_name: q6_k_blocks(values) if type_name == "Q6_K" else random_fields(values, type_name)
    ckpt = write_random_checkpoint(folder / "hf", cfg, seed=0)
    weights = Checkpoint(ckpt)
    path = folder / "m.gguf"
    write_gguf(path, cfg, {k: weights[k] for k in weights}, types=type_picker(kind))
    file = GGUFFile(path)
    by_type: dict[str, int] = defaultdict(int)
    for t in file.tensors.values():
        by_type[t.type_name] += int(t.raw.nbytes)
    graph, params = from_gguf(path, seq_len=8, requantize=requantize)
    model = rlx_mil.convert(graph, params, precision=precision, target=target)
    parts = component_bytes(model._mil_program)
    report = report_of(model)
    errors: dict[str, float] = defaultdict(float)
    for w in report.weights if report is not None else []:
        errors[w.scheme] = max(errors[w.scheme], w.relative_error)
    out = folder / "p.mlpackage"
    model.save(str(out))
    package = (out / "Data" / "com.apple.CoreML" / "weights" / "weight.bin").stat().st_size
    gguf_bytes = sum(by_type.values())
    return {"kind": kind, "gguf": gguf_bytes, "package": package, "parts": parts, "types": dict(by_type),
            "errors": dict(errors)}


def measure_file(path: Path, precision: str, target: str, work: Path) -> None:
    """Per-type and total bytes of an existing GGUF file's package (see the module doc)."""
    import resource
    import time

    import rlx_mil
    from rlx_mil.compress import report_of
    from rlx_mil.models import from_gguf
    from rlx_mil.models.gguf.reader import GGUFFile

    start, cpu = time.perf_counter(), time.process_time()
    file = GGUFFile(path)
    graph, params = from_gguf(path, seq_len=8, last_logits=True)
    model = rlx_mil.convert(graph, params, precision=precision, target=target)
    report = report_of(model)
    out = work / "p.mlpackage"
    rlx_mil.save(model, out)
    package = (out / "Data" / "com.apple.CoreML" / "weights" / "weight.bin").stat().st_size
    names = getattr(params, "names", {})
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for w in report.weights if report is not None else []:
        kind = file.tensors[names[w.name]].type_name
        rows[kind][0] += 1
        rows[kind][1] += int(file.tensors[names[w.name]].raw.nbytes)
        rows[kind][2] += w.bytes_after
    total = sum(int(t.raw.nbytes) for t in file.tensors.values())
    print(f"{path.name}: {target}, {precision}; {time.perf_counter() - start:.1f} s wall, {time.process_time() - cpu:.1f} s"
          f" CPU, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    print("| type | tensors | file bytes | package bytes | package / file |")
    print("|---|---|---|---|---|")
    for kind, (count, before, after) in sorted(rows.items()):
        print(f"| {kind} | {count} | {before:,} | {after:,} | {after / before:.3f} |")
    print(f"| all (weight.bin) | {len(file.tensors)} | {total:,} | {package:,} | {package / total:.3f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--target", default="iOS18", help="deployment target (iOS26: the LUT-then-scale forms)")
    ap.add_argument("--kinds", nargs="*", default=list(KINDS))
    ap.add_argument("--requantize", help="from_gguf(requantize=...), e.g. Q6_K=lut6")
    ap.add_argument("--realistic-q6k", action="store_true",
                    help="Q6_K tensors quantized from the float weights (q6_k_blocks) instead of random block fields")
    ap.add_argument("--gguf", type=Path, help="measure this GGUF file instead of generated ones")
    args = ap.parse_args()
    if args.gguf is not None:
        with tempfile.TemporaryDirectory() as tmp:
            measure_file(args.gguf, args.precision, args.target, Path(tmp))
        return
    roles = ("codes", "scales", "offsets", "lut", "lut scales", "lut offsets", "dense")
    print("| file | GGUF tensor bytes | weight.bin | ratio | " + " | ".join(roles) + " | largest relative error |")
    print("|---|---|---|---|" + "---|" * len(roles) + "---|")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds:
            r = measure(kind, args.hidden, args.layers, args.precision, Path(tmp), args.requantize, args.realistic_q6k,
                        args.target)
            cells = " | ".join(str(r["parts"].get(role, 0)) for role in roles)
            errors = ", ".join(f"{k} {v:.2e}" for k, v in sorted(r["errors"].items()))
            print(f"| {kind} | {r['gguf']} | {r['package']} | {r['package'] / r['gguf']:.3f} | {cells} | {errors} |", flush=True)


if __name__ == "__main__":
    main()
