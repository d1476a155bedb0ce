"""Error-compensating (GPTQ-style) rounding onto Neural Engine palettes, in NumPy, on SmolLM2.

Measures, on the real SmolLM2-135M-Instruct weights (`real_checkpoints.smollm2`), what a
weight's rounding does to the model when the codes are chosen with the calibration
activations' second moments instead of nearest-value rounding:

* ``lut4s``: `lut4-scaled` as the product encodes it (`rlx_mil.compress.plan.encode`);
* ``lut4s+MODE``: fitted to the calibration activations (`rlx_mil.compress.fitting`), MODE
  naming the parts: ``aw`` (the table fitted by k-means weighted by the Hessian's diagonal),
  ``gptq`` (codes rounded column by column with the inverse-Hessian error feedback), ``refit``
  (one table's entries refitted to those codes), ``rescale`` (a scaled table's per-row scales
  refitted to them); ``lut4s+aw-gptq-refit`` is `fit=on`;
* mixes of the above with `lut6` / `int8` as the ANE `auto4` plan chooses them (``--mix``);
* ``--sequential``: each layer fitted to the inputs the already-encoded layers before it
  produce on the calibration tokens (GPTQ's order), not to the float model's.

The model runs as a float32 NumPy Llama forward (checked against `rlx_mil.reference` on the
first tokens), calibrated on the built-in calibration text (all its tokens) and measured on the
built-in held-out text (256 tokens, as the conversion's check): teacher-forced top-1 (all / where
the float model's top-2 gap is >= 0.5), mean KL and the perplexity ratio against the float model.

    python benchmarks/gptq_lut_bench.py [--cache DIR] [--configs lut4s lut4s+gptq ...] [--sequential]
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

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class Llama:
    """A float32 NumPy Llama forward over one sequence, optionally recording each linear's input."""

    def __init__(self, folder: Path) -> None:
        import json

        from safetensors.numpy import load_file

        cfg = json.loads((folder / "config.json").read_text())
        self.cfg = cfg
        self.w: dict[str, np.ndarray] = {k: v.astype(np.float32) for k, v in load_file(folder / "model.safetensors").items()}
        self.layers = int(cfg["num_hidden_layers"])
        self.heads, self.kv = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
        self.hd = int(cfg["hidden_size"]) // self.heads
        self.eps = float(cfg["rms_norm_eps"])
        self.theta = float(cfg.get("rope_theta", 10000.0))

    def linear_names(self) -> list[str]:
        return [f"model.layers.{i}.{'self_attn' if p[0] in 'qkvo' else 'mlp'}.{p}.weight"
                for i in range(self.layers) for p in LINEARS]

    def _norm(self, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + self.eps) * g

    def forward(self, ids: np.ndarray, w: dict[str, np.ndarray] | None = None, record: dict[str, Any] | None = None,
                head: np.ndarray | None = None) -> np.ndarray:
        w = self.w if w is None else w
        x = self.w["model.embed_tokens.weight"][ids] if head is None else head[ids]
        for i in range(self.layers):
            x = self.layer(i, x, w, record)
        x = self._norm(x, self.w["model.norm.weight"])
        table = self.w["model.embed_tokens.weight"] if head is None else head
        return x @ table.T

    def layer(self, i: int, x: np.ndarray, w: dict[str, np.ndarray], record: dict[str, Any] | None = None,
              until: str | None = None) -> np.ndarray:
        """Layer i on the residual stream `x` ([positions, hidden]) with weights `w`; with
        `until` (a projection of `SEQUENTIAL_GROUPS`) it stops once that projection's input is
        recorded (returns `x` unchanged)."""
        t = x.shape[0]
        inv = 1.0 / self.theta ** (np.arange(0, self.hd, 2) / self.hd)
        ang = np.arange(t)[:, None] * inv[None, :]
        cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

        def rope(z: np.ndarray) -> np.ndarray:
            h = self.hd // 2
            rot = np.concatenate([-z[..., h:], z[..., :h]], -1)
            return (z * cos + rot * sin).astype(np.float32)

        def lin(name: str, a: np.ndarray) -> np.ndarray:
            if record is not None:
                record.setdefault(name, []).append(a)
            return a @ w[name].T

        p = f"model.layers.{i}."
        mask = np.triu(np.full((t, t), -np.inf, np.float32), 1)
        h = self._norm(x, self.w[p + "input_layernorm.weight"])
        q = lin(p + "self_attn.q_proj.weight", h).reshape(t, self.heads, self.hd).transpose(1, 0, 2)
        k = lin(p + "self_attn.k_proj.weight", h).reshape(t, self.kv, self.hd).transpose(1, 0, 2)
        v = lin(p + "self_attn.v_proj.weight", h).reshape(t, self.kv, self.hd).transpose(1, 0, 2)
        if until == "q_proj":
            return x
        q, k = rope(q), rope(k)
        rep = self.heads // self.kv
        k, v = np.repeat(k, rep, 0), np.repeat(v, rep, 0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(self.hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = (s @ v).transpose(1, 0, 2).reshape(t, -1)
        x = x + lin(p + "self_attn.o_proj.weight", o)
        if until == "o_proj":
            return x
        h = self._norm(x, self.w[p + "post_attention_layernorm.weight"])
        g = lin(p + "mlp.gate_proj.weight", h)
        u = lin(p + "mlp.up_proj.weight", h)
        if until == "gate_proj":
            return x
        return x + lin(p + "mlp.down_proj.weight", (g / (1 + np.exp(-g)) * u).astype(np.float32))

    def full_name(self, i: int, proj: str) -> str:
        return f"model.layers.{i}.{'self_attn' if proj[0] in 'qkvo' else 'mlp'}.{proj}.weight"


#: Projections that share an input, in the order a layer reaches them (`--sequential`).
SEQUENTIAL_GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))


