"""Every op of the RLX IR as typed, immutable data, one module per op family.

A family module (`rlx_mil.ir.ops.<family>`) holds its ops' dataclasses, their shape rules
(registered with `rlx_mil.ir.infer.shape_rule`), the builder methods `Graph` composes, and
their JSON forms. This package re-exports every op class and attribute type, so
`rlx_mil.ir.ops.MatMul` and `from rlx_mil.ir.ops import OP_TYPES` work regardless of the family
an op lives in.
"""

from types import ModuleType

from rlx_mil.ir.op_base import Op, f32
from rlx_mil.ir.ops import (
    attention,
    audio,
    codebook,
    control,
    conv,
    elementwise,
    fused,
    leaf,
    linalg,
    moe,
    norm,
    qcompute,
    quant,
    recurrent,
    reduce,
    resample,
    rng,
    rope,
    scaled,
    scatter,
    sequence,
    shape,
    signal,
    training,
)
from rlx_mil.ir.ops.attention import (
    Attention,
    AttentionBackward,
    AttentionBwdWrt,
    MaskKind,
    MaskType,
)
from rlx_mil.ir.ops.audio import (
    LogMel,
)
from rlx_mil.ir.ops.codebook import SynthKind, SynthMatMul, SynthReconstruct
from rlx_mil.ir.ops.control import (
    BatchElementwiseRegion,
    ChainOperand,
    ChainSource,
    ChainStep,
    CustomFn,
    ElementwiseRegion,
    If,
    RegionPrologue,
    Scan,
    TransformRegion,
    While,
)
from rlx_mil.ir.ops.conv import (
    Conv,
    Conv3d,
    ConvTranspose2d,
    ConvTranspose3d,
    FusedConvBiasAct,
    Pool,
)
from rlx_mil.ir.ops.elementwise import (
    Activation,
    ActivationKind,
    Binary,
    BinaryOp,
    Cast,
    Clamp,
    CmpOp,
    Compare,
    Fma,
    StopGradient,
    Where,
)
from rlx_mil.ir.ops.fused import (
    FusedAttentionBlock,
    FusedSwiGLU,
    FusedTransformerLayer,
)
from rlx_mil.ir.ops.leaf import (
    Constant,
    Input,
    Param,
)
from rlx_mil.ir.ops.linalg import (
    DotGeneral,
    FusedMatMulBiasAct,
    FusedMatMulResidual,
    LoraMatMul,
    MatMul,
)
from rlx_mil.ir.ops.moe import (
    DequantGroupedMatMul,
    DequantGroupedMatMulMlx,
    DequantMoEWeights,
    GroupedMatMul,
)
from rlx_mil.ir.ops.norm import (
    AdaLayerNorm,
    AdaNormKind,
    BatchNormInference,
    FusedResidualLN,
    FusedResidualNormOp,
    FusedResidualRmsNorm,
    GatedResidual,
    GroupNorm,
    LastAxisNormOp,
    LayerNorm,
    LayerNorm2d,
    RmsNorm,
)
from rlx_mil.ir.ops.qcompute import (
    FakeQuantize,
    QConv2d,
    QMatMul,
    ScaleMode,
    ScaleModeKind,
    SteKind,
)
from rlx_mil.ir.ops.quant import (
    AffineQuantOp,
    Dequantize,
    DequantMatMul,
    Quantize,
    QuantKind,
    QuantScheme,
)
from rlx_mil.ir.ops.recurrent import (
    GatedDeltaNet,
    Gru,
    Lstm,
    Mamba2,
    Rnn,
    SelectiveScan,
)
from rlx_mil.ir.ops.reduce import (
    ArgMax,
    ArgMin,
    ArgSort,
    CumMax,
    CumProd,
    Cumsum,
    Reduce,
    ReduceOp,
    Softmax,
    Sort,
    TopK,
)
from rlx_mil.ir.ops.resample import (
    Interpolate3d,
    ResizeNearest2x,
)
from rlx_mil.ir.ops.rng import (
    RngNormal,
    RngUniform,
    Sample,
)
from rlx_mil.ir.ops.rope import (
    AxialRope2d,
    Rope,
    RopeStyle,
)
from rlx_mil.ir.ops.scaled import (
    ScaledDequantize,
    ScaledFormat,
    ScaledGroupedMatMul,
    ScaledMatMul,
    ScaleKind,
    ScaleLayout,
)
from rlx_mil.ir.ops.scatter import (
    GatherElements,
    GatherNd,
    ScatterAdd,
    ScatterElements,
    ScatterNd,
    ScatterNdReduction,
)
from rlx_mil.ir.ops.sequence import KvAppend, Roll
from rlx_mil.ir.ops.shape import (
    Concat,
    Expand,
    Gather,
    Narrow,
    Pad,
    PadKind,
    PadMode,
    Reshape,
    Reverse,
    Slice,
    Tile,
    Transpose,
    Trilu,
)
from rlx_mil.ir.ops.signal import (
    ComplexNormSq,
    Conjugate,
    Fft,
    FftButterflyStage,
    FftNorm,
    Histogram,
    Im2Col,
    PartitionedConv,
    SplineActivation,
    WelchPeaks,
)
from rlx_mil.ir.ops.training import (
    ActivationBackward,
    CumsumBackward,
    FakeQuantizeLSQ,
    GatherBackward,
    ReluBackward,
    RopeBackward,
    SoftmaxCrossEntropy,
    SoftmaxCrossEntropyWithLogits,
)

