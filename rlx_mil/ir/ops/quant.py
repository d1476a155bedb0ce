"""Quantization: affine Quantize/Dequantize and matmul with block-quantized weights (spec sections 5.4-5.6)."""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from rlx_mil.errors import (
    AttributeValueError,
    DTypeError,
    ShapeError,
)
from rlx_mil.ir.builder import BuilderBase, squash
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import Op, UnaryOp, attr_f32, collect_ops
from rlx_mil.ir.serde.codecs import (
    F32,
    I32,
    MISSING,
    USIZE,
    Codec,
    OptionCodec,
    VecCodec,
    describe,
    did_you_mean,
    fail,
    json_object,
    required,
    struct_form,
    tagged,
)
from rlx_mil.ir.serde.versions import newest_only
from rlx_mil.ir.shape import Dim, DimLike, Shape, Static
from rlx_mil.ir.shape_checks import (
    declared_or,
    leading_flattened,
    numel,
    require_dims,
    require_float,
    require_numel,
    require_rank,
    size_of,
    unsigned_axis,
)


class QuantKind(enum.Enum):
    INT8_BLOCK = "Int8Block"
    INT8_BLOCK_ASYM = "Int8BlockAsym"
    INT4_BLOCK = "Int4Block"
    FP8_E4M3 = "Fp8E4m3"
    FP8_E5M2 = "Fp8E5m2"
    NVFP4_BLOCK = "Nvfp4Block"
    GGUF_Q2K = "GgufQ2K"
    GGUF_Q3K = "GgufQ3K"
    GGUF_Q4K = "GgufQ4K"
    GGUF_Q5K = "GgufQ5K"
    GGUF_Q6K = "GgufQ6K"
    GGUF_Q8K = "GgufQ8K"
    GGUF_Q4_0 = "GgufQ4_0"
    GGUF_Q8_0 = "GgufQ8_0"
    # Newest upstream only (spec part 2, section 1.7):
    GGUF_Q4_1 = "GgufQ4_1"
    GGUF_Q5_0 = "GgufQ5_0"
    GGUF_Q5_1 = "GgufQ5_1"
    GGUF_IQ4NL = "GgufIQ4NL"
    GGUF_IQ4XS = "GgufIQ4XS"
    GGUF_IQ2XXS = "GgufIQ2XXS"
    GGUF_IQ2XS = "GgufIQ2XS"
    GGUF_IQ2S = "GgufIQ2S"
    GGUF_IQ3XXS = "GgufIQ3XXS"
    GGUF_IQ3S = "GgufIQ3S"
    GGUF_IQ1S = "GgufIQ1S"
    GGUF_IQ1M = "GgufIQ1M"
    GGUF_TQ1_0 = "GgufTQ1_0"
    GGUF_TQ2_0 = "GgufTQ2_0"
    GGUF_MXFP4 = "GgufMXFP4"
    GGUF_NVFP4 = "GgufNVFP4"
    GGUF_Q1_0 = "GgufQ1_0"
    GGUF_Q2_0 = "GgufQ2_0"
    GGUF_FV5 = "GgufFV5"
    GGUF_FV5B = "GgufFV5B"
    GGUF_G8_0 = "GgufG8_0"
    MLX_AFFINE = "MlxAffine"
    MLX_MXFP4 = "MlxMxfp4"
    MLX_MXFP8 = "MlxMxfp8"
    MXFP4X2_BLOCK = "MxFp4x2Block"

    @property
    def parameters(self) -> tuple[str, ...]:
        """The struct fields of the variant (empty for a unit variant), in serde order."""
        if self in (QuantKind.INT8_BLOCK, QuantKind.INT8_BLOCK_ASYM, QuantKind.INT4_BLOCK):
            return ("block_size",)
        if self is QuantKind.MLX_AFFINE:
            return ("bits", "group_size")
        if self in (QuantKind.MLX_MXFP4, QuantKind.MLX_MXFP8, QuantKind.MXFP4X2_BLOCK):
            return ("group_size",)
        return ()

    @property
    def has_block_size(self) -> bool:
        return "block_size" in self.parameters

    @property
    def is_gguf(self) -> bool:
        return self.value.startswith("Gguf")

    @property
    def weight_inputs(self) -> int:
        """DequantMatMul inputs after x: packed bytes (GGUF), w_q + scale (MxFp4x2Block), else 3."""
        if self.is_gguf:
            return 1
        return 2 if self is QuantKind.MXFP4X2_BLOCK else 3


