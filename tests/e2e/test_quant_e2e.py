"""End-to-end: Quantize, Dequantize, DequantMatMul (every block scheme, FP8, NVFP4, GGUF)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from e2e.factory import Feeds, e2e_settings, integers, normal, rng_for, seeds, uniform, weight_kinds
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.ops import QuantKind, QuantScheme
from rlx_mil.reference import gguf_dequantize
from rlx_mil.reference.quant import E4M3FN, E5M2, GGUF_FORMATS

small_dims = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4)


@st.composite
def channel_layout(draw: st.DrawFn) -> tuple[tuple[int, ...], int | None]:
    dims = draw(small_dims)
    axis = draw(st.one_of(st.none(), st.integers(0, len(dims) - 1)))
    return dims, axis


def _scales_and_zero_points(rng: np.random.Generator, count: int) -> tuple[list[float], list[int]]:
    scales = [float(s) for s in rng.uniform(0.02, 0.3, size=count).astype(np.float32)]
    zero_points = [int(z) for z in rng.integers(-10, 11, size=count)]
    return scales, zero_points


@pytest.mark.parametrize("per_channel", [False, True])
@e2e_settings(3)
@given(layout=channel_layout(), seed=seeds)
def test_quantize_and_dequantize_back(per_channel: bool, layout: tuple[tuple[int, ...], int | None], seed: int) -> None:
    """Per-tensor and per-channel codes, including saturation at -128/127. Inputs sit within
    0.25 of a code centre (never near a rounding tie), so the fp16 program's rounding of x,
    1/scale and their product (<= 0.15 code units for |code| <= 140) cannot change a code."""
    dims, axis = layout
    axis = (axis if axis is not None else len(dims) - 1) if per_channel else None
    rng = rng_for(seed)
    count = 1 if axis is None else dims[axis]
    scales, zero_points = _scales_and_zero_points(rng, count)
    shape = [1] * len(dims)
    if axis is not None:
        shape[axis] = count
    s = np.asarray(scales, np.float32).reshape(shape)
    z = np.asarray(zero_points, np.float32).reshape(shape)
    codes = rng.integers(-140, 141, size=dims)
    offset = rng.uniform(-0.25, 0.25, size=dims)
    x = ((codes - z + offset) * s).astype(np.float32)
    f = Feeds("quantize")
    xi = f.input("x", x)
    q = f.graph.quantize(xi, scales, zero_points, axis, name="q")
    back = f.graph.dequantize(q, scales, zero_points, axis, name="dequantized")
    f.verify([q, back])


@e2e_settings(5)
@given(layout=channel_layout(), code_kind=st.sampled_from(("input", "param", "constant")),
       code_dtype=st.sampled_from((DType.I8, DType.U8)), seed=seeds)
def test_dequantize(layout: tuple[tuple[int, ...], int | None], code_kind: str, code_dtype: DType, seed: int) -> None:
    """`(q - zp) * scale` from run-time codes, weight codes (constexpr on iOS16+) or constants."""
    dims, axis = layout
    rng = rng_for(seed)
    count = 1 if axis is None else dims[axis]
    scales, zero_points = _scales_and_zero_points(rng, count)
    low, high = (-128, 127) if code_dtype is DType.I8 else (0, 255)
    f = Feeds("dequantize")
    q = f.leaf(code_kind, "q", integers(rng, dims, low, high), code_dtype)
    outputs = [f.graph.dequantize(q, scales, zero_points, axis, name="dequantized")]
    if code_kind != "input":
        anchor = f.input("anchor", normal(rng, (1,)))  # a model needs a run-time input
        outputs.append(f.graph.add(outputs[0], anchor, name="shifted"))
    f.verify(outputs)


# ------------------------------------------------------------------------------ DequantMatMul

#: FP8 codes whose values are finite and moderate (no inf/NaN weights, no fp16 overflow).
E4M3_CODES = np.flatnonzero(np.isfinite(E4M3FN) & (np.abs(E4M3FN) <= 8)).astype(np.float32)
E5M2_CODES = np.flatnonzero(np.isfinite(E5M2) & (np.abs(E5M2) <= 8)).astype(np.float32)
#: NVFP4 block-scale codes (E4M3) between 1/8 and 2.
E4M3_SCALE_CODES = np.flatnonzero(np.isfinite(E4M3FN) & (E4M3FN >= 0.125) & (E4M3FN <= 2)).astype(np.float32)


def _pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """Spec 5.6 Int4 layout: flat row-major index f, byte f // 2, even f in the low nibble."""
    flat = codes.reshape(-1).astype(np.uint8)
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


@st.composite
def block_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], int, int, int]:
    lead = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3))
    k = draw(st.integers(1, 12))
    n = draw(st.integers(1, 5))
    block = draw(st.sampled_from([1, 2, 3, 4, 8, 32]))
    return lead, k, n, block