def sequential_encode(model: Llama, cal: np.ndarray, encode: Any) -> dict[str, np.ndarray]:
    """Every layer's weights encoded in order, each fitted to the inputs the already-encoded
    weights before it produce on the calibration tokens (GPTQ's sequential calibration):
    `encode(name, activations)` -> the decoded weight."""
    new = dict(model.w)
    x = model.w["model.embed_tokens.weight"][cal]
    for i in range(model.layers):
        for group in SEQUENTIAL_GROUPS:
            record: dict[str, Any] = {}
            model.layer(i, x, new, record, until=group[0] if group[0] != "down_proj" else None)
            for proj in group:
                name = model.full_name(i, proj)
                new[name] = encode(name, np.concatenate(record[name]))
        x = model.layer(i, x, new)
    return new


def quality(want: np.ndarray, got: np.ndarray, ids: np.ndarray) -> dict[str, float]:
    def logsm(z: np.ndarray) -> np.ndarray:
        z = z.astype(np.float64)
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    lw, lg = logsm(want), logsm(got)
    same = got.argmax(-1) == want.argmax(-1)
    top2 = np.sort(want, -1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) >= 0.5
    nxt = ids[1:]
    rows = np.arange(nxt.size)
    nll_w, nll_g = -lw[rows, nxt].mean(), -lg[rows, nxt].mean()
    return {"top1": float(same.mean()), "gap": float(same[clear].mean()),
            "kl": float(np.mean(np.sum(np.exp(lw) * (lw - lg), -1))), "ppl": float(np.exp(nll_g - nll_w))}


SHORT = {"lut4s": "lut4-scaled", "lut6s": "lut6-scaled", "lut3s": "lut3-scaled"}


