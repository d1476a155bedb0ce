"""The architectures x tensor types table of docs/gguf.md, generated from the registries
(`metadata.ARCHITECTURES`, `codes.FORMATS`, `tensors.DENSE_TYPES`).

    python -m rlx_mil.models.gguf.support --write     # refresh docs/gguf.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from rlx_mil.models.gguf.codes import EXACT, FORMATS
from rlx_mil.models.gguf.metadata import ARCHITECTURES, PERMUTED_QK
from rlx_mil.models.gguf.tensors import DENSE_TYPES

DOC_PATH = Path("docs") / "gguf.md"
BEGIN, END = "<!-- gguf-support:begin -->", "<!-- gguf-support:end -->"

_ARCH_NOTES = {
    "llama": "Llama 2/3/3.1/3.2, Mistral-style, SmolLM; Q/K rows un-permuted; Llama 3.1 scaling from `rope_freqs`",
    "qwen2": "Qwen2 / Qwen2.5: q/k/v biases",
    "qwen3": "Qwen3: q/k RmsNorms (`attn_q_norm`, `attn_k_norm`)",
    "gemma2": "Gemma 2: norms stored as applied (1 + w), sandwich norms, soft-caps, sliding window on even layers",
    "gemma3": "Gemma 3 (270M, 1B, text of 4B+): Gemma 2's norms and block plus q/k norms (`attn_q_norm`, `attn_k_norm`);"
              " every 6th layer global (or `attention.sliding_window_pattern`), the others slide with RoPE base"
              " `rope.freq_base_swa` (default 10000) unscaled; `final_logit_softcapping` if given; no window: all global",
    "phi3": "Phi-3 (4k): fused `attn_qkv` and `ffn_up` (gate rows first); long-rope factors refused",
}


_DENSE_FP16 = {"F32": "rounded to fp16", "F16": "exact", "BF16": "exact within fp16's range"}


def support_markdown() -> str:
    """The generated part of docs/gguf.md."""
    archs = list(ARCHITECTURES)
    lines = [BEGIN, "", "| `general.architecture` | builds as | llama.cpp conventions undone |", "|---|---|---|"]
    for arch in archs:
        lines.append(f"| `{arch}` | {ARCHITECTURES[arch]} | {_ARCH_NOTES.get(arch, '')}"
                     f"{' (permuted Q/K)' if arch in PERMUTED_QK and 'permute' not in _ARCH_NOTES.get(arch, '') else ''} |")
    header = ("| type | Core ML (iOS18) | data | iOS26 | block | scale | offset | fp32 | fp16 | "
              + " | ".join(archs) + " |")
    lines += ["", header, "|" + "---|" * (9 + len(archs))]
    every = " | ".join("yes" for _ in archs)
    for name in DENSE_TYPES:
        lines.append(f"| {name} | `const` (fp16/fp32 weight, or `--compress`) | {name.lower()} | as iOS18 | - | - | - |"
                     f" exact | {_DENSE_FP16[name]} | {every} |")
    for name, fmt in FORMATS.items():
        lut = fmt.data == "lut4"
        op = "`constexpr_lut_to_dense` + `constexpr_blockwise_shift_scale`" if lut else "`constexpr_blockwise_shift_scale`"
        data = "uint4 index into the 16 IQ4 values" if lut else fmt.data
        ios26 = "as iOS18, kept in this order (iOS18: re-ordered into a table per block)" if lut else "as iOS18"
        if fmt.lut_bits is not None:
            high = fmt.lut_low + (1 << fmt.lut_bits) - 1
            ios26 = (f"uint{fmt.lut_bits} index into the int8 table {fmt.lut_low}..{high}"
                     " (`constexpr_lut_to_dense` + `constexpr_blockwise_shift_scale`)")
        fp32 = "offset rounds (~1e-7 relative)" if fmt.biased else "exact"
        fp16 = "exact" if name in EXACT else "scale/offset round to fp16"
        if fmt.split_bits == 5:
            low, high = fmt.lut_low, fmt.lut_low + 15
            op = "2 x `constexpr_lut_to_dense`, then `add`, `mul` (and `add`) at run time"
            data = f"uint4 index into {low}..{high} + uint1 index into 0, 16 (the 5-bit code, split)"
        elif fmt.split_bits is not None:
            low, high = fmt.lut_low, fmt.lut_low + (1 << fmt.split_bits) - 1
            op = "`constexpr_lut_to_dense`, then `mul` (and `add`) at run time"
            data = f"uint{fmt.split_bits} index into the table {low}..{high} (split: the scale at run time)"
        if fmt.split_bits is not None:
            fp32 = "exact (iOS26: offset rounds, ~1e-7 relative)" if fmt.biased else "exact"
            fp16 = "the weight rounds to fp16"
        offset = fmt.offset_text
        if fmt.split_bits is not None and fmt.biased:
            offset = f"bias {'m' if name == 'Q5_1' else '-dmin * m'} (iOS26: offset {fmt.offset_text})"
        lines.append(f"| {name} | {op} | {data} | {ios26} | {fmt.block} | {fmt.scale_text} | {offset} | {fp32} |"
                     f" {fp16} | {every} |")
    lines += ["", END]
    return "\n".join(lines)


def render(doc: str) -> str:
    """`doc` with its generated part replaced."""
    start, end = doc.index(BEGIN), doc.index(END) + len(END)
    return doc[:start] + support_markdown() + doc[end:]


def main(argv: list[str]) -> int:
    path = Path(__file__).resolve().parents[3] / DOC_PATH
    text = render(path.read_text(encoding="utf-8"))
    if "--write" in argv:
        path.write_text(text, encoding="utf-8")
    else:
        print(support_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
