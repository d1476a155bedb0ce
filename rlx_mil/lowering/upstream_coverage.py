"""Every op kind of upstream's newest `OpKind`, lowered or refused, with the reason for each
refusal: the last section of docs/op-coverage.md.

A kind rlx_mil lowers is listed from the registry; a kind it does not is refused when read
(`UnsupportedOpFormatError` naming it, `rlx_mil.ir.serde.forms.UNSUPPORTED_UPSTREAM_OPS`) and must
have its reason here (a test checks both ways, so a kind that gains a lowering drops its reason).
"""

from __future__ import annotations

from rlx_mil.ir.ops import OP_TYPES
from rlx_mil.ir.serde.custom import READ_FORMS, READ_LIMITS, REFUSED_NAMES
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
}


#: Kinds whose meaning depends on a name they carry: the names read as IR ops lower, the rest
#: are refused by name (`custom_names_markdown` lists both).
BY_NAME: dict[str, str] = {
    "Custom": (
        f"{len(READ_FORMS)} names upstream's kernels define are read as IR ops and lower; {len(REFUSED_NAMES)}"
        " more, and every other name, are refused by name: see \"Custom names\" below"
    ),
}


def lowered_kinds() -> set[str]:
    rules = registered_rules()
    return {name for name, op_type in OP_TYPES.items() if op_type in rules or name in ("Input", "Param", "Constant")}


def upstream_kinds_markdown() -> str:
    lowered = lowered_kinds()
    refused = [kind for kind in UPSTREAM_OP_KINDS if kind not in lowered and kind not in BY_NAME]
    by_name = [kind for kind in UPSTREAM_OP_KINDS if kind in BY_NAME]
    lines = [
        "",
        "## Every upstream op kind",
        "",
        f"The {len(UPSTREAM_OP_KINDS)} kinds of upstream's newest `OpKind` (commit `{SOURCE_COMMIT[:7]}`):"
        f" {len(UPSTREAM_OP_KINDS) - len(refused) - len(by_name)} lower (rows above), {len(refused)} are refused"
        " by name when a graph is read (`UnsupportedOpFormatError`), for the reason given, and"
        f" {len(by_name)} ({', '.join(by_name)}) lowers or is refused by the name it carries.",
        "",
        "| upstream kind | rlx_mil | why refused |",
        "|---|---|---|",
    ]
    for kind in UPSTREAM_OP_KINDS:
        if kind in lowered:
            lines.append(f"| {kind} | lowered | — |")
        elif kind in BY_NAME:
            lines.append(f"| {kind} | by name | {BY_NAME[kind]} |")
        else:
            lines.append(f"| {kind} | refused | {REFUSED.get(kind, 'no reason recorded')} |")
    lines.append("")
    return "\n".join(lines) + custom_names_markdown()


def custom_names_markdown() -> str:
    """The `Custom` names: each read one with the IR form it becomes (and the forms of it that
    are refused), each refused one with the reason (`rlx_mil.ir.serde.custom`)."""
    lines = [
        "",
        "### Custom names",
        "",
        "A `Custom { name, num_inputs, attrs }` op means what upstream's run-time op registry holds under"
        " its name (the attrs are an opaque blob). Upstream's Core ML backend lowers `onnx.ScatterND`"
        " itself and runs the other names it knows on the host between Core ML segments; rlx_mil emits"
        " one program, so it reads a name whose kernel has an exact IR form as that form (which then"
        " lowers as the rows above say) and refuses the others by name when the graph is read.",
        "",
        "| Custom name | rlx_mil | read as / why refused | refused forms |",
        "|---|---|---|---|",
    ]
    for name, form in READ_FORMS.items():
        lines.append(f"| `{name}` | lowered | {form} | {READ_LIMITS.get(name, '—')} |")
    for name, why in REFUSED_NAMES.items():
        lines.append(f"| `{name}` | refused | {why} | — |")
    lines.append("| any other name | refused | what it computes lives only in a run-time op registry the graph does"
                 " not carry | — |")
    lines.append("")
    return "\n".join(lines)