newest_only(*(kind for kind in QuantKind if list(QuantKind).index(kind) >= list(QuantKind).index(QuantKind.GGUF_Q4_1)))


@dataclass(frozen=True)
class QuantScheme:
    """A QuantScheme variant; `block_size`, `bits` and `group_size` are set exactly for the
    variants that carry them (`QuantKind.parameters`)."""

    kind: QuantKind
    block_size: int | None = None
    bits: int | None = None
    group_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("block_size", "bits", "group_size"):
            value = getattr(self, name)
            if name in self.kind.parameters:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise AttributeValueError(f"{self.kind.value} needs {name} >= 1, got {value!r}")
            elif value is not None:
                raise AttributeValueError(f"{self.kind.value} takes no {name}")

    @staticmethod
    def int8_block(block_size: int) -> QuantScheme:
        return QuantScheme(QuantKind.INT8_BLOCK, block_size)

    @staticmethod
    def int8_block_asym(block_size: int) -> QuantScheme:
        return QuantScheme(QuantKind.INT8_BLOCK_ASYM, block_size)

    @staticmethod
    def int4_block(block_size: int) -> QuantScheme:
        return QuantScheme(QuantKind.INT4_BLOCK, block_size)

    def __str__(self) -> str:
        values = [str(getattr(self, name)) for name in self.kind.parameters]
        return f"{self.kind.value}({', '.join(values)})" if values else self.kind.value


