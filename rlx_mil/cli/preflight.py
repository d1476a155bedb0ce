"""`rlx-mil preflight PACKAGE [--device ane|gpu] [--verbose] [--json]`: the Core ML rules a
package breaks, one verdict line first, then each rule once with how many ops break it, three
of them as examples, why and the fix (`--verbose`: every op; `--json`: every finding)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FINDINGS = 0, 1
#: Ops shown per rule without --verbose.
EXAMPLES = 3
_DEVICE_NAMES = {"ane": "Neural Engine", "gpu": "GPU"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("package", type=Path, help="a .mlpackage (any ML Program, not only rlx_mil's)")
    p.add_argument("--device", default="ane", choices=["ane", "gpu"],
                   help="the compute unit to check for: the Neural Engine (default) or the GPU")
    p.add_argument("--json", action="store_true", help="print every finding as a JSON list")
    p.add_argument("-v", "--verbose", action="store_true", help="list every op that breaks a rule, not three per rule")


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'s' * (count != 1)}"


def _where(finding: Any) -> str:
    return " ".join(p for p in (finding.function and f"{finding.function}:", finding.op,
                                finding.var and f"-> {finding.var}") if p)


def report_text(package: Path, device: str, findings: list[Any], verbose: bool = False) -> str:
    """The verdict line, then one block per rule (errors, then warnings, then notes)."""
    from rlx_mil.coreml.preflight import is_finding

    broken = [f for f in findings if is_finding(f)]
    notes = len(findings) - len(broken)
    rules: dict[str, list[Any]] = {}
    for finding in findings:
        rules.setdefault(finding.rule, []).append(finding)
    broken_rules = [r for r, fs in rules.items() if is_finding(fs[0])]
    target = f"the {_DEVICE_NAMES[device]}"
    if broken:
        verdict = (f"{package}: breaks {_plural(len(broken_rules), 'rule')} of {target}"
                   f" ({_plural(len(broken), 'finding')}: "
                   + ", ".join(f"{r} {len(rules[r])}" for r in broken_rules) + ")")
    else:
        verdict = f"{package}: no known rule of {target} broken"
    if notes:
        verdict += f"; {_plural(notes, 'note')}"
    lines = [verdict]
    order = {"error": 0, "warning": 1, "note": 2}
    for rule, group in sorted(rules.items(), key=lambda item: order.get(item[1][0].severity, 3)):
        first = group[0]
        lines.append("")
        lines.append(f"{first.severity}: [{rule}] {_plural(len(group), 'finding')}")
        shown = group if verbose else group[:EXAMPLES]
        for finding in shown:
            where = _where(finding)
            lines.append(f"  {where + ': ' if where else ''}{finding.why}")
        if len(group) > len(shown):
            lines.append(f"  ... and {len(group) - len(shown):,} more (--verbose lists them)")
        lines.append(f"  fix: {first.fix}")
        lines.append(f"  source: {first.source}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the report; exit 0 when no rule is broken (notes only), 1 when one is."""
    from rlx_mil.cli.arguments import announce

    announce(args, f"checking {args.package} against the {_DEVICE_NAMES[args.device]}'s rules ...")
    from rlx_mil.coreml.preflight import findings_json, is_finding, preflight

    findings = preflight(args.package, device=args.device)
    if args.json:
        print(findings_json(findings))
    else:
        print(report_text(args.package, args.device, findings, args.verbose))
    return EXIT_FINDINGS if any(is_finding(f) for f in findings) else EXIT_OK