FOUR_BIT_FORMS = ("unpacked", "packed_logical", "packed_flat")


def _add_four_bit_weight(f: Feeds, kind: str, form: str, name: str, codes: np.ndarray) -> int:
    """A 4-bit weight as unpacked [K, N] codes, or packed bytes declared [K, N] (upstream's
    way) or [ceil(K*N/2)]. Run-time weights are always unpacked codes."""
    k, n = codes.shape
    if form == "unpacked" or kind == "input":
        return f.leaf(kind, name, codes, DType.U8)
    packed = _pack_nibbles(codes)
    if form == "packed_flat":
        return f.leaf(kind, name, packed, DType.U8)
    f.params[name] = packed
    return f.graph.param(name, [k, n], DType.U8)


@e2e_settings(5)
@given(case=block_cases(), weight_kind=weight_kinds, seed=seeds)
def test_dequant_matmul_block_schemes(case: tuple[tuple[int, ...], int, int, int], weight_kind: str, seed: int) -> None:
    """Int8Block (zp ignored), Int8BlockAsym (float zp), Int4Block (unsigned codes, no -8;
    unpacked, packed with the logical shape, packed flat), with partial last blocks;
    compressed weights or run-time codes. One node per scheme and weight form."""
    lead, k, n, block = case
    rng = rng_for(seed)
    groups = -(-k // block)
    f = Feeds("dequant_matmul_block")
    outputs = []
    variants = [(QuantKind.INT8_BLOCK, ""), (QuantKind.INT8_BLOCK_ASYM, "")]
    forms = FOUR_BIT_FORMS if weight_kind == "param" else FOUR_BIT_FORMS[:1]
    variants += [(QuantKind.INT4_BLOCK, form) for form in forms]
    for kind, form in variants:
        label = f"{kind.value.lower()}{'_' + form if form else ''}"
        x = f.input(f"x_{label}", normal(rng, (*lead, k)))
        if kind is QuantKind.INT4_BLOCK:
            w_q = _add_four_bit_weight(f, weight_kind, form, f"w_{label}", integers(rng, (k, n), 0, 15))
        else:
            w_q = f.leaf(weight_kind, f"w_{label}", integers(rng, (k, n), -127, 127), DType.I8)
        scale = f.leaf(weight_kind, f"scale_{label}", uniform(rng, (groups, n), 0.01, 0.05))
        zp_values = integers(rng, (groups, n), -4, 4) + (0.5 if kind is QuantKind.INT8_BLOCK_ASYM else 0.0)
        zp = f.leaf(weight_kind, f"zp_{label}", zp_values)
        outputs.append(f.graph.dequant_matmul(x, w_q, scale, zp, QuantScheme(kind, block), out_shape=[*lead, n],
                                              name=label))
    f.verify(outputs)


@e2e_settings(4)
@given(
    lead=hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=3),
    k=st.integers(1, 12),
    n=st.integers(1, 5),
    weight_kind=weight_kinds,
    seed=seeds,
)
def test_dequant_matmul_fp8(lead: tuple[int, ...], k: int, n: int, weight_kind: str, seed: int) -> None:
    """FP8 codes (OCP E4M3FN / IEEE-style E5M2) times a per-column scale, one node each."""
    rng = rng_for(seed)
    f = Feeds("dequant_matmul_fp8")
    outputs = []
    for kind, table in ((QuantKind.FP8_E4M3, E4M3_CODES), (QuantKind.FP8_E5M2, E5M2_CODES)):
        label = kind.value.lower()
        x = f.input(f"x_{label}", normal(rng, (*lead, k)))
        w_q = f.leaf(weight_kind, f"w_{label}", rng.choice(table, size=(k, n)), DType.U8)
        scale = f.leaf(weight_kind, f"scale_{label}", uniform(rng, (n,), 0.05, 0.5))
        zp = f.leaf(weight_kind, f"zp_{label}", np.zeros((n,), np.float32))
        outputs.append(f.graph.dequant_matmul(x, w_q, scale, zp, QuantScheme(kind), name=label))
    f.verify(outputs)


