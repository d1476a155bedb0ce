"""The rule table of `rlx_mil.preflight`: what each rule checks, on which device, its source and
the rlx_mil option that fixes it (docs/deploying.md prints the same table)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Device = Literal["ane", "gpu"]
Severity = Literal["error", "warning", "note"]
DEVICES: tuple[Device, ...] = ("ane", "gpu")

#: The Neural Engine's largest tensor dimension (Anemll splits the LM head into pieces of at most
#: this many rows) and the largest any Core ML device is known to take (maderix/ANE#26).
ANE_MAX_DIM = 16_384
ANY_MAX_DIM = 65_536
#: Weight files above these sizes are refused on iOS / on macOS (Anemll's `--chunk`).
IOS_MAX_WEIGHT_FILE = 10**9
MACOS_MAX_WEIGHT_FILE = 2 * 10**9
#: One Neural Engine core's weight slice within this many bytes of a multiple of 1 MiB streams
#: at a third of the speed (stablehlo-coreml#110: a 256-line, 16 KiB window either side).
MIB = 1 << 20
NOTCH_WINDOW = 16 << 10
ANE_CORES = 16


def core_payload(rows: int, width: int, kernel: int = 1) -> int:
    """Bytes of an fp16 `[rows, width, kernel...]` weight one Neural Engine core streams: its
    `ceil(rows / 16)` output channels."""
    return -(-rows // ANE_CORES) * width * kernel * 2


def on_notch(payload: int) -> bool:
    """A per-core weight slice within `NOTCH_WINDOW` of a non-zero multiple of 1 MiB."""
    off = payload % MIB
    return payload > MIB - NOTCH_WINDOW and min(off, MIB - off) < NOTCH_WINDOW
#: Ops the Neural Engine does not run (they fall back to the CPU/GPU).
ANE_UNSUPPORTED_OPS = frozenset({"lstm", "gru", "rnn"})
ANE_GATHER_OPS = frozenset({"gather", "gather_nd", "gather_along_axis"})
#: Ops that only move or view data (no arithmetic): a model input they cut into pieces, or a
#: model output they join from pieces, is no compute op's tensor (rule "interface-copy").
DATA_MOVEMENT_OPS = frozenset({"reshape", "slice_by_index", "slice_by_size", "split", "concat", "identity",
                               "expand_dims", "squeeze", "transpose"})

ANEMLL = "Anemll (github.com/Anemll/Anemll): LM head split into <= 16,384-row pieces, --chunk"
NOTCH = "kasper0406/stablehlo-coreml#110 (ANE kernel-DMA 1 MiB notch)"


@dataclass(frozen=True)
class Rule:
    """One published Core ML rule."""

    id: str
    devices: tuple[Device, ...]
    severity: Severity
    summary: str
    source: str
    fix: str


_RULES = (
    Rule("rank-over-4", ("ane",), "error",
         "a tensor of rank > 4 (the Neural Engine works on 4-D [B, C, H, W] tensors)",
         "apple/ml-ane-transformers; pytorch/executorch#15833 (5-D attention mis-computes on iOS 26)",
         'deploy="ane" (--deploy ane): channels-first [B, C, 1, S], per-head attention'),
    Rule("dim-over-16384", ("ane",), "error",
         "a tensor a compute op reads or writes with a dimension above 16,384 (the Neural Engine's limit)",
         ANEMLL + "; microsoft/onnxruntime#19543; FluidInference/FluidAudio#121 (the compiler's per-layer ranges)",
         'deploy="ane" (--deploy ane): the LM head and wide matmuls split into <= 16,384-wide pieces'),
    Rule("dim-over-65536", ("ane", "gpu"), "warning",
         "a tensor dimension above 65,536 (the largest any Core ML compute unit is known to take)",
         "maderix/ANE#26 (151,936 vocab cut into 16 x 9,496 pieces, max 65,536)",
         'deploy="ane" (--deploy ane) splits it into <= 16,384-wide pieces'),
    Rule("embedding-gather", ("ane", "gpu"), "note",
         "a constant table read by gather (an embedding lookup): exempt from the dimension and op rules",
         ANEMLL + " (the embeddings live in a package of their own; the lookup is not Neural Engine work)",
         "none needed"),
    Rule("interface-copy", ("ane", "gpu"), "note",
         "a model input or output wider than the device's limit that only data-movement ops (reshape, slice, concat,"
         " identity) touch, cutting it into or joining it from pieces within the limit: no compute op reads or"
         " writes it (the limit is checked per layer); the copy itself, one per prediction, is outside the Neural"
         " Engine's range and runs on the CPU or GPU (not checked on a device)",
         "the Neural Engine compiler's per-layer check (FluidInference/FluidAudio#121: \"Invalid layer: Tensor"
         " dimensions N1D1C1H1W240000 are not within supported range, N[1-65536]D[1-16384]C[1-65536]H[1-16384]"
         "W[1-16384]\", a waveform read by compute layers); argmaxinc/WhisperKit Models.swift ModelComputeOptions"
         " (MelSpectrogram, audio [480000], on .cpuAndGPU; TextDecoder, logits [1, 1, 51865], on"
         " .cpuAndNeuralEngine)",
         "none needed for an interface the app fixes (WhisperKit's); run a model whose wide input is raw audio on"
         " CPU_AND_GPU as WhisperKit does; a narrower interface (logits in pieces, deploy=\"ane\" for LLMs)"
         " avoids even the copy"),
    Rule("ane-unsupported-op", ("ane",), "warning",
         "an op the Neural Engine does not run (RNN ops; gather of a computed tensor): it falls back to CPU/GPU",
         "apple/coremltools#1780 (maintainer: RNN/LSTM not on the Neural Engine); hollance/neural-engine"
         " docs/unsupported-layers.md; " + ANEMLL,
         "express it without the op (e.g. one-hot matmul for a small gather), or run that part on the GPU"),
    Rule("ane-fp32-compute", ("ane",), "warning",
         "fp32 compute: the Neural Engine computes in fp16 only, fp32 ops run on the GPU/CPU",
         "apple/ml-ane-transformers; coremltools docs (compute precision)",
         'precision="fp16" (--precision fp16, the default)'),
    Rule("ane-per-block-int", ("ane",), "warning",
         "int weights quantized per block: they run on the GPU/CPU only",
         "apple/coremltools#2510; kasper0406/stablehlo-coreml#110 notes; pytorch/executorch Core ML backend"
         ' ("ANE requires channelwise")',
         'compress="lut4" (per grouped channel, --compress lut4) or per-channel int (compress="int4-channel")'),
    Rule("state-dim-32", ("ane",), "error",
         "a state's H or W dimension (its last two) not a multiple of 32: the stateful model fails on the Neural Engine",
         "apple/coremltools#2631",
         "max_context (--max-context) a multiple of 32 and a head_dim that is one"),
    Rule("ane-dma-notch", ("ane",), "warning",
         "one Neural Engine core's weight slice, ceil(N/16)*D*k*2 bytes, within 16 KiB of a multiple of 1 MiB:"
         " weight streaming drops from 45-60 to 17-19 GB/s",
         NOTCH, 'deploy="ane" (--deploy ane) pads or splits such weights'),
    Rule("flexible-shape-state", ("ane", "gpu"), "error",
         "states together with flexible input shapes (unsupported by Core ML)",
         "apple/coremltools#2537, apple/coremltools#2600",
         "fixed shapes: dims={...} (--dim), one function per prompt bucket (convert_buckets, --prefill)"),
    Rule("lut4-state-coremltools-9.0", ("ane", "gpu"), "warning",
         "a stateful package built with coremltools 9.0 whose weights are 4-bit palettes of one table per"
         " weight (palettize_weights' default, the configuration reported): crashes after ~100-200 predictions",
         "apple/coremltools#2716 (not with coremltools 8.3)",
         'compress="lut4" (a table per group of channels), "int4" (per block, GPU) or "lut6"/"lut8";'
         " or build with coremltools 8.3"),
    Rule("lut4-grouped-state-coremltools-9.0", ("ane", "gpu"), "note",
         "a stateful package built with coremltools 9.0 with 4-bit palettes of a table per group of channels:"
         " apple/coremltools#2716's reports are all of one table per weight; not reported for grouped tables",
         "apple/coremltools#2716 (its reports: palettize_weights nbits=4, per-tensor)",
         "none known; on a device, check long runs"),
    Rule("lut-scale-state-coremltools-9.0", ("ane", "gpu"), "note",
         "a stateful package built with coremltools 9.0 whose <= 4-bit palettes hold integer codes that a per-block"
         " scale follows (the iOS26 form of GGUF codes): apple/coremltools#2716's reports are all of float tables"
         " (palettize_weights); not reported for this form",
         "apple/coremltools#2716 (its reports: palettize_weights nbits=4, per-tensor)",
         "none known; on a device, check long runs (iOS18 holds the same codes as a table per block)"),
    Rule("weight-file-over-1GB", ("ane", "gpu"), "warning",
         "a weight file above 1 GB: iOS refuses it (macOS takes up to ~2 GB)",
         ANEMLL + "; Apple developer forums", 'chunk_bytes="1GB" (--chunk-bytes 1GB) or compress="lut4"'),
    Rule("weight-file-over-2GB", ("ane", "gpu"), "error",
         "a weight file above 2 GB: macOS and iOS refuse it",
         ANEMLL + "; Apple developer forums", 'chunk_bytes="1GB" (--chunk-bytes 1GB) or compress="lut4"'),
)

RULES: dict[str, Rule] = {rule.id: rule for rule in _RULES}


def rule_table() -> str:
    """The rule table as Markdown (docs/deploying.md holds a copy; a test keeps them equal)."""
    lines = ["| rule | devices | severity | what | source | fix |", "|---|---|---|---|---|---|"]
    for r in _RULES:
        lines.append(f"| `{r.id}` | {', '.join(r.devices)} | {r.severity} | {r.summary} | {r.source} | {r.fix} |")
    return "\n".join(lines)