#: Every op family module, in the order their ops are listed (leaves first).
FAMILIES: dict[str, ModuleType] = {
    module.__name__.rsplit(".", 1)[1]: module
    for module in (
        leaf, elementwise, linalg, quant, qcompute, norm, reduce, shape, scatter, rope,
        attention, fused, conv, resample, audio, moe, recurrent, control, rng, sequence, training, codebook, scaled,
        signal,
    )
}

#: Every op class, keyed by its upstream variant name.
OP_TYPES: dict[str, type[Op]] = {cls.type_name: cls for module in FAMILIES.values() for cls in module.OPS}


def family_of(op_type: type[Op]) -> str:
    """The family (module name) an op class is defined in."""
    return op_type.__module__.rsplit(".", 1)[1]


__all__ = [
    "FAMILIES",
    "OP_TYPES",
    "Activation",
    "ActivationBackward",
    "ActivationKind",
    "AdaLayerNorm",
    "AdaNormKind",
    "AffineQuantOp",
    "ArgMax",
    "ArgMin",
    "ArgSort",
    "Attention",
    "AttentionBackward",
    "AttentionBwdWrt",
    "AxialRope2d",
    "BatchElementwiseRegion",
    "BatchNormInference",
    "Binary",
    "BinaryOp",
    "Cast",
    "ChainOperand",
    "ChainSource",
    "ChainStep",
    "Clamp",
    "CmpOp",
    "Compare",
    "ComplexNormSq",
    "Concat",
    "Conjugate",
    "Constant",
    "Conv",
    "Conv3d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "CumMax",
    "CumProd",
    "Cumsum",
    "CumsumBackward",
    "CustomFn",
    "DequantGroupedMatMul",
    "DequantGroupedMatMulMlx",
    "DequantMatMul",
    "DequantMoEWeights",
    "Dequantize",
    "DotGeneral",
    "ElementwiseRegion",
    "Expand",
    "FakeQuantize",
    "FakeQuantizeLSQ",
    "Fft",
    "FftButterflyStage",
    "FftNorm",
    "Fma",
    "FusedAttentionBlock",
    "FusedConvBiasAct",
    "FusedMatMulBiasAct",
    "FusedMatMulResidual",
    "FusedResidualLN",
    "FusedResidualNormOp",
    "FusedResidualRmsNorm",
    "FusedSwiGLU",
    "FusedTransformerLayer",
    "GatedDeltaNet",
    "GatedResidual",
    "Gather",
    "GatherBackward",
    "GatherElements",
    "GatherNd",
    "GroupNorm",
    "GroupedMatMul",
    "Gru",
    "Histogram",
    "If",
    "Im2Col",
    "Input",
    "Interpolate3d",
    "KvAppend",
    "LastAxisNormOp",
    "LayerNorm",
    "LayerNorm2d",
    "LogMel",
    "LoraMatMul",
    "Lstm",
    "Mamba2",
    "MaskKind",
    "MaskType",
    "MatMul",
    "Narrow",
    "Op",
    "Pad",
    "PadKind",
    "PadMode",
    "Param",
    "PartitionedConv",
    "Pool",
    "QConv2d",
    "QMatMul",
    "QuantKind",
    "QuantScheme",
    "Quantize",
    "Reduce",
    "ReduceOp",
    "RegionPrologue",
    "ReluBackward",
    "Reshape",
    "ResizeNearest2x",
    "Reverse",
    "RmsNorm",
    "RngNormal",
    "RngUniform",
    "Rnn",
    "Roll",
    "Rope",
    "RopeBackward",
    "RopeStyle",
    "Sample",
    "ScaleKind",
    "ScaleLayout",
    "ScaleMode",
    "ScaleModeKind",
    "ScaledDequantize",
    "ScaledFormat",
    "ScaledGroupedMatMul",
    "ScaledMatMul",
    "Scan",
    "ScatterAdd",
    "ScatterElements",
    "ScatterNd",
    "ScatterNdReduction",
    "SelectiveScan",
    "Slice",
    "Softmax",
    "SoftmaxCrossEntropy",
    "SoftmaxCrossEntropyWithLogits",
    "Sort",
    "SplineActivation",
    "SteKind",
    "StopGradient",
    "SynthKind",
    "SynthMatMul",
    "SynthReconstruct",
    "Tile",
    "TopK",
    "TransformRegion",
    "Transpose",
    "Trilu",
    "WelchPeaks",
    "Where",
    "While",
    "f32",
    "family_of",
]
