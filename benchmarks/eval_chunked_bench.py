"""`rlx-mil eval` speed: a package whose prefill keeps every position's logits (`all_logits`)
scored a bucket per call, against the same package scored one decode call per token, in the
same run through the NumPy executor. Prints both times, the ratio and the perplexity of each.

    python benchmarks/eval_chunked_bench.py                       # a tiny random Llama
    python benchmarks/eval_chunked_bench.py --smollm2 /work/cache/rlx_mil_bench --tokens 130
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from rlx_mil.llm.evaluate import evaluate_text, session_logits
from rlx_mil.llm.generate import Session
from rlx_mil.llm.package import convert_llm_checkpoint
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smollm2", type=Path, help="cache folder for SmolLM2-135M (benchmarks/real_checkpoints.py)")
    parser.add_argument("--tokens", type=int, default=130)
    parser.add_argument("--max-context", type=int, default=128)
    parser.add_argument("--bucket", type=int, default=32)
    parser.add_argument("--precision", default="fp16")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.smollm2 is not None:
            sys.path.insert(0, str(Path(__file__).parent))
            from real_checkpoints import smollm2

            checkpoint = smollm2(args.smollm2)
        else:
            checkpoint = write_random_checkpoint(Path(tmp) / "llama", TINY_CONFIGS["llama"], seed=0)
        package = Path(tmp) / "all.mlpackage"
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            convert_llm_checkpoint(checkpoint, package, max_context=args.max_context, prefill=[args.bucket],
                                   precision=args.precision, all_logits=True)
        print(f"conversion {time.perf_counter() - started:.1f} s")
        session = Session(package, engine="milexec")
        ids = [int(t) for t in np.random.default_rng(0).integers(0, session.vocab, args.tokens)]
        if args.smollm2 is not None:
            ids = session.tokenizer.encode("The city of Paris, on the Seine, is the capital of France. " * 40)[:args.tokens]
        times = {}
        for name, chunked in (("bucket per call", True), ("token per call", False)):
            started = time.perf_counter()
            result = evaluate_text(session_logits(session, chunked=chunked), ids, args.max_context)
            times[name] = time.perf_counter() - started
            print(f"{name:16s} {times[name]:8.2f} s  {result.scored} scored  "
                  f"{times[name] / result.scored * 1e3:8.1f} ms/token  perplexity {result.perplexity:.6f}")
        print(f"speedup {times['token per call'] / times['bucket per call']:.2f}x")


if __name__ == "__main__":
    main()
