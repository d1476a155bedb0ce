"""Low-rank correction of quantization error against widening, per added byte, on SmolLM2.

A compressed linear ``W ~ Q`` can carry a rank-r correction ``U V`` (``U`` [out, r], ``V``
[r, in]) of its error ``E = W - Q``: ``y = x Q^T + (x V^T) U^T`` (LQER, ZeroQuant-V2's LoRC).
The best rank-r correction of the layer's output error on inputs with second moment ``H`` is
the truncated SVD of ``E H^{1/2}`` mapped back by ``H^{-1/2}``; with only the diagonal of H
(``s_j = sqrt(H_jj)``, AWQ-style) it is the truncated SVD of ``E diag(s)``. This bench asks
whether the bytes such a correction costs buy more than the same bytes spent widening
`lut4-scaled` weights to `lut6` (group 16), the Neural Engine `auto4` plan's next step:

* the model: real SmolLM2-135M-Instruct (`real_checkpoints.smollm2`, the Q4_1 decode) as the
  float32 NumPy Llama of `gptq_lut_bench.py`, an `int8` tied embedding / head;
* the layers: a Neural Engine mix like the product's `--deploy ane --compress auto4` (default
  `q_proj` / `o_proj` `lut4-scaled` (60 weights, as the product's 60), `k_proj` / `v_proj`
  `int8`, `gate` / `up` / `down_proj` `lut6`), every weight fitted as `fit=on` does
  (activation-weighted table, GPTQ rounding, table refit) on the built-in calibration text's
  first 128 tokens (the product's), encoded codes cached under ``--work``;
* the corrections are fitted on the same 128 tokens' activations (H as `fit` builds it, per
  position normalised, 10 % damping for the full form); the factors are rounded to fp16 (or
  int8 with a per-row fp16 scale, ``--int8``);
* judged on the built-in held-out text (256 tokens): teacher-forced top-1 against the float
  model (all / where its top-2 gap is >= 0.5), mean KL, perplexity ratio; and per weight, the
  relative output error on the held-out activations (``|X (W - Q')^T| / |X W^T|``).

Bytes are counted as the package holds them (iOS26's scaled table: one table and an fp16
scale per row; `lut6` group 16: a 64-entry fp16 table per 16 rows) and reported as a fraction
of the fp16 weights' bytes (``x``).

    python benchmarks/lowrank_bench.py [--cache DIR] [--work DIR] [--ranks 4 8 16 32 64]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_checkpoints
from gptq_lut_bench import Llama, product_encode, quality

DEFAULT_MIX = "q_proj=lut4-scaled;o_proj=lut4-scaled;k_proj=int8;v_proj=int8;gate_proj=lut6;up_proj=lut6;down_proj=lut6"
DAMPING = 0.1


def scheme_bytes(spec: str, shape: tuple[int, ...]) -> float:
    """Package bytes of an [out, in] weight in `spec` (iOS26 forms)."""
    out, inp = shape
    n = out * inp
    if spec == "int8":
        return n + 2 * out
    if spec.endswith("-scaled"):
        bits = int(spec[3])
        return n * bits / 8 + 2 * (1 << bits) + 2 * out
    if spec.startswith("lut"):
        bits = int(spec[3])
        return n * bits / 8 + 2 * (1 << bits) * -(-out // 16)
    raise ValueError(spec)


def correction_bytes(shape: tuple[int, ...], rank: int, int8: bool) -> float:
    out, inp = shape
    return rank * (out + inp) + 2 * (out + rank) if int8 else 2 * rank * (out + inp)


def fitted(w: np.ndarray, spec: str, x: np.ndarray) -> np.ndarray:
    """`spec`'s codes of `w` fitted as `fit=on` does to the activations `x`, decoded."""
    from rlx_mil.compress import parse_scheme
    from rlx_mil.compress.fit import fit_to_shape
    from rlx_mil.compress.fitting import FitOptions, fit_codes, input_hessian
    from rlx_mil.compress.plan import store_dtype
    from rlx_mil.lowering.target import Precision, Target

    scheme = parse_scheme(spec)
    assert scheme is not None
    shaped, _ = fit_to_shape(scheme, tuple(w.shape), Target.IOS18)
    codes = fit_codes(w, shaped, store_dtype(Precision.FP16), "w", input_hessian(x), FitOptions(), activations=x)
    return codes.dequantize().astype(np.float32)


