"""`rlx-mil demo`: build a transformer block, convert it, save the package, report."""

from __future__ import annotations

import argparse
import time

import numpy as np

from rlx_mil.models.transformer import DecoderConfig, example_inputs, llama_decoder, random_params


def run_demo(args: argparse.Namespace) -> int:
    import rlx_mil
    from rlx_mil.package_info import package_info

    config = DecoderConfig(hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                           intermediate=2 * args.hidden, layers=args.layers, seq=args.seq)
    t0 = time.perf_counter()
    graph = llama_decoder(config)
    params = random_params(graph, config)
    t1 = time.perf_counter()
    model = rlx_mil.convert(graph, params, target=args.target, precision=args.precision,
                            compute_units=args.compute_units, attention=args.attention)
    t2 = time.perf_counter()
    rlx_mil.save(model, args.output, overwrite=True)
    t3 = time.perf_counter()
    info = package_info(args.output)
    print(f"rlx_mil demo: {config.layers}-layer Llama-style decoder, hidden {config.hidden}, "
          f"{config.heads} heads / {config.kv_heads} kv heads, seq {config.seq}")
    print(f"  graph:   {len(graph)} IR nodes, {sum(p.size for p in params.values()):,} parameters")
    print(f"  convert: {t2 - t1:.2f} s (build {t1 - t0:.2f} s), save {t3 - t2:.2f} s "
          f"[{args.target}, {args.precision}]")
    print(info.to_text())
    if args.verify:
        from rlx_mil import milexec, reference

        inputs = example_inputs(config)
        want = reference.evaluate(graph, inputs, params)
        t4 = time.perf_counter()
        got = milexec.run(args.output, inputs)
        t5 = time.perf_counter()
        for key, ref in want.items():
            err = float(np.max(np.abs(got[key].astype(np.float64) - ref)))
            scale = float(np.max(np.abs(ref))) or 1.0
            print(f"  check {key}: max |converted - reference| = {err:.3g} (relative {err / scale:.3g}); "
                  f"executor ran the saved package in {t5 - t4:.2f} s")
    return 0
