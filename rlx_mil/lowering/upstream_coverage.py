"""Every op kind of upstream's newest `OpKind`, lowered or refused, with the reason for each
refusal: the last section of docs/op-coverage.md.

A kind rlx_mil lowers is listed from the registry; a kind it does not is refused when read
(`UnsupportedOpFormatError` naming it, `rlx_mil.ir.serde.forms.UNSUPPORTED_UPSTREAM_OPS`) and must
have its reason here (a test checks both ways, so a kind that gains a lowering drops its reason).
"""

from __future__ import annotations

from rlx_mil.ir.ops import OP_TYPES
from rlx_mil.ir.serde.upstream_kinds import SOURCE_COMMIT, UPSTREAM_OP_KINDS
from rlx_mil.lowering.registry import registered_rules

_TRAINING = (
    "a training gradient: inference graphs do not carry it (upstream's autodiff emits it for the"
    " backward pass); not lowered"
)
_LAPACK = (
    "a LAPACK factorization / solve (pivoting, iterative eigen- or singular-value sweeps) with no"
    " MIL op; upstream's Core ML backend runs it on the host CPU between segments, which one"
    " Core ML program cannot"
)
_SPD = (
    "an SPD-manifold layer computed by F64 eigendecomposition; upstream itself rejects these on"
    " closed f32 backends (its Core ML backend included)"
)
_SPLAT = (
    "Gaussian-splat rendering: projection, tile binning and per-tile depth sorting into data-dependent"
    " lists; upstream runs it on the host CPU only"
)

#: Why each upstream kind rlx_mil does not lower is refused.
REFUSED: dict[str, str] = {
    **dict.fromkeys((
        "FakeQuantizeLSQBackwardX", "FakeQuantizeLSQBackwardScale", "FakeQuantizeBackward", "ComplexNormSqBackward",
        "MaxPool2dBackward", "Conv2dBackwardInput", "Conv2dBackwardWeight", "MaxPool3dBackward", "Conv3dBackwardInput",
        "Conv3dBackwardWeight", "SoftmaxCrossEntropyBackward", "AttentionBackwardAll", "LayerNormBackwardInput",
        "LayerNormBackwardGamma", "RmsNormBackwardInput", "RmsNormBackwardGamma", "RmsNormBackwardBeta",
        "GroupNormBackwardInput", "GroupNormBackwardGamma", "GroupNormBackwardBeta", "BatchNormInferenceBackwardInput",
        "BatchNormInferenceBackwardGamma", "BatchNormInferenceBackwardBeta", "SynthMatMulBackward",
        "SplineActivationBackwardX", "SplineActivationBackwardCoeff", "GatedDeltaNetBackward", "ScanBackward",
        "ScanBackwardXs", "LogMelBackward", "AdaLayerNormBackward", "GatedResidualBackward",
    ), _TRAINING),
    **dict.fromkeys((
        "DenseSolve", "BatchedDenseSolve", "Cholesky", "TriangularSolve", "Det", "LogDet", "Svd", "Qr", "Eigh",
        "EighBatch",
    ), _LAPACK),
    "EighBackward": _TRAINING,
    "EighBatchBackward": _TRAINING,
    **dict.fromkeys((
        "BiMap", "ReEig", "LogEig", "SpdBatchNorm", "SpdKarcherMean", "SpdKarcherMeanWeighted", "SpdLogMap", "SpdExpMap",
        "SpdParallelTransport", "SpdMatrixFnBatch",
    ), _SPD),
    **dict.fromkeys((
        "ReEigBackward", "LogEigBackward", "SpdBatchNormBackwardX", "SpdBatchNormBackwardG", "SpdLogMapBackward",
        "SpdExpMapBackward", "SpdParallelTransportBackward", "SpdMatrixFnBatchBackward",
    ), _TRAINING),
    **dict.fromkeys(("GaussianSplatRender", "GaussianSplatRenderBackward", "GaussianSplatPrepare",
                     "GaussianSplatRasterize"), _SPLAT),
    "ScaledQuantize": (
        "the encoder of ScaledMatMul's operands (round to the nearest FP8/FP4 code with its saturation"
        " rules); not lowered yet"
    ),
    "ScaledQuantScale": "computes ScaledQuantize's block scales (E8M0 exponents of block maxima); not lowered yet",
    "FftQ": (
        "a fixed-point I32 FFT whose per-stage shift / saturation (`FftQScale`) has no exact form in"
        " Core ML's int32 arithmetic; not lowered"
    ),
    "Custom": (
        "a user-registered op whose meaning lives in upstream's run-time op registry under its `name` (attrs"
        " are an opaque blob). The names upstream's Core ML backend knows whose kernels have an exact IR"
        " form are read as it: `onnx.ScatterND` (ScatterNd, reduction = attrs[0..4] as a little-endian"
        " i32: 0 none, 1 add, 2 mul, 3 max, 4 min), `onnx.Mod` (Binary Mod), `onnx.IsNaN` (x != x),"
        " `onnx.GatherND` and `onnx.GatherElements` (on the indices clamped as their kernels clamp them),"
        " `onnx.OneHot` (Compare / Where on the declared depth), `onnx.CumProd` (CumProd, Reverse for its"
        " reverse flag), `onnx.Einsum` (Transpose / Reshape onto all labels, Mul, Reduce Sum) and"
        " `onnx.ScatterElements` (non-finite data zeroed, indices clamped, not wrapped); the forms those"
        " kernels do not compute as ONNX (a run-time CumProd axis, an Einsum ellipsis, diagonal or"
        " disagreeing label sizes, ScatterElements index shapes mapped by count, integer ScatterElements"
        " data) are refused by name. Refused by name: its `collective.*` ops (host transport over a"
        " process group not in the graph); `onnx.NonZero` (output length depends on the values); the TTS"
        " alignment helpers `onnx.ConcatFromSequence`, `onnx.KittenConcatFromSequence`,"
        " `onnx.ExpandI64Align`, `onnx.AlignmentRange`, `onnx.VocoderWaveformSlice` (I64 durations and"
        " frame counts read at run time); every other name"
    ),
}


def lowered_kinds() -> set[str]:
    rules = registered_rules()
    return {name for name, op_type in OP_TYPES.items() if op_type in rules or name in ("Input", "Param", "Constant")}


def upstream_kinds_markdown() -> str:
    lowered = lowered_kinds()
    refused = [kind for kind in UPSTREAM_OP_KINDS if kind not in lowered]
    lines = [
        "",
        "## Every upstream op kind",
        "",
        f"The {len(UPSTREAM_OP_KINDS)} kinds of upstream's newest `OpKind` (commit `{SOURCE_COMMIT[:7]}`):"
        f" {len(UPSTREAM_OP_KINDS) - len(refused)} lower (rows above), {len(refused)} are refused by name"
        " when a graph is read (`UnsupportedOpFormatError`), for the reason given.",
        "",
        "| upstream kind | rlx_mil | why refused |",
        "|---|---|---|",
    ]
    for kind in UPSTREAM_OP_KINDS:
        if kind in lowered:
            lines.append(f"| {kind} | lowered | — |")
        else:
            lines.append(f"| {kind} | refused | {REFUSED.get(kind, 'no reason recorded')} |")
    lines.append("")
    return "\n".join(lines)