@dataclass(frozen=True)
class AffineQuantOp(UnaryOp):
    """Per-tensor (`axis=None`, one scale/zero point) or per-channel along `axis`."""

    axis: int | None
    scales: tuple[float, ...]
    zero_points: tuple[int, ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("scales", "zero_points"):
            if isinstance(getattr(self, name), (str, bytes)) or not hasattr(getattr(self, name), "__iter__"):
                raise AttributeValueError(f"{name} must be a sequence, got {getattr(self, name)!r}", op=self.type_name)
        object.__setattr__(self, "scales", tuple(attr_f32(self, "scales", s) for s in self.scales))
        zero_points = tuple(self.zero_points)
        if not all(isinstance(z, (int, np.integer)) and not isinstance(z, (bool, np.bool_)) for z in zero_points):
            raise AttributeValueError(f"zero_points must be integers, got {list(zero_points)}", op=self.type_name)
        object.__setattr__(self, "zero_points", tuple(int(z) for z in zero_points))


@dataclass(frozen=True)
class Quantize(AffineQuantOp):
    """Float -> I8: `clip(round_half_away(x * (1/s)) + zp, -128, 127)`."""

    type_name: ClassVar[str] = "Quantize"


@dataclass(frozen=True)
class Dequantize(AffineQuantOp):
    """I8 -> F32: `(q - zp) * s`."""

    type_name: ClassVar[str] = "Dequantize"

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("q",)


@dataclass(frozen=True)
class DequantMatMul(Op):
    type_name: ClassVar[str] = "DequantMatMul"
    scheme: QuantScheme

    def arity(self) -> int | None:
        return 1 + self.scheme.kind.weight_inputs

    def roles(self, count: int) -> tuple[str, ...] | None:
        kind = self.scheme.kind
        if kind.is_gguf:
            return ("x", "packed_w")
        if kind is QuantKind.NVFP4_BLOCK:
            return ("x", "w_q", "block_scale", "global_scale")
        if kind is QuantKind.MLX_AFFINE:
            return ("x", "w_q", "scales", "biases")
        if kind in (QuantKind.MLX_MXFP4, QuantKind.MLX_MXFP8):
            return ("x", "w_q", "scales", "zp")
        if kind is QuantKind.MXFP4X2_BLOCK:
            return ("x", "w_q", "scale")
        return ("x", "w_q", "scale", "zp")


# -------------------------------------------------------------------------------- shape rules


def _check_quant_attrs(op: Quantize | Dequantize, x: Shape, operand: str) -> None:
    if len(op.scales) != len(op.zero_points):
        raise AttributeValueError(f"{len(op.scales)} scales but {len(op.zero_points)} zero points")
    for s in op.scales:
        if not math.isfinite(s) or s == 0.0:
            raise AttributeValueError(f"scales must be finite and non-zero, got {s}")
    if op.axis is None:
        if len(op.scales) != 1:
            raise AttributeValueError(f"per-tensor quantization takes one scale, got {len(op.scales)}")
        return
    axis = unsigned_axis(op.axis, x.rank, operand=operand)
    channels = size_of(x.dims[axis])
    if channels is not None and channels != len(op.scales):
        raise AttributeValueError(
            f"per-channel axis {axis} of {x} has {channels} channels but {len(op.scales)} scales are given",
            operand=operand,
        )


@shape_rule(Quantize)
def _quantize(op: Quantize, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    require_float(ins[0], "x", "Quantize")
    _check_quant_attrs(op, ins[0], "x")
    return ins[0].with_dtype(DType.I8)


@shape_rule(Dequantize)
def _dequantize(op: Dequantize, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    if not ins[0].dtype.is_int:
        raise DTypeError(f"Dequantize needs an integer q, got {ins[0].dtype.value}", operand="q")
    _check_quant_attrs(op, ins[0], "q")
    return ins[0].with_dtype(DType.F32)


#: GGUF block geometry: (elements per block, bytes per block).
GGUF_BLOCKS: dict[QuantKind, tuple[int, int]] = {
    QuantKind.GGUF_Q2K: (256, 84),
    QuantKind.GGUF_Q3K: (256, 110),
    QuantKind.GGUF_Q4K: (256, 144),
    QuantKind.GGUF_Q5K: (256, 176),
    QuantKind.GGUF_Q6K: (256, 210),
    QuantKind.GGUF_Q8K: (256, 292),
    QuantKind.GGUF_Q4_0: (32, 18),
    QuantKind.GGUF_Q8_0: (32, 34),
    QuantKind.GGUF_Q4_1: (32, 20),
    QuantKind.GGUF_Q5_0: (32, 22),
    QuantKind.GGUF_Q5_1: (32, 24),
    QuantKind.GGUF_IQ4NL: (32, 18),
    QuantKind.GGUF_IQ4XS: (256, 136),
    QuantKind.GGUF_IQ2XXS: (256, 66),
    QuantKind.GGUF_IQ2XS: (256, 74),
    QuantKind.GGUF_IQ2S: (256, 82),
    QuantKind.GGUF_IQ3XXS: (256, 98),
    QuantKind.GGUF_IQ3S: (256, 110),
    QuantKind.GGUF_IQ1S: (256, 50),
    QuantKind.GGUF_IQ1M: (256, 56),
    QuantKind.GGUF_TQ1_0: (256, 54),
    QuantKind.GGUF_TQ2_0: (256, 66),
    QuantKind.GGUF_MXFP4: (32, 17),
    QuantKind.GGUF_NVFP4: (16, 9),
    QuantKind.GGUF_Q1_0: (128, 18),
    QuantKind.GGUF_Q2_0: (128, 34),
    QuantKind.GGUF_FV5: (256, 104),
    QuantKind.GGUF_FV5B: (256, 260),
    QuantKind.GGUF_G8_0: (32, 16),
}

#: The block schemes of upstream 0.2.2, whose weight layouts rlx_mil checks and decodes.
BLOCK_KINDS = (
    QuantKind.INT8_BLOCK, QuantKind.INT8_BLOCK_ASYM, QuantKind.INT4_BLOCK, QuantKind.FP8_E4M3,
    QuantKind.FP8_E5M2, QuantKind.NVFP4_BLOCK,
)


@shape_rule(DequantMatMul)
def _dequant_matmul(op: DequantMatMul, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    require_rank(x, "x", minimum=1)
    k = x.dims[-1]
    kind = op.scheme.kind
    if kind.is_gguf:
        n = _gguf_out_features(op, x, ins[1], declared)
    elif kind in BLOCK_KINDS:
        n = _block_weight_out_features(op, x, ins[1], declared)
        _check_block_scales(op, k, n, ins[2], ins[3])
    else:
        # MLX and two-level FP4 weights: packing per upstream's kernels, unchecked here.
        if declared is None or declared.rank == 0:
            raise ShapeError(f"{op.scheme} weights are packed; pass the output shape [..., N] explicitly")
        n = declared.dims[-1]
    inferred = Shape((*x.dims[:-1], n), x.dtype)
    return declared_or(inferred, declared, leading_flattened(x.dims, n))


def _gguf_out_features(op: DequantMatMul, x: Shape, packed: Shape, declared: Shape | None) -> Dim:
    if declared is None or declared.rank == 0:
        raise ShapeError(f"{op.scheme} weights are packed; pass the output shape [..., N] explicitly")
    n = declared.dims[-1]
    elems, block_bytes = GGUF_BLOCKS[op.scheme.kind]
    k_size, n_size = size_of(x.dims[-1]), size_of(n)
    if k_size is not None and k_size % elems != 0:
        raise ShapeError(f"K={k_size} of x is not a multiple of the {op.scheme} block of {elems}", operand="x")
    packed_elems = numel(packed.dims)
    if k_size is not None and n_size is not None and packed_elems is not None:
        want = n_size * (k_size // elems) * block_bytes
        have = packed_elems * packed.dtype.itemsize
        if have != want:
            raise ShapeError(
                f"packed_w {packed} holds {have} bytes; [N={n_size}, K={k_size}] in {op.scheme} needs {want}",
                operand="packed_w",
            )
    return n


def _block_weight_out_features(op: DequantMatMul, x: Shape, w_q: Shape, declared: Shape | None) -> Dim:
    """N of a legacy (`[K, N]`) weight; 4-bit weights may also be declared as packed bytes."""
    k = x.dims[-1]
    four_bit = op.scheme.kind in (QuantKind.INT4_BLOCK, QuantKind.NVFP4_BLOCK)
    if w_q.rank == 2:
        if w_q.dims[0] != k:
            raise ShapeError(f"w_q must be [K={k}, N], got {w_q}", operand="w_q")
        return w_q.dims[1]
    if four_bit and w_q.rank == 1:
        if declared is None or declared.rank == 0:
            raise ShapeError(f"w_q {w_q} is packed; pass the output shape [..., N] explicitly", operand="w_q")
        n = declared.dims[-1]
        k_size, n_size, packed = size_of(k), size_of(n), size_of(w_q.dims[0])
        if k_size is not None and n_size is not None and packed is not None and packed != (k_size * n_size + 1) // 2:
            raise ShapeError(
                f"packed w_q {w_q} must hold ceil(K*N/2) = {(k_size * n_size + 1) // 2} bytes for K={k_size}, N={n_size}",
                operand="w_q",
            )
        return n
    raise ShapeError(f"w_q must be [K, N] (rank 2), got {w_q}", operand="w_q")


def _check_block_scales(op: DequantMatMul, k: Dim, n: Dim, scale: Shape, zp: Shape) -> None:
    kind = op.scheme.kind
    k_size = size_of(k)
    if op.scheme.block_size is not None or kind is QuantKind.NVFP4_BLOCK:
        block = op.scheme.block_size if op.scheme.block_size is not None else 16
        scale_name = "block_scale" if kind is QuantKind.NVFP4_BLOCK else "scale"
        if k_size is not None:
            groups = Static(-(-k_size // block))
            require_dims(scale, (groups, n), scale_name, f"[ceil(K/{block}), N] =")
            if kind is QuantKind.INT8_BLOCK_ASYM:
                require_dims(zp, (groups, n), "zp", f"[ceil(K/{block}), N] =")
        if kind is QuantKind.NVFP4_BLOCK:
            require_numel(zp, 1, "global_scale", "one scale")
    elif kind in (QuantKind.FP8_E4M3, QuantKind.FP8_E5M2):
        n_size, have = size_of(n), numel(scale.dims)
        if n_size is not None and have not in (None, 0, n_size):
            raise ShapeError(f"scale must hold one value per output column (N={n_size}), got {scale}", operand="scale")


# -------------------------------------------------------------------------------- builder


class QuantBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def _affine(
        self, scales: object, zero_points: object, op: str, name: str | None
    ) -> tuple[tuple[float, ...], tuple[int, ...]]:
        try:
            return floats_arg(scales), ints_arg(zero_points)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise self._fail(
                AttributeValueError,
                f"scales must be numbers and zero_points integers, got {scales!r} and {zero_points!r}", op, name,
            ) from None

    def quantize(
        self,
        x: int,
        scales: float | Sequence[float],
        zero_points: int | Sequence[int],
        axis: int | None = None,
        *,
        name: str | None = None,
    ) -> int:
        """Float -> I8; per tensor (`axis=None`, one scale) or per channel along `axis`."""
        the_axis = None if axis is None else self._signed_to_unsigned(axis, x)
        op = Quantize(the_axis, *self._affine(scales, zero_points, "Quantize", name))
        return self.add_node(op, [x], name=name)

    def dequantize(
        self,
        q: int,
        scales: float | Sequence[float],
        zero_points: int | Sequence[int],
        axis: int | None = None,
        *,
        name: str | None = None,
    ) -> int:
        """I8 -> F32: `(q - zp) * scale`, per tensor or per channel along `axis`."""
        the_axis = None if axis is None else self._signed_to_unsigned(axis, q)
        op = Dequantize(the_axis, *self._affine(scales, zero_points, "Dequantize", name))
        return self.add_node(op, [q], name=name)

    def dequant_matmul(
        self,
        x: int,
        w_q: int,
        scale: int | None = None,
        zp: int | None = None,
        scheme: QuantScheme | str | None = None,
        out_shape: int | Sequence[DimLike] | None = None,
        *,
        name: str | None = None,
    ) -> int:
        """`x @ dequant(w_q)`.

        Block schemes take `(x, w_q [K, N], scale, zp)`; GGUF schemes take `(x, packed_w)`
        and need `out_shape` (`[..., N]`, or just N). `scheme` is a QuantScheme or text such
        as `"int8_block:32"`, `"Int4Block(32)"`, `"fp8_e4m3"`, `"gguf_q4_k"`.
        """
        if scheme is None:
            raise self._fail(AttributeValueError, "scheme is required", "DequantMatMul", name)
        the_scheme = self._scheme(scheme, name)
        inputs = [x, w_q] + [i for i in (scale, zp) if i is not None]
        declared = None
        if out_shape is not None:
            dtype = self._nodes[x].shape.dtype if self._is_node_id(x) else DType.F32
            if isinstance(out_shape, int):
                lead = self._dims(x)
                dims: Sequence[DimLike] = (*(lead[:-1] if lead else ()), out_shape)
            else:
                dims = out_shape
            declared = self._shape_arg(dims, dtype, "DequantMatMul", name)
        return self.add_node(DequantMatMul(the_scheme), inputs, declared, name=name)

    def _scheme(self, scheme: QuantScheme | str, name: str | None) -> QuantScheme:
        if isinstance(scheme, QuantScheme):
            return scheme
        if not isinstance(scheme, str):
            raise self._fail(
                AttributeValueError, f"a scheme is a QuantScheme or text such as 'int8_block:32', got {scheme!r}",
                "DequantMatMul", name,
            )
        # "int8_block:32", "Int4Block(32)", "mlx_affine:4:64" (parameters in QuantKind.parameters order)
        match = re.fullmatch(r"\s*([A-Za-z0-9_\-]+)\s*(?:[:(]\s*(\d+(?:\s*[:,]\s*\d+)*)\s*\)?)?\s*", scheme)
        kind = None
        if match:
            key = squash(match.group(1))
            kind = next((k for k in QuantKind if squash(k.value) == key), None)
        if match is None or kind is None:
            raise self._fail(AttributeValueError, f"unknown quantization scheme {scheme!r}", "DequantMatMul", name)
        numbers = [int(n) for n in re.split(r"\s*[:,]\s*", match.group(2))] if match.group(2) else []
        if len(numbers) > len(kind.parameters):
            raise self._fail(
                AttributeValueError, f"{kind.value} takes {len(kind.parameters)} parameters, got {numbers}",
                "DequantMatMul", name,
            )
        try:
            return QuantScheme(kind, **dict(zip(kind.parameters, numbers, strict=False)))
        except ValueError as err:
            raise self._fail(AttributeValueError, str(err), "DequantMatMul", name) from None


def floats_arg(values: float | Sequence[float]) -> tuple[float, ...]:
    return (float(values),) if isinstance(values, (int, float)) else tuple(float(v) for v in values)


def ints_arg(values: int | Sequence[int]) -> tuple[int, ...]:
    return (int(values),) if isinstance(values, int) else tuple(int(v) for v in values)


# -------------------------------------------------------------------------------- JSON


QUANT_KINDS = {k.value: k for k in QuantKind}


class QuantSchemeCodec(Codec):
    def decode(self, value: object, path: str) -> QuantScheme:
        tag, content = tagged(value, path, "a QuantScheme")
        kind = QUANT_KINDS.get(tag)
        if kind is None:
            fail(path, f"unknown QuantScheme variant {describe(tag)}{did_you_mean(tag, QUANT_KINDS)}")
        if not kind.parameters:
            if content is not MISSING and content is not None:
                fail(f"{path}.{tag}", f"QuantScheme {tag} takes no value, got {describe(content)}")
            return QuantScheme(kind)
        if content is MISSING:
            fields = ", ".join(f'"{name}": n' for name in kind.parameters)
            what = "block size" if kind.parameters == ("block_size",) else "parameters"
            fail(path, f'{tag} needs its {what}: {{"{tag}": {{{fields}}}}}')
        inner_path = f"{path}.{tag}"
        body = json_object(content, inner_path)
        for key in body:
            if key not in kind.parameters:
                fail(f"{inner_path}.{key}", f'unknown field "{key}" for QuantScheme {tag}')
        values: dict[str, int] = {}
        for name in kind.parameters:
            number = USIZE.decode(required(body, name, inner_path), f"{inner_path}.{name}")
            if number < 1:
                fail(f"{inner_path}.{name}", f"{name} must be at least 1, got 0")
            values[name] = number
        return QuantScheme(kind, **values)

    def encode(self, value: object, path: str) -> object:
        if not isinstance(value, QuantScheme):
            fail(path, f"expected a QuantScheme, got {value!r}")
        tag = value.kind.value
        if value.kind.parameters:
            return {
                tag: {name: USIZE.encode(getattr(value, name), f"{path}.{tag}.{name}") for name in value.kind.parameters}
            }
        return tag

#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    struct_form(Quantize, ("axis", OptionCodec(USIZE)), ("scales", VecCodec(F32)), ("zero_points", VecCodec(I32))),
    struct_form(Dequantize, ("axis", OptionCodec(USIZE)), ("scales", VecCodec(F32)), ("zero_points", VecCodec(I32))),
    struct_form(DequantMatMul, ("scheme", QuantSchemeCodec())),
)
