"""How well autoN's vocabulary-sampled measurement (`rlx_mil.compress.vocab_sample`) gives the
mean KL of the whole head, and what it costs, on a real GGUF decoder.

    python benchmarks/vocab_sample_kl.py FILE.gguf [--weights NAME ...] [--scheme lut4]

For each weight: the reference on the calibration text (the built-in one, through the file's
tokenizer, as `convert-gguf --deploy ane` plans) with that weight plainly encoded, its mean KL
from the float model over the whole vocabulary and over the sample, and the CPU seconds of each
measurement. Prints the ratio sampled / whole per weight.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from rlx_mil.compress import vocab_sample
from rlx_mil.compress.plan import encode
from rlx_mil.compress.quality import kl_per_position
from rlx_mil.compress.quality_check import next_token_targets
from rlx_mil.compress.schemes import parse_scheme
from rlx_mil.compress.sensitivity import Replaced
from rlx_mil.llm.calibration import gguf_calibration
from rlx_mil.lowering.target import Precision
from rlx_mil.reference import evaluate

DEFAULT_WEIGHTS = ("model.embed_tokens.weight", "model.layers.2.self_attn.q_proj.weight",
                   "model.layers.9.mlp.down_proj.weight", "model.layers.16.mlp.up_proj.weight")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf")
    parser.add_argument("--weights", nargs="*", default=list(DEFAULT_WEIGHTS))
    parser.add_argument("--scheme", default="lut4")
    args = parser.parse_args()
    found = gguf_calibration(args.gguf)
    assert found is not None, "the file has no tokenizer"
    inputs, graph, params = found
    feeds = {"input_ids": inputs["input_ids"]}
    head = vocab_sample.large_head(graph, vocab_sample.MEASURED_LIMIT)
    assert head is not None, "no head over a large vocabulary"
    keep = next_token_targets(feeds, (*feeds["input_ids"].shape, 1))
    assert keep is not None
    scheme = parse_scheme(args.scheme)
    assert scheme is not None
    cpu = time.process_time()
    want = np.asarray(evaluate(graph, feeds, params)["logits"])[keep[0]]
    whole_cpu = time.process_time() - cpu
    cpu = time.process_time()
    hidden = next(iter(evaluate(head.graph, feeds, params).values()))
    head.prepare(hidden, params[head.weight], keep[0])
    print(f"{graph.name}: {head.vocabulary} tokens, {len(keep[0].nonzero()[0])} positions; sample {len(head.rows)} rows"
          f" ({int(np.sum(head.log_weight == 0))} top candidates); reference whole {whole_cpu:.1f} s CPU,"
          f" sampled (hidden + prepare) {time.process_time() - cpu:.1f} s; peak {_peak_mb():.0f} MB")
    top_mass = np.exp(head.log_p[:, head.log_weight == 0]).sum(axis=1)
    print(f"reference mass on the top candidates: mean {top_mass.mean():.3f}, min {top_mass.min():.3f}")
    for name in args.weights:
        value = np.asarray(params[name], np.float32)
        storage = value if value.ndim == 2 else value.reshape(value.shape[0], -1)
        back = np.asarray(encode(storage, scheme, Precision.FP32, name).dequantize(), np.float32).reshape(value.shape)
        changed = Replaced(params, name, back)
        cpu = time.process_time()
        got = np.asarray(evaluate(graph, feeds, changed)["logits"])[keep[0]]
        exact = float(np.mean(kl_per_position(want, got)))
        exact_cpu = time.process_time() - cpu
        del got
        cpu = time.process_time()
        sampled = head.mean_kl(next(iter(evaluate(head.graph, feeds, changed).values())),
                               back if name == head.weight else None)
        print(f"{name} ({args.scheme}): KL whole {exact:.5f} ({exact_cpu:.1f} s CPU), sampled {sampled:.5f}"
              f" ({time.process_time() - cpu:.1f} s CPU), ratio {sampled / exact:.3f}; peak {_peak_mb():.0f} MB")


if __name__ == "__main__":
    main()