def encode_codes(w: np.ndarray, spec: str, hessian: np.ndarray | None = None, mode: str = "",
                 activations: np.ndarray | None = None) -> Any:
    """`spec`'s codes of `w` as an iOS18 conversion holds them: plain (`mode` empty, as
    `rlx_mil.compress.plan.encode`) or fitted to the calibration (`mode` naming the parts)."""
    from rlx_mil.compress import parse_scheme
    from rlx_mil.compress.fit import fit_to_shape
    from rlx_mil.compress.fitting import FitOptions, fit_codes
    from rlx_mil.compress.plan import encode, store_dtype
    from rlx_mil.lowering.target import Precision, Target

    scheme = parse_scheme(SHORT.get(spec, spec))
    assert scheme is not None
    fitted, _ = fit_to_shape(scheme, tuple(w.shape), Target.IOS18)
    if not mode or hessian is None:
        return encode(w, fitted, Precision.FP16, "w")
    options = FitOptions(weighted="aw" in mode, gptq="gptq" in mode, refit="refit" in mode, rescale="rescale" in mode)
    return fit_codes(w, fitted, store_dtype(Precision.FP16), "w", hessian, options, activations=activations)


def package_bytes(codes: Any) -> tuple[int, int]:
    """(iOS18 bytes, iOS26 bytes) of one weight's codes (`compressed_bytes`)."""
    from rlx_mil.compress.emit import compressed_bytes
    from rlx_mil.lowering.target import Target

    return compressed_bytes(codes, Target.IOS18), compressed_bytes(codes, Target.IOS26)


def product_encode(w: np.ndarray, spec: str) -> np.ndarray:
    return encode_codes(w, spec).dequantize().astype(np.float32)


def fitted_encode(w: np.ndarray, spec: str, hessian: np.ndarray | None, mode: str,
                  activations: np.ndarray | None = None) -> np.ndarray:
    return encode_codes(w, spec, hessian, mode, activations).dequantize().astype(np.float32)


def output_errors(model: Llama, args: argparse.Namespace, held: np.ndarray, acts: dict[str, np.ndarray],
                  hess: dict[str, np.ndarray], mix: list[Any]) -> int:
    """Each weight of `--layers` alone in every `--configs` scheme: its relative squared output
    error on the held-out text's activations (`|X (W - Q)^T|^2 / |X W^T|^2`, X the float model's
    inputs of that weight) and its bytes on iOS18 / iOS26 against fp16's."""
    record: dict[str, Any] = {}
    model.forward(held, record=record)
    held_acts = {name: np.concatenate(xs).astype(np.float64) for name, xs in record.items()}
    layers = range(model.layers) if args.layers is None else args.layers
    names = [model.full_name(i, p) for i in layers for p in LINEARS]
    print(f"held-out relative output error per weight ({held.size} positions), layers {list(layers)}")
    print("config: " + " ".join(f"{p:>9}" for p in LINEARS) + " |   mean  | iOS18 x / iOS26 x  | s")
    for config in args.configs:
        base, _, mode = config.partition("+")
        t0 = time.perf_counter()
        errs: dict[str, list[float]] = {p: [] for p in LINEARS}
        b18 = b26 = before = 0
        for name in names:
            spec = base
            for pattern, s in mix:
                if pattern in name:
                    spec = s
            w = model.w[name]
            codes = encode_codes(w, spec, hess[name], mode, acts[name])
            x = held_acts[name]
            want = x @ w.T.astype(np.float64)
            got = x @ codes.dequantize().astype(np.float64).T
            errs[name.split(".")[-2]].append(float(np.sum((got - want) ** 2) / np.sum(want ** 2)))
            a, c = package_bytes(codes)
            b18, b26, before = b18 + a, b26 + c, before + 2 * w.size
        means = [float(np.mean(errs[p])) for p in LINEARS]
        print(f"{config}: " + " ".join(f"{m:9.5f}" for m in means) + f" | {np.mean(means):.5f} |"
              f" {b18 / before:.4f} / {b26 / before:.4f} | {time.perf_counter() - t0:.0f}", flush=True)
    return 0