def round_factor(a: np.ndarray, int8: bool) -> np.ndarray:
    """`a` [rows, cols] as stored: fp16, or int8 per row with an fp16 scale."""
    if not int8:
        return a.astype(np.float16).astype(np.float32)
    peak = np.max(np.abs(a), axis=1, keepdims=True)
    scale = (np.where(peak > 0, peak, 1.0) / 127).astype(np.float16).astype(np.float32)
    return np.clip(np.round(a / scale), -127, 127) * scale


def weighted_svd(err: np.ndarray, h: np.ndarray, form: str) -> tuple[np.ndarray, np.ndarray]:
    """(left [out, k], right [k, in]) with err = left @ right, ordered by the share of the output
    error (for inputs of second moment `h`) each component carries: truncated to r, the best
    rank-r correction of that kind."""
    if form == "diag":
        s = np.sqrt(np.maximum(np.diag(h), 1e-12))
        u, sig, vt = np.linalg.svd(err * s[None, :], full_matrices=False)
        return u * sig, vt / s[None, :]
    if form == "full":
        hd = h + DAMPING * np.mean(np.diag(h)) * np.eye(h.shape[0])
        lam, basis = np.linalg.eigh(hd)
        root = (basis * np.sqrt(lam)) @ basis.T
        inv_root = (basis / np.sqrt(lam)) @ basis.T
        u, sig, vt = np.linalg.svd(err @ root, full_matrices=False)
        return u * sig, vt @ inv_root
    if form == "plain":
        u, sig, vt = np.linalg.svd(err, full_matrices=False)
        return u * sig, vt
    raise ValueError(form)


def correction(factors: tuple[np.ndarray, np.ndarray], rank: int, int8: bool) -> np.ndarray:
    """The rank-`rank` correction U V from `weighted_svd`'s factors, U and V rounded as stored."""
    left, right = factors[0][:, :rank], factors[1][:rank]
    # Balance the factors' magnitudes before rounding them (int8 rows then share one scale well).
    norm = np.sqrt(np.linalg.norm(left, axis=0) / np.maximum(np.linalg.norm(right, axis=1), 1e-30))
    left, right = left / np.maximum(norm, 1e-30), right * norm[:, None]
    return (round_factor(left.T, int8).T @ round_factor(right, int8)).astype(np.float32)


