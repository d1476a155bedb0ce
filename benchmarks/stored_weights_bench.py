"""What a check's reference weights cost: encoding every compressed weight again from the
report's scheme names (`dequantized_params`, what --verify did) against decoding the codes the
saved package stores (`rlx_mil.milexec.stored_weights.StoredWeights`, what it does now), on a
compressed package of a real checkpoint; and that both give the same values.

    python benchmarks/stored_weights_bench.py PACKAGE CHECKPOINT_DIR

PACKAGE: a `.mlpackage` converted from CHECKPOINT_DIR with `--compress` (e.g. `rlx-mil
convert-hf CHECKPOINT_DIR -o m.mlpackage --compress int4`). Prints CPU seconds of each side
(one pass over every compressed weight, each dropped after use), the ratio, peak RSS, and the
largest difference of the values.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package")
    parser.add_argument("checkpoint")
    args = parser.parse_args()

    from rlx_mil.compress import dequantized_params, report_of
    from rlx_mil.coreml.package_info import package_info
    from rlx_mil.milexec.stored_weights import StoredWeights
    from rlx_mil.models.pretrained import from_pretrained

    report = report_of(package_info(args.package).metadata)
    if report is None:
        raise SystemExit(f"{args.package} is not compressed")
    _, params = from_pretrained(args.checkpoint, "prefill", seq_len=8, last_logits=True)
    names = [w.name for w in report.weights]

    start = time.process_time()
    stored = StoredWeights(args.package, report.weights)
    opened = time.process_time() - start
    decoded: dict[str, float] = {}
    for name in names:
        value = stored[name]
        decoded[name] = float(np.sum(value, dtype=np.float64))
    decode = time.process_time() - start

    start = time.process_time()
    again = dequantized_params(params, report)
    worst = 0.0
    for name in names:
        value = np.asarray(again[name], np.float32)
        worst = max(worst, float(np.max(np.abs(value - stored[name]))))
    # the comparison above decodes once more: time the re-encoding alone
    encode_and_compare = time.process_time() - start
    start = time.process_time()
    for name in names:
        stored[name]
    compare_decode = time.process_time() - start
    encode = encode_and_compare - compare_decode

    print(f"{len(names)} compressed weights ({report.config}, {report.precision})")
    print(f"decode the package's stored codes: {decode:.2f} s CPU (of it {opened:.2f} s reading the program)")
    print(f"encode again from the report:      {encode:.2f} s CPU")
    print(f"ratio decode / encode: {decode / encode:.3f}")
    print(f"largest |decoded - re-encoded|: {worst:.3g}")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
