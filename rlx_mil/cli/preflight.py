"""`rlx-mil preflight PACKAGE [--device ane|gpu] [--json]`: the Core ML rules a package breaks."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

EXIT_OK, EXIT_FINDINGS = 0, 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("package", type=Path, help="a .mlpackage (any ML Program, not only rlx_mil's)")
    p.add_argument("--device", default="ane", choices=["ane", "gpu"],
                   help="the compute unit to check for: the Neural Engine (default) or the GPU")
    p.add_argument("--json", action="store_true", help="print the findings as a JSON list")


def run(args: argparse.Namespace) -> int:
    """Print the findings (notes included); exit 0 when no rule is broken, 1 when one is."""
    from rlx_mil.coreml.preflight import findings_json, is_finding, preflight

    findings = preflight(args.package, device=args.device)
    broken = [f for f in findings if is_finding(f)]
    if args.json:
        print(findings_json(findings))
    else:
        for finding in findings:
            print(finding.to_text())
        notes = len(findings) - len(broken)
        per_rule = Counter(f.rule for f in broken)
        rules = ", ".join(f"{rule} {count}" for rule, count in per_rule.items())
        print(f"{args.package}: {len(broken)} finding{'s' * (len(broken) != 1)} for the {args.device}"
              + (f": {rules}" if rules else "") + (f" ({notes} note{'s' * (notes != 1)})" if notes else ""))
    return EXIT_FINDINGS if broken else EXIT_OK