def per_layer(model: Llama, args: argparse.Namespace, cal: np.ndarray, held: np.ndarray, want: np.ndarray,
              acts: dict[str, np.ndarray], hess: dict[str, np.ndarray], head8: np.ndarray, mix: list[Any]) -> int:
    """Each layer alone in `--configs`' first scheme, fitted (`fit=on`) and plain: its
    mean KL on the calibration tokens the fit used, on those it did not, and on the held-out text."""
    fit = args.fit_tokens or cal.size
    want_cal = model.forward(cal)

    def kl(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
        def logsm(z: np.ndarray) -> np.ndarray:
            z = z.astype(np.float64) - z.max(-1, keepdims=True)
            return z - np.log(np.exp(z).sum(-1, keepdims=True))
        a, b = logsm(ref), logsm(got)
        return np.sum(np.exp(a) * (a - b), -1)

    spec0 = SHORT.get(args.configs[0].partition("+")[0], args.configs[0].partition("+")[0])
    print(f"per layer, {spec0} ({fit} fit tokens, {cal.size - fit} held apart, {held.size} held out):"
          " layer: fitted KL fit / apart / held-out; plain KL fit / apart / held-out", flush=True)
    sums = np.zeros(6)
    for i in range(model.layers) if args.layers is None else args.layers:
        row = []
        for fitted in (True, False):
            new = dict(model.w)
            for name in model.linear_names():
                if f"layers.{i}." not in name:
                    continue
                spec = spec0
                for pattern, s in mix:
                    if pattern in name:
                        spec = s
                new[name] = (fitted_encode(model.w[name], spec, hess[name], "aw-gptq-refit", acts[name]) if fitted
                             else product_encode(model.w[name], spec))
            k_cal = kl(want_cal, model.forward(cal, new))
            k_held = kl(want, model.forward(held, new))
            row += [float(k_cal[:fit].mean()), float(k_cal[fit:].mean()) if cal.size > fit else float("nan"),
                    float(k_held.mean())]
        sums += np.nan_to_num(np.asarray(row))
        print(f"{i:2d}: " + " ".join(f"{v:.4f}" for v in row[:3]) + " | " + " ".join(f"{v:.4f}" for v in row[3:]),
              flush=True)
    print("sum: " + " ".join(f"{v:.4f}" for v in sums[:3]) + " | " + " ".join(f"{v:.4f}" for v in sums[3:]))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path("/work/cache/rlx_mil_bench"))
    parser.add_argument("--configs", nargs="+", default=["lut4s", "lut4s+gptq"])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--cal-tokens", type=int, default=0, help="calibration tokens (0: all of the text)")
    parser.add_argument("--mix", default="", help="name-pattern=spec;... overriding the layers' scheme")
    parser.add_argument("--fit-tokens", type=int, default=0,
                        help="fit on the calibration text's first N tokens only (0: all of --cal-tokens)")
    parser.add_argument("--fit-chunks", type=int, default=0,
                        help="also fit on N sequences of --chunk tokens of the calibration text after its first"
                             " --chunk tokens, each run alone (as the built-in calibration's fit-only chunks)")
    parser.add_argument("--chunk", type=int, default=256, help="with --fit-chunks: their length")
    parser.add_argument("--layers", type=int, nargs="*", default=None, help="with --per-layer: only these layers")
    parser.add_argument("--sequential", action="store_true",
                        help="fit each layer to the inputs the already-encoded layers before it produce")
    parser.add_argument("--per-layer", action="store_true",
                        help="each layer alone, fitted and plain: its KL on the fitted tokens, on the calibration"
                             " tokens the fit did not use (held apart) and on the held-out text")
    parser.add_argument("--output-error", action="store_true",
                        help="each weight of --layers alone in each config: held-out output error and bytes")
    args = parser.parse_args(argv)
    from rlx_mil.compress.builtin_text import builtin_text
    from rlx_mil.llm.text import TextTokenizer

    folder = real_checkpoints.smollm2(args.cache)
    tok = TextTokenizer(folder)
    held = np.asarray(tok.encode(builtin_text("heldout"))[:args.tokens])
    cal = np.asarray(tok.encode(builtin_text("calibration")))
    if args.cal_tokens:
        cal = cal[:args.cal_tokens]
    model = Llama(folder)
    t0 = time.perf_counter()
    want = model.forward(held)
    z = want.astype(np.float64) - want.max(-1, keepdims=True)
    lsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
    print(f"float model perplexity on the held-out text: {np.exp(-lsm[np.arange(held.size - 1), held[1:]].mean()):.2f}")
    record: dict[str, Any] = {}
    model.forward(cal[:args.fit_tokens] if args.fit_tokens else cal, record=record)
    for i in range(args.fit_chunks):
        chunk = cal[args.chunk * (i + 1):args.chunk * (i + 2)]
        if chunk.size < args.chunk:
            parser.error(f"--fit-chunks {args.fit_chunks}: the calibration text has {cal.size} tokens")
        model.forward(chunk, record=record)
    from rlx_mil.compress.fitting import input_hessian

    acts = {name: np.concatenate(xs) for name, xs in record.items()}
    hess = {name: input_hessian(x) for name, x in acts.items()}
    del record
    print(f"float forward + hessians: {time.perf_counter() - t0:.1f} s ({cal.size} calibration tokens)", flush=True)
    head = model.w["model.embed_tokens.weight"]
    head8_codes = encode_codes(head, "int8")
    head8, head8_bytes = head8_codes.dequantize().astype(np.float32), package_bytes(head8_codes)
    mix = [tuple(item.split("=")) for item in args.mix.split(";") if item]
    if args.output_error:
        return output_errors(model, args, held, acts, hess, mix)
    if args.per_layer:
        return per_layer(model, args, cal, held, want, acts, hess, head8, mix)
    fit_ids = cal[:args.fit_tokens] if args.fit_tokens else cal
    for config in args.configs:
        base, _, mode = config.partition("+")
        t0 = time.perf_counter()
        sizes: dict[str, tuple[int, int]] = {}

        def encode(name: str, x: np.ndarray | None = None, base: str = base, mode: str = mode,
                   sizes: dict[str, tuple[int, int]] = sizes) -> np.ndarray:
            spec = base
            for pattern, s in mix:
                if pattern in name:
                    spec = s
            if not mode:
                codes = encode_codes(model.w[name], spec)
            else:
                x = acts[name] if x is None else x
                codes = encode_codes(model.w[name], spec, input_hessian(x), mode, x)
            sizes[name] = package_bytes(codes)
            return codes.dequantize().astype(np.float32)

        if args.sequential and mode:
            new = sequential_encode(model, fit_ids, encode)
        else:
            new = dict(model.w)
            for name in model.linear_names():
                new[name] = encode(name)
        secs = time.perf_counter() - t0
        fp16 = 2 * sum(int(v.size) for v in model.w.values())
        rest = fp16 - 2 * sum(model.w[n].size for n in sizes) - 2 * head.size  # norms stay fp16
        size18 = (rest + head8_bytes[0] + sum(v[0] for v in sizes.values())) / fp16
        size26 = (rest + head8_bytes[1] + sum(v[1] for v in sizes.values())) / fp16
        got = model.forward(held, new, head=head8)
        q = quality(want, got, held)
        fitted = quality(model.forward(fit_ids), model.forward(fit_ids, new, head=head8), fit_ids)
        print(f"{config} {args.mix}{' sequential' * args.sequential}: top-1 {q['top1']:.3f} / {q['gap']:.3f},"
              f" KL {q['kl']:.4f}, ppl x{q['ppl']:.3f}; on the fitted tokens KL {fitted['kl']:.4f}"
              f"; {size18:.4f}x iOS18 / {size26:.4f}x iOS26 ({secs:.0f} s encode)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