def rel_out(x: np.ndarray, w: np.ndarray, q: np.ndarray) -> float:
    return float(np.linalg.norm(x @ (w - q).T) / np.linalg.norm(x @ w.T))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path("/work/cache/rlx_mil_bench"))
    parser.add_argument("--work", type=Path, default=Path("/work/cache/lowrank_bench"),
                        help="where the fitted codes' decodes are cached between runs")
    parser.add_argument("--mix", default=DEFAULT_MIX, help="name-pattern=spec;... (first match wins)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    parser.add_argument("--forms", nargs="+", default=["diag", "full"])
    parser.add_argument("--int8", action="store_true", help="int8 factors (per-row fp16 scale), else fp16")
    parser.add_argument("--worst", type=int, nargs="*", default=[6, 15],
                        help="also correct only this many weights, the worst by held-out output error")
    parser.add_argument("--per-weight", action="store_true", help="only the per-weight output errors (no model runs)")
    parser.add_argument("--correct", choices=["lut4-scaled", "all"], default="lut4-scaled",
                        help="which weights the rank-r runs correct: the lut4-scaled ones, or every one not int8")
    parser.add_argument("--model-only", action="store_true", help="skip the per-weight output errors")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--cal-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    from rlx_mil.compress.builtin_text import builtin_text
    from rlx_mil.compress.fitting import input_hessian
    from rlx_mil.llm.text import TextTokenizer

    folder = real_checkpoints.smollm2(args.cache)
    tok = TextTokenizer(folder)
    held = np.asarray(tok.encode(builtin_text("heldout"))[:args.tokens])
    cal = np.asarray(tok.encode(builtin_text("calibration"))[:args.cal_tokens])
    model = Llama(folder)
    t0 = time.perf_counter()
    held_x: dict[str, Any] = {}
    want = model.forward(held, record=held_x)
    held_rows = {k: np.concatenate(v) for k, v in held_x.items()}
    cal_x: dict[str, Any] = {}
    model.forward(cal, record=cal_x)
    cal_rows = {k: np.concatenate(v) for k, v in cal_x.items()}
    print(f"float forwards: {time.perf_counter() - t0:.1f} s ({cal.size} calibration, {held.size} held-out tokens)", flush=True)
    mix = [tuple(item.split("=")) for item in args.mix.split(";") if item]
    names = model.linear_names()
    spec_of = {n: next(s for p, s in mix if p in n) for n in names}
    head = model.w["model.embed_tokens.weight"]
    head8 = product_encode(head, "int8")
    fp16_bytes = 2 * (head.size + sum(model.w[n].size for n in names))
    base_bytes = head.size + 2 * head.shape[0] + sum(scheme_bytes(spec_of[n], model.w[n].shape) for n in names)

    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def decoded(name: str, spec: str) -> np.ndarray:
        path = args.work / f"{name}.{spec}.{args.cal_tokens}.npy"
        if path.exists():
            return np.load(path)
        q = fitted(model.w[name], spec, cal_rows[name])
        np.save(path, q)
        return q

    base = {n: decoded(n, spec_of[n]) for n in names}
    narrow = [n for n in names if spec_of[n] == "lut4-scaled"]
    wide = {n: decoded(n, "lut6") for n in narrow}
    print(f"fitted codes: {time.perf_counter() - t0:.0f} s ({len(names)} + {len(wide)} weights)", flush=True)

    def judge(label: str, replaced: dict[str, np.ndarray], added: float) -> None:
        new = dict(model.w)
        new.update(base)
        new.update(replaced)
        q = quality(want, model.forward(held, new, head=head8), held)
        print(f"{label:44s} {(base_bytes + added) / fp16_bytes:.4f}x (+{added / fp16_bytes:.4f}): top-1 {q['top1']:.3f} / "
              f"{q['gap']:.3f}, KL {q['kl']:.4f}, ppl x{q['ppl']:.3f}", flush=True)

    if not args.per_weight:
        judge("mix (fit=on)", {}, 0.0)
    hess = {n: input_hessian(cal_rows[n]) for n in names}
    svds: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}

    def fix(n: str, rank: int, form: str) -> np.ndarray:
        if (n, form) not in svds:
            svds[n, form] = weighted_svd(model.w[n] - base[n], hess[n], form)
        return base[n] + correction(svds[n, form], rank, args.int8)
    out_err = {n: rel_out(held_rows[n], model.w[n], base[n]) for n in names}
    worst = sorted(names, key=lambda n: -out_err[n])
    print("worst held-out output errors: " + ", ".join(f"{n.split('layers.')[1]} {spec_of[n]} {out_err[n]:.3f}"
                                                      for n in worst[:15]), flush=True)

    wide_err = {n: rel_out(held_rows[n], model.w[n], wide[n]) for n in narrow}
    if not args.model_only:
        # Per weight, held-out output error: lut4-scaled -> lut6 against rank-r corrections at the same bytes.
        print("per weight (lut4-scaled ones), held-out relative output error:")
        gains: dict[str, list[float]] = {}
        for n in narrow:
            w = model.w[n]
            widen = scheme_bytes("lut6", w.shape) - scheme_bytes("lut4-scaled", w.shape)
            same = max(1, int(widen // correction_bytes(w.shape, 1, args.int8)))
            row = [out_err[n], wide_err[n]]
            for form in args.forms:
                row.append(rel_out(held_rows[n], w, fix(n, same, form)))
            gains[n] = row
            if n in narrow[:4] or n in worst[:15]:
                print(f"  {n}: lut4-scaled {row[0]:.4f}, lut6 {row[1]:.4f}, rank {same} "
                      + ", ".join(f"{f} {v:.4f}" for f, v in zip(args.forms, row[2:], strict=True)), flush=True)
        mean = np.mean(np.asarray(list(gains.values())), axis=0)
        print(f"  mean of {len(narrow)}: lut4-scaled {mean[0]:.4f}, lut6 {mean[1]:.4f}, same-bytes rank "
              + ", ".join(f"{f} {v:.4f}" for f, v in zip(args.forms, mean[2:], strict=True)), flush=True)
        # Removed share of the squared held-out output error per byte, relative to widening's.
        for form in args.forms:
            parts = []
            for rank in args.ranks:
                ratio = []
                for n in narrow:
                    w = model.w[n]
                    widen = scheme_bytes("lut6", w.shape) - scheme_bytes("lut4-scaled", w.shape)
                    after = rel_out(held_rows[n], w, fix(n, rank, form))
                    by_rank = (out_err[n] ** 2 - after ** 2) / correction_bytes(w.shape, rank, args.int8)
                    ratio.append(by_rank / ((out_err[n] ** 2 - wide_err[n] ** 2) / widen))
                parts.append(f"rank {rank} {np.mean(ratio):.2f}")
            print(f"  {form}: error removed per byte, relative to lut6's (mean of {len(narrow)}): " + ", ".join(parts), flush=True)
    if args.per_weight:
        return 0

    # The model: every lut4-scaled weight corrected at rank r, against widening as many bytes' worth.
    order = sorted(narrow, key=lambda n: -(out_err[n] ** 2 - wide_err[n] ** 2))
    corrected = narrow if args.correct == "lut4-scaled" else [n for n in names if spec_of[n] != "int8"]
    for rank in args.ranks:
        added = sum(correction_bytes(model.w[n].shape, rank, args.int8) for n in corrected)
        for form in args.forms:
            fixed = {n: fix(n, rank, form) for n in corrected}
            judge(f"{args.correct} + rank {rank} ({form}{', int8' if args.int8 else ''})", fixed, added)
        widened, spent = {}, 0.0
        for n in order:
            cost = scheme_bytes("lut6", model.w[n].shape) - scheme_bytes("lut4-scaled", model.w[n].shape)
            if spent + cost > added * 1.0001:
                break
            widened[n], spent = wide[n], spent + cost
        judge(f"{len(widened)} of them lut6 instead", widened, spent)
    # Only the worst weights (any scheme but int8), at a high rank.
    for count in args.worst:
        chosen = [n for n in worst if spec_of[n] != "int8"][:count]
        for rank in (16, 64):
            added = sum(correction_bytes(model.w[n].shape, rank, args.int8) for n in chosen)
            fixed = {n: fix(n, rank, "diag") for n in chosen}
            judge(f"worst {count} + rank {rank} (diag)", fixed, added)
        wider = {n: "lut6" if spec_of[n] == "lut4-scaled" else "int8" for n in chosen}
        widened = {n: decoded(n, wider[n]) for n in chosen}
        spent = sum(scheme_bytes(wider[n], model.w[n].shape) - scheme_bytes(spec_of[n], model.w[n].shape) for n in chosen)
        judge(f"worst {count} one step wider instead", widened, spent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