@e2e_settings(4)
@given(
    lead=hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=3),
    k=st.integers(1, 40),
    n=st.integers(1, 4),
    weight_kind=weight_kinds,
    seed=seeds,
)
def test_dequant_matmul_nvfp4(lead: tuple[int, ...], k: int, n: int, weight_kind: str, seed: int) -> None:
    """FP4 E2M1 codes x E4M3 block scales (groups of 16 along K, partial last group) x a
    global scale; every 4-bit weight form."""
    rng = rng_for(seed)
    groups = -(-k // 16)
    f = Feeds("dequant_matmul_nvfp4")
    outputs = []
    for form in FOUR_BIT_FORMS if weight_kind == "param" else FOUR_BIT_FORMS[:1]:
        x = f.input(f"x_{form}", normal(rng, (*lead, k)))
        w_q = _add_four_bit_weight(f, weight_kind, form, f"w_{form}", integers(rng, (k, n), 0, 15))
        block_scale = f.leaf(weight_kind, f"block_scale_{form}", rng.choice(E4M3_SCALE_CODES, size=(groups, n)),
                             DType.U8)
        global_scale = f.leaf(weight_kind, f"global_scale_{form}", uniform(rng, (1,), 0.05, 0.2))
        scheme = QuantScheme(QuantKind.NVFP4_BLOCK)
        outputs.append(f.graph.dequant_matmul(x, w_q, block_scale, global_scale, scheme, out_shape=[*lead, n],
                                              name=form))
    f.verify(outputs)


#: Byte offsets of each GGUF block's float fields: (offset, "f16" | "f32").
GGUF_FLOAT_FIELDS: dict[QuantKind, tuple[tuple[int, str], ...]] = {
    QuantKind.GGUF_Q8_0: ((0, "f16"),),
    QuantKind.GGUF_Q4_0: ((0, "f16"),),
    QuantKind.GGUF_Q2K: ((80, "f16"), (82, "f16")),
    QuantKind.GGUF_Q3K: ((108, "f16"),),
    QuantKind.GGUF_Q4K: ((0, "f16"), (2, "f16")),
    QuantKind.GGUF_Q5K: ((0, "f16"), (2, "f16")),
    QuantKind.GGUF_Q6K: ((208, "f16"),),
    QuantKind.GGUF_Q8K: ((0, "f32"),),
    QuantKind.GGUF_Q4_1: ((0, "f16"), (2, "f16")),
    QuantKind.GGUF_Q5_0: ((0, "f16"),),
    QuantKind.GGUF_Q5_1: ((0, "f16"), (2, "f16")),
    QuantKind.GGUF_IQ4NL: ((0, "f16"),),
    QuantKind.GGUF_IQ4XS: ((0, "f16"),),
    QuantKind.GGUF_MXFP4: ((0, "e8m0"),),
    QuantKind.GGUF_TQ2_0: ((64, "f16"),),
}
#: The GGUF kinds rlx_mil decodes (the newest-only i-quants beyond IQ4, TQ1_0, GGUF NVFP4 and the
#: fork formats load but are refused at conversion).
GGUF_KINDS = tuple(GGUF_FLOAT_FIELDS)


def gguf_weight(rng: np.random.Generator, kind: QuantKind, n: int, k: int) -> np.ndarray:
    """Random llama.cpp blocks for an `[N, K]` weight whose values have std ~ 1/sqrt(K) (so
    x @ W stays O(1) and fp16 keeps ~3 digits): random code bytes, then every block's scale
    fields set to one value chosen from a unit-scale decode."""
    elems, nbytes, _ = GGUF_FORMATS[kind]
    blocks = rng.integers(0, 256, size=(n * (k // elems), nbytes), dtype=np.uint8)

    def with_scale(value: float) -> np.ndarray:
        out = blocks.copy()
        for offset, fmt in GGUF_FLOAT_FIELDS[kind]:
            if fmt == "e8m0":  # a power-of-two scale byte: the nearest power of two
                out[:, offset] = int(np.clip(np.round(np.log2(value)) + 127, 0, 254))
                continue
            width = 2 if fmt == "f16" else 4
            field = np.full((out.shape[0], 1), value, dtype="<f2" if fmt == "f16" else "<f4")
            out[:, offset : offset + width] = field.view(np.uint8)
        return out

    unit_std = float(np.std(gguf_dequantize(kind, with_scale(1.0), k)))
    return with_scale((1.0 / np.sqrt(k)) / max(unit_std, 1e-6)).reshape(-1)


@e2e_settings(2)
@given(
    lead=hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=2),
    n=st.integers(1, 3),
    blocks=st.integers(1, 2),
    seed=seeds,
)
def test_dequant_matmul_every_gguf_scheme(lead: tuple[int, ...], n: int, blocks: int, seed: int) -> None:
    """Q2_K..Q8_K, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, IQ4_NL/IQ4_XS, MXFP4 and TQ2_0 weights (`[N, K]`
    blocks, y = x @ W.T), one node each."""
    rng = rng_for(seed)
    f = Feeds("dequant_matmul_gguf")
    outputs = []
    for kind in GGUF_KINDS:
        k = GGUF_FORMATS[kind][0] * blocks
        label = kind.value.lower()
        x = f.input(f"x_{label}", normal(rng, (*lead, k)))
        packed = f.param(f"w_{label}", gguf_weight(rng, kind, n, k), DType.U8)
        scheme = QuantScheme(kind)
        outputs.append(f.graph.dequant_matmul(x, packed, scheme=scheme, out_shape=[*lead, n], name=label))
    f.verify(outputs)
