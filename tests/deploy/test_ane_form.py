"""deploy="ane": every Hugging Face family and every upstream fixture lowers to a program of
convs on channels-first activations with nothing of rank > 4, computing the plain program's
numbers (prefill and stateful decode) and the NumPy reference's."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import upstream_fixture_paths
from graph_data import leaf_values

import rlx_mil
from rlx_mil import reference
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.state.kv_cache import NeuralEngineWarning
from rlx_mil.models.families import model_spec
from rlx_mil.models.pretrained import from_pretrained
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint
from rlx_mil.testing import supported_targets

from .ane_checks import assert_neural_engine_form, max_relative_error, run_both, run_steps, structure

FAMILIES = sorted(TINY_CONFIGS)
#: Families without a decode graph: text encoders (S tokens) and image encoders (their own size).
_SPECS = {family: type(model_spec(config)).__name__ for family, config in TINY_CONFIGS.items()}
IMAGE_ENCODERS = frozenset(f for f, kind in _SPECS.items() if kind == "VisionSpec")
ENCODERS = frozenset(f for f, kind in _SPECS.items() if kind in ("EncoderSpec", "ModernBertSpec"))
DECODERS = [f for f in FAMILIES if f not in ENCODERS | IMAGE_ENCODERS]
MAX_CONTEXT = 16
#: fp32 programs: the conv and the linear sum the same products in another order.
FP32_EXACT = 1e-5


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ane_checkpoints")
    return {family: write_random_checkpoint(root / family, TINY_CONFIGS[family], seed=5) for family in FAMILIES}


def _feeds(graph: Graph) -> dict[str, np.ndarray]:
    """Inputs in range: token ids within the vocabulary, every patch / token kept, NaFlex
    patches on a square grid."""
    feeds = leaf_values(graph, seed=1)[0]
    for name in ("attention_mask", "pixel_attention_mask"):
        if name in feeds:
            feeds[name] = np.ones_like(feeds[name])
    if "spatial_shapes" in feeds:
        side = int(np.sqrt(feeds["pixel_attention_mask"].shape[-1]))
        feeds["spatial_shapes"] = np.full_like(feeds["spatial_shapes"], side)
    return feeds


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_program_is_the_neural_engine_form_and_equals_plain(family: str, checkpoints: dict[str, Path]) -> None:
    if family in IMAGE_ENCODERS:
        graph, params = from_pretrained(checkpoints[family])
    else:
        graph, params = from_pretrained(checkpoints[family], "prefill", seq_len=5)
    feeds = _feeds(graph)
    plain = rlx_mil.lower(graph, params, precision="fp32")
    ane = rlx_mil.lower(graph, params, precision="fp32", deploy="ane")
    assert_neural_engine_form(ane)
    assert structure(ane)["ops"]["conv"] >= structure(plain)["ops"]["linear"]
    assert run_both(plain, ane, feeds, "fp32") < FP32_EXACT
    want = reference.evaluate(graph, feeds, params)
    got = rlx_mil.milexec.run(ane, feeds, precision_model="float32")
    assert max_relative_error({k: np.asarray(v, np.float32) for k, v in want.items()}, got) < 1e-4


def _decode_steps(tokens: list[int]) -> list[dict[str, np.ndarray]]:
    return [{"input_ids": np.array([[t]], np.int32), "position_ids": np.array([[i]], np.int32),
             "cache_position": np.array([i], np.int32)} for i, t in enumerate(tokens)]


@pytest.mark.parametrize("family", DECODERS)
def test_stateful_decode_program_equals_plain(family: str, checkpoints: dict[str, Path]) -> None:
    graph, params = from_pretrained(checkpoints[family], "decode", seq_len=1, cache_len=1, max_positions=MAX_CONTEXT,
                                    last_logits=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuralEngineWarning)
        plain = rlx_mil.lower(graph, params, precision="fp32", kv_cache="auto", max_context=MAX_CONTEXT)
        ane = rlx_mil.lower(graph, params, precision="fp32", kv_cache="auto", max_context=MAX_CONTEXT, deploy="ane")
    assert_neural_engine_form(ane)
    steps = _decode_steps([3, 1, 4, 1])
    for want, got in zip(run_steps(plain, steps), run_steps(ane, steps), strict=True):
        assert max_relative_error(want, got) < FP32_EXACT


def test_stacked_cache_is_rank_4_with_layers_folded_into_the_batch(checkpoints: dict[str, Path]) -> None:
    graph, params = from_pretrained(checkpoints["llama"], "decode", seq_len=1, cache_len=1, max_positions=MAX_CONTEXT)
    layers = TINY_CONFIGS["llama"]["num_hidden_layers"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuralEngineWarning)
        model = rlx_mil.convert(graph, params, kv_cache="auto", max_context=MAX_CONTEXT, deploy="ane")
    contract = rlx_mil.coreml.metadata.LLMContract.read(model.user_defined_metadata)
    assert contract is not None
    config = TINY_CONFIGS["llama"]
    kv_heads = config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    capacity = -(-MAX_CONTEXT // 32) * 32  # rounded up to the Neural Engine's multiple of 32
    assert contract.states["key_cache"] == [layers, kv_heads, capacity, head_dim]


@pytest.mark.parametrize("variant", ["prefill", "decode"])
def test_layout_changes_leave_nothing_for_reduce_transposes(variant: str, checkpoints: dict[str, Path]) -> None:
    """Consecutive layers stay channels-first: Core ML's transpose optimisation finds nothing to
    move or cancel, and no transpose feeds another."""
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

    graph, params = from_pretrained(checkpoints["qwen3"], variant, seq_len=5 if variant == "prefill" else 1,
                                    **({"cache_len": 3} if variant == "decode" else {}))
    program = rlx_mil.lower(graph, params, deploy="ane")
    ops = program.functions["main"].operations
    transposes = [op for op in ops if op.op_type == "transpose"]
    assert not [op for op in transposes if op.inputs["x"].op is not None and op.inputs["x"].op.op_type == "transpose"]
    before = sorted(tuple(op.inputs["perm"].val) for op in transposes)
    PASS_REGISTRY["common::reduce_transposes"](program)
    after = sorted(tuple(op.inputs["perm"].val) for op in program.functions["main"].operations if op.op_type == "transpose")
    assert after == before


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_fp16_safe_masks_and_norms(precision: str, checkpoints: dict[str, Path]) -> None:
    graph, params = from_pretrained(checkpoints["llama"], "prefill", seq_len=5)
    ane = rlx_mil.lower(graph, params, precision=precision, deploy="ane")
    fills = [float(op.inputs["b"].val) for f in ane.functions.values() for op in f.operations
             if op.op_type == "select" and op.inputs["b"].val is not None and np.ndim(op.inputs["b"].val) == 0]
    assert fills and all(np.isfinite(np.float16(v)) and v <= -1e4 for v in fills)
    ops = structure(ane)["ops"]
    assert ops["layer_norm"] == 2 * TINY_CONFIGS["llama"]["num_hidden_layers"] + 1  # each RmsNorm over [x, -x]
    assert ops["reduce_max"] == 0 and ops["rsqrt"] == 0


def test_fp16_program_stays_within_fp16_tolerance(checkpoints: dict[str, Path]) -> None:
    graph, params = from_pretrained(checkpoints["qwen3"], "prefill", seq_len=5)
    feeds = leaf_values(graph, seed=2)[0]
    want = reference.evaluate(graph, feeds, params)
    for form in ("plain", "ane"):
        got = rlx_mil.milexec.run(rlx_mil.lower(graph, params, precision="fp16", deploy=form), feeds)
        assert max_relative_error({k: np.asarray(v, np.float32) for k, v in want.items()}, got) < 2e-2, form


FIXTURES = upstream_fixture_paths()


@pytest.mark.skipif(not FIXTURES, reason="upstream JSON fixtures absent")
@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_upstream_fixture_neural_engine_form_equals_plain(path: Path) -> None:
    graph = Graph.from_json_file(path)
    feeds, params = leaf_values(graph)
    target = max(supported_targets(graph))
    plain = rlx_mil.lower(graph, params, target=target, precision="fp32")
    ane = rlx_mil.lower(graph, params, target=target, precision="fp32", deploy="ane")
    assert_neural_engine_form(ane, convs=structure(plain)["ops"]["linear"] > 0)
    assert run_both(plain, ane, feeds, "fp32") < FP32_EXACT


@pytest.mark.parametrize(("compress", "target", "decoder"), [
    ("int8;min_size=0", "iOS18", "constexpr_blockwise_shift_scale"),
    ("int8;min_size=0", "iOS17", "constexpr_affine_dequantize"),
    ("int4;min_size=0", "iOS18", "constexpr_blockwise_shift_scale"),
    ("lut4-group16;min_size=0", "iOS18", "constexpr_lut_to_dense"),
    ("lut6;min_size=0", "iOS16", "constexpr_lut_to_dense"),
])
def test_compressed_weights_become_conv_weights_of_rank_4(
    compress: str, target: str, decoder: str, checkpoints: dict[str, Path]
) -> None:
    graph, params = from_pretrained(checkpoints["llama"], "prefill", seq_len=5)
    feeds = leaf_values(graph, seed=3)[0]
    plain = rlx_mil.lower(graph, params, target=target, precision="fp32", compress=compress)
    ane = rlx_mil.lower(graph, params, target=target, precision="fp32", compress=compress, deploy="ane")
    assert_neural_engine_form(ane)
    convs = [op for f in ane.functions.values() for op in f.operations if op.op_type == "conv"]
    assert convs and all(op.inputs["weight"].op.op_type == decoder for op in convs)  # decoded at load, never reshaped
    assert all(len(op.inputs["weight"].shape) == 4 for op in convs)
    assert run_both(plain, ane, feeds, "fp32") < FP32_EXACT


def test_sparse_weight_becomes_a_sparse_conv_weight() -> None:
    """A `constexpr_sparse_to_dense` weight (what a pruned weight decodes with) is rebuilt with
    the conv's rank: its mask reshaped, its nonzero values as they are."""
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    from rlx_mil.coreml.deploy import DeployForm, RewriteContext, rewrite_program
    from rlx_mil.lowering.target import Precision, Target

    rng = np.random.default_rng(0)
    mask = rng.random((16, 8)) > 0.5
    weight = rng.standard_normal((16, 8)).astype(np.float32) * mask

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 3, 8), dtype=types.fp32)], opset_version=ct.target.iOS18)
    def program(x: object) -> object:
        dense = mb.constexpr_sparse_to_dense(nonzero_data=weight[mask], mask=mask.astype(types.np_uint1_dtype))
        return mb.linear(x=x, weight=dense, name="y")

    x = rng.standard_normal((1, 3, 8)).astype(np.float32)
    rewrite_program(program, RewriteContext(DeployForm.ANE, Target.IOS18, Precision.FP32))
    convs = [op for op in program.functions["main"].operations if op.op_type == "conv"]
    assert len(convs) == 1 and convs[0].inputs["weight"].op.op_type == "constexpr_sparse_to_dense"
    assert_neural_engine_form(program)
    got = rlx_mil.milexec.run(program, {"x": x}, precision_model="float32")
    np.testing.assert_allclose(next(iter(got.values())), x @ weight.T, rtol=1e-6, atol=1e-6)
