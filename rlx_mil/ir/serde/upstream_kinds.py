"""Every op kind upstream RLX defines: the names of its newest `OpKind` enum
(`crates/core/rlx-ir/src/op.rs`), which are also the variant tags of its JSON ops.

The tuple is generated, not edited: `python -m rlx_mil.ir.serde.upstream_kinds OP_RS --write`
reads an upstream `op.rs` and rewrites it. A kind in this list that rlx_mil has no JSON form for
is refused by name (`UnsupportedOpFormatError`, spec part 2 section 1.11); a kind that gains a
form leaves the refusals by itself.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: Upstream commit the list was read from.
SOURCE_COMMIT = "e576497a5168ee0a1bce0db2b020e51686c54bdd"

# BEGIN GENERATED
UPSTREAM_OP_KINDS: tuple[str, ...] = (
    "Input", "Param", "Constant", "Activation", "Cast", "StopGradient", "Quantize", "Dequantize",
    "FakeQuantize", "FakeQuantizeLSQ", "FakeQuantizeLSQBackwardX", "FakeQuantizeLSQBackwardScale", "Binary",
    "Compare", "Where", "Fma", "ElementwiseRegion", "TransformRegion", "BatchElementwiseRegion", "MatMul",
    "DotGeneral", "DenseSolve", "BatchedDenseSolve", "Cholesky", "TriangularSolve", "Det", "LogDet", "Sort",
    "ArgSort", "Svd", "Qr", "LayerNorm", "LayerNorm2d", "GroupNorm", "BatchNormInference", "RmsNorm",
    "ResizeNearest2x", "Interpolate3d", "Attention", "Rope", "AxialRope2d", "Reshape", "Transpose", "Narrow",
    "Concat", "KvAppend", "Expand", "Gather", "Reverse", "Pad", "Slice", "Roll", "Clamp", "Tile", "Trilu",
    "Reduce", "Histogram", "Softmax", "Cumsum", "CumProd", "CumMax", "ArgMax", "ArgMin", "TopK", "Sample",
    "RngNormal", "RngUniform", "Conv", "Im2Col", "ConvTranspose2d", "Conv3d", "ConvTranspose3d", "Pool",
    "ReluBackward", "ActivationBackward", "FakeQuantizeBackward", "ComplexNormSq", "ComplexNormSqBackward",
    "Conjugate", "MaxPool2dBackward", "Conv2dBackwardInput", "Conv2dBackwardWeight", "MaxPool3dBackward",
    "Conv3dBackwardInput", "Conv3dBackwardWeight", "SoftmaxCrossEntropy", "SoftmaxCrossEntropyWithLogits",
    "SoftmaxCrossEntropyBackward", "AttentionBackward", "AttentionBackwardAll", "LayerNormBackwardInput",
    "LayerNormBackwardGamma", "RmsNormBackwardInput", "RmsNormBackwardGamma", "RmsNormBackwardBeta",
    "RopeBackward", "GroupNormBackwardInput", "GroupNormBackwardGamma", "GroupNormBackwardBeta",
    "BatchNormInferenceBackwardInput", "BatchNormInferenceBackwardGamma", "BatchNormInferenceBackwardBeta",
    "CumsumBackward", "GatherBackward", "GroupedMatMul", "DequantGroupedMatMul", "DequantGroupedMatMulMlx",
    "DequantMoEWeights", "ScaledGroupedMatMul", "ScatterAdd", "ScatterNd", "ScatterElements", "GatherNd",
    "GatherElements", "LoraMatMul", "PartitionedConv", "DequantMatMul", "SynthMatMul", "SynthMatMulBackward",
    "SynthReconstruct", "SplineActivation", "SplineActivationBackwardX", "SplineActivationBackwardCoeff",
    "QMatMul", "QConv2d", "ScaledMatMul", "ScaledQuantize", "ScaledQuantScale", "ScaledDequantize",
    "SelectiveScan", "GatedDeltaNet", "GatedDeltaNetBackward", "Lstm", "Gru", "Rnn", "Mamba2", "FusedSwiGLU",
    "FusedMatMulBiasAct", "FusedMatMulResidual", "FusedConvBiasAct", "FusedResidualLN", "FusedResidualRmsNorm",
    "FusedAttentionBlock", "FusedTransformerLayer", "If", "While", "Scan", "ScanBackward", "ScanBackwardXs",
    "GaussianSplatRender", "GaussianSplatRenderBackward", "GaussianSplatPrepare", "GaussianSplatRasterize",
    "Custom", "CustomFn", "Fft", "FftQ", "FftButterflyStage", "LogMel", "LogMelBackward", "WelchPeaks",
    "BiMap", "ReEig", "LogEig", "SpdBatchNorm", "SpdKarcherMean", "ReEigBackward", "LogEigBackward",
    "SpdBatchNormBackwardX", "SpdBatchNormBackwardG", "SpdKarcherMeanWeighted", "SpdLogMap", "SpdExpMap",
    "SpdParallelTransport", "SpdMatrixFnBatch", "SpdLogMapBackward", "SpdExpMapBackward",
    "SpdParallelTransportBackward", "SpdMatrixFnBatchBackward", "Eigh", "EighBackward", "EighBatch",
    "EighBatchBackward", "AdaLayerNorm", "AdaLayerNormBackward", "GatedResidual", "GatedResidualBackward",
)
# END GENERATED


def op_kinds_of(op_rs: str) -> tuple[str, ...]:
    """The variant names of the `pub enum OpKind` in the text of an upstream `op.rs`."""
    found = re.search(r"pub enum OpKind \{(.*?)\n\}", op_rs, re.S)
    if found is None:
        raise ValueError("no `pub enum OpKind { ... }` in the given op.rs")
    body = re.sub(r"//[^\n]*", "", found.group(1))
    return tuple(re.findall(r"\b([A-Z][A-Za-z0-9]*)\s*,", body))


def _generated_block(kinds: tuple[str, ...]) -> str:
    lines, line = [], "    "
    for kind in kinds:
        piece = f'"{kind}", '
        if len(line) + len(piece) > 112:
            lines.append(line.rstrip())
            line = "    "
        line += piece
    lines.append(line.rstrip())
    return "UPSTREAM_OP_KINDS: tuple[str, ...] = (\n" + "\n".join(lines) + "\n)\n"


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or (len(argv) == 2 and argv[1] != "--write"):
        print("usage: python -m rlx_mil.ir.serde.upstream_kinds OP_RS [--write]", file=sys.stderr)
        return 2
    kinds = op_kinds_of(Path(argv[0]).read_text(encoding="utf-8"))
    if len(argv) == 1:
        print(f"{len(kinds)} kinds; {len(set(kinds) ^ set(UPSTREAM_OP_KINDS))} differ from the stored list")
        return 0
    me = Path(__file__)
    text = me.read_text(encoding="utf-8")
    start, end = text.index("# BEGIN GENERATED\n") + len("# BEGIN GENERATED\n"), text.index("# END GENERATED")
    me.write_text(text[:start] + _generated_block(kinds) + text[end:], encoding="utf-8")
    print(f"wrote {len(kinds)} kinds to {me}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
