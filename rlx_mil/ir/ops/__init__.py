"""Every op of the RLX IR subset as typed, immutable data, one module per op family.

A family module (`rlx_mil.ir.ops.<family>`) holds its ops' dataclasses, their shape rules
(registered with `rlx_mil.ir.infer.shape_rule`), the builder methods `Graph` composes, and
their JSON forms. This package re-exports every op class and enum, so `rlx_mil.ir.ops.MatMul`
and `from rlx_mil.ir.ops import OP_TYPES` work regardless of the family an op lives in.
"""

from types import ModuleType

from rlx_mil.ir.op_base import Op, f32
from rlx_mil.ir.ops import (
    attention,
    audio,
    conv,
    elementwise,
    fused,
    leaf,
    linalg,
    norm,
    qcompute,
    quant,
    reduce,
    resample,
    rng,
    rope,
    scatter,
    shape,
)
from rlx_mil.ir.ops.attention import Attention, AttentionBackward, AttentionBwdWrt, MaskKind, MaskType
from rlx_mil.ir.ops.audio import LogMel
from rlx_mil.ir.ops.conv import Conv, Conv3d, ConvTranspose2d, ConvTranspose3d, FusedConvBiasAct, Pool
from rlx_mil.ir.ops.elementwise import (
    Activation,
    ActivationKind,
    Binary,
    BinaryOp,
    Cast,
    CmpOp,
    Compare,
    Where,
)
from rlx_mil.ir.ops.fused import FusedAttentionBlock, FusedSwiGLU, FusedTransformerLayer
from rlx_mil.ir.ops.leaf import Constant, Input, Param
from rlx_mil.ir.ops.linalg import FusedMatMulBiasAct, LoraMatMul, MatMul
from rlx_mil.ir.ops.norm import (
    AdaLayerNorm,
    AdaNormKind,
    BatchNormInference,
    FusedResidualLN,
    FusedResidualRmsNorm,
    GatedResidual,
    GroupNorm,
    LayerNorm,
    LayerNorm2d,
    RmsNorm,
)
from rlx_mil.ir.ops.qcompute import FakeQuantize, QConv2d, QMatMul, ScaleMode, ScaleModeKind, SteKind
from rlx_mil.ir.ops.quant import Dequantize, DequantMatMul, Quantize, QuantKind, QuantScheme
from rlx_mil.ir.ops.reduce import Cumsum, Reduce, ReduceOp, Softmax, TopK
from rlx_mil.ir.ops.resample import Interpolate3d, ResizeNearest2x
from rlx_mil.ir.ops.rng import RngNormal, RngUniform, Sample
from rlx_mil.ir.ops.rope import AxialRope2d, Rope
from rlx_mil.ir.ops.scatter import (
    GatherElements,
    GatherNd,
    ScatterAdd,
    ScatterElements,
    ScatterNd,
    ScatterNdReduction,
)
from rlx_mil.ir.ops.shape import Concat, Expand, Gather, Narrow, Reshape, Transpose

#: Every op family module, in the order their ops are listed (leaves first).
FAMILIES: dict[str, ModuleType] = {
    module.__name__.rsplit(".", 1)[1]: module
    for module in (leaf, elementwise, linalg, quant, norm, reduce, shape, rope, attention, fused, conv, scatter, qcompute,
                   rng, resample, audio)
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
    "ActivationKind",
    "AdaLayerNorm",
    "AdaNormKind",
    "Attention",
    "AttentionBackward",
    "AttentionBwdWrt",
    "AxialRope2d",
    "BatchNormInference",
    "Binary",
    "BinaryOp",
    "Cast",
    "CmpOp",
    "Compare",
    "Concat",
    "Constant",
    "Conv",
    "Conv3d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "Cumsum",
    "DequantMatMul",
    "Dequantize",
    "Expand",
    "FakeQuantize",
    "FusedAttentionBlock",
    "FusedConvBiasAct",
    "FusedMatMulBiasAct",
    "FusedResidualLN",
    "FusedResidualRmsNorm",
    "FusedSwiGLU",
    "FusedTransformerLayer",
    "GatedResidual",
    "Gather",
    "GatherElements",
    "GatherNd",
    "GroupNorm",
    "Input",
    "Interpolate3d",
    "LayerNorm",
    "LayerNorm2d",
    "LogMel",
    "LoraMatMul",
    "MaskKind",
    "MaskType",
    "MatMul",
    "Narrow",
    "Op",
    "Param",
    "Pool",
    "QConv2d",
    "QMatMul",
    "QuantKind",
    "QuantScheme",
    "Quantize",
    "Reduce",
    "ReduceOp",
    "Reshape",
    "ResizeNearest2x",
    "RmsNorm",
    "RngNormal",
    "RngUniform",
    "Rope",
    "Sample",
    "ScaleMode",
    "ScaleModeKind",
    "ScatterAdd",
    "ScatterElements",
    "ScatterNd",
    "ScatterNdReduction",
    "Softmax",
    "SteKind",
    "TopK",
    "Transpose",
    "Where",
    "f32",
    "family_of",
]
