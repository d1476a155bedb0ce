"""Generate docs/op-coverage.md from the lowering registry (`python -m rlx_mil.lower.coverage`)."""

from __future__ import annotations

import sys
from pathlib import Path

from rlx_mil.ir.ops import OP_TYPES, Constant, Input, Param, family_of
from rlx_mil.lower.registry import registered_rules, unsupported_ops
from rlx_mil.lower.target import Target

#: Relative to the repository root, where the command is meant to run.
DOC_PATH = Path("docs") / "op-coverage.md"
_LEAVES = {Input: "model input (fp32/int32 I/O)", Param: "`const` weight (fp16 under fp16 precision)",
           Constant: "`const` decoded from the little-endian payload"}


def coverage_markdown() -> str:
    rules = registered_rules()
    unsupported = unsupported_ops()
    targets = list(Target)
    lines = [
        "# Op coverage",
        "",
        "Generated from the lowering registry by `python -m rlx_mil.lower.coverage --write`;",
        "a test fails when this file is out of date. `yes` = the op lowers for that deployment",
        "target; `no` = conversion raises `UnsupportedOpError` naming the minimum target.",
        "Attribute combinations a rule rejects are listed in its notes.",
        "",
        "| op | family | " + " | ".join(t.label for t in targets) + " | lowering |",
        "|---|---|" + "---|" * len(targets) + "---|",
    ]
    missing = []
    for name, op_type in OP_TYPES.items():
        if op_type in _LEAVES:
            cells = ["yes"] * len(targets)
            lines.append(f"| {name} | leaf | " + " | ".join(cells) + f" | {_LEAVES[op_type]} |")
            continue
        info = rules.get(op_type)
        if info is None and op_type in unsupported:
            missing.append(name)
            because = " ".join(unsupported[op_type].split()).replace("|", "\\|")
            cells = ["no"] * len(targets)
            lines.append(f"| {name} | {family_of(op_type)} | " + " | ".join(cells) + f" | unsupported: {because} |")
            continue
        if info is None:
            missing.append(name)
            cells = ["no"] * len(targets)
            lines.append(f"| {name} | — | " + " | ".join(cells) + " | no lowering rule |")
            continue
        cells = ["yes" if t >= info.min_target else "no" for t in targets]
        notes = " ".join(info.notes.split()).replace("|", "\\|") or "—"
        lines.append(f"| {name} | {info.family} | " + " | ".join(cells) + f" | {notes} |")
    lines.append("")
    lines.append(f"{len(OP_TYPES) - len(missing)} of {len(OP_TYPES)} IR ops lower.")
    if missing:
        lines.append(f"Without a rule: {', '.join(missing)}.")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = coverage_markdown()
    if "--write" in args:
        DOC_PATH.parent.mkdir(parents=True, exist_ok=True)
        DOC_PATH.write_text(text)
        print(f"wrote {DOC_PATH}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
