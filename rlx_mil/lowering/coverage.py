"""Generate docs/op-coverage.md from the lowering registry (`python -m rlx_mil.lowering.coverage`)."""

from __future__ import annotations

import sys
from pathlib import Path

from rlx_mil.ir.ops import OP_TYPES, Constant, Input, Param
from rlx_mil.lowering.registry import registered_rules
from rlx_mil.lowering.rules.sequence_loop import recurrence_forms_markdown
from rlx_mil.lowering.target import Target
from rlx_mil.lowering.upstream_coverage import upstream_kinds_markdown

#: Relative to the repository root, where the command is meant to run.
DOC_PATH = Path("docs") / "op-coverage.md"
_LEAVES = {Input: "model input (fp32/int32 I/O)", Param: "`const` weight (fp16 under fp16 precision)",
           Constant: "`const` decoded from the little-endian payload"}


#: The numeric semantics the reference (`rlx_mil.reference`) and every conversion share.
SEMANTICS = """
## Integer and low-precision float semantics

Decided once; `rlx_mil.reference` computes them and converted models reproduce them (a
pipeline fuzz over random builder graphs in the test suite checks the two agree).

* **Integer arithmetic.** When every operand of Add, Sub, Mul, Max, Min or Div is an integer
  (or Bool) and the result is an integer, the exact result wraps modulo 2^bits into the
  declared dtype, as NumPy's integer arithmetic does: U8 `neg([0, 1, 2])` is `[0, 255, 254]`,
  I8 `127 + 1` is `-128`. Neg, Abs, Relu and Round of integers to integers likewise.
* **Bitwise ops and shifts** (Binary BitAnd, BitOr, BitXor, Shl, Shr). On integer operands with
  an integer result they are the native two's-complement operations, wrapped into the declared
  dtype; a shift amount is `max(b, 0) mod 64` (upstream's `sat_u32(b) mod 64`), Shl wraps and
  Shr is arithmetic. Core ML has no bitwise ops, so the lowering composes them exactly in int32:
  And/Or/Xor nibble by nibble through a 16 x 16 lookup table, Shl as a multiply by 2^s (0 once
  s >= 32, the low 32 bits of the 64-bit result), Shr as a floor division by 2^s (the sign once
  s >= 31). Bool operands use the logical ops. On float operands upstream converts to 64-bit
  integers (truncate, saturate, NaN -> 0) and back, which neither int32 nor float ops can
  reproduce (wrap at 2^64, saturation at 2^63): those are refused by name at conversion
  (`UnsupportedOpError`), while the reference computes them.
* **Integer division** truncates toward zero (`-7 / 2 = -3`); a division by zero gives 0
  (Core ML leaves it undefined, so the lowering selects 0 explicitly).
* **Everything else on integers** (Pow, Sqrt, Exp..., an operand that is a float, an integer
  result of a float computation) is computed in float32 (float64 in the reference for 32/64-bit
  integers) and converted with Cast semantics.
* **Cast.** float -> int truncates toward zero, saturates at the type's range, NaN -> 0;
  int -> narrower int wraps modulo 2^bits; -> Bool is `x != 0`; -> F16 / BF16 rounds to
  nearest, ties to even. Where converts each branch to its declared dtype this way first.
* **Narrowing in Core ML.** Converted models hold every integer dtype as int32, so I64 and U32
  values must lie in the int32 range: params outside it are refused (`ParamError`), and
  results beyond it saturate (Cast) or wrap at 32 bits (arithmetic) where the reference would
  keep them.
* **F16 / BF16 results.** Every node declared F16 or BF16 holds values of that type: its
  result is rounded to it (nearest, ties to even), in the reference and in converted models
  (BF16 by Veltkamp splitting; F16 in an fp32 program by a cast through fp16). Inputs and
  params declared F16 / BF16 are rounded likewise when fed. The ops of a fused node's
  decomposition are rounded once, at the fused node. Under fp16 precision every F32 tensor is
  computed in fp16 (the precision the caller chose); see docs/design.md.
* **Values of a declared dtype.** Integer inputs and params must be whole numbers inside the
  declared type's range (inf, NaN, 2^40 for I32, 300 for I8 and -1 for U32 are refused, never
  wrapped); floats take float arrays (bfloat16 included); Bool takes any number (`x != 0`).
  `rlx_mil.ir.values` holds this one rule, used by `convert` and `reference.evaluate` alike.
"""


def coverage_markdown() -> str:
    rules = registered_rules()
    targets = list(Target)
    lines = [
        "# Op coverage",
        "",
        "Generated from the lowering registry by `python -m rlx_mil.lowering.coverage --write`;",
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
    return "\n".join(lines) + SEMANTICS + recurrence_forms_markdown() + upstream_kinds_markdown()


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
