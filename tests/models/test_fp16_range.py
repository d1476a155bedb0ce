"""Gemma's residual stream under fp16: held divided by `DecoderSpec.stream_scale`, a tiny Gemma 3
whose hidden states pass fp16's 65,504 gives finite logits matching the independent forward,
where the same graph without the scaling gives inf / NaN."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import numpy as np
import pytest

import rlx_mil
from models.hf_numpy import FORWARDS
from rlx_mil import milexec
from rlx_mil.errors import Fp16OverflowWarning, InvalidOptionError
from rlx_mil.models import from_pretrained
from rlx_mil.models.families import model_spec
from rlx_mil.models.hf_config import GEMMA_STREAM_SCALE, DecoderSpec
from rlx_mil.models.pretrained import build
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint
from rlx_mil.models.verify import verify_package

FP16_MAX = 65504.0
#: The post-feed-forward norms' weights: each layer adds up to ~2.5 x 2e4 to a channel of the
#: stream (a normalised row of 32 holds values up to ~2.5), three layers pass 65,504.
LOUD_GAMMA = 2e4


def ids() -> np.ndarray:
    return np.random.default_rng(3).integers(0, 96, (1, 8)).astype(np.int32)


@pytest.fixture(scope="module")
def loud_gemma3(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """A tiny Gemma 3 whose post-feed-forward norms push the residual stream past fp16's range."""
    cfg = TINY_CONFIGS["gemma3_text"]
    folder = write_random_checkpoint(tmp_path_factory.mktemp("loud") / "gemma3", cfg, seed=0)
    _, params = from_pretrained(folder, seq_len=8)
    loud = dict(params)
    for i in range(cfg["num_hidden_layers"]):
        name = f"model.layers.{i}.post_feedforward_layernorm.weight"
        loud[name] = np.full_like(np.asarray(params[name]), LOUD_GAMMA)
    return loud


def test_gemma_specs_hold_the_stream_scaled() -> None:
    for family in ("gemma3_text", "gemma2"):
        spec = model_spec(TINY_CONFIGS[family])
        assert isinstance(spec, DecoderSpec) and spec.stream_scale == GEMMA_STREAM_SCALE
    assert model_spec(TINY_CONFIGS["llama"]).stream_scale is None  # type: ignore[union-attr]


def test_loud_gemma3_fp16_is_finite_and_matches_where_unscaled_overflows(loud_gemma3: dict[str, np.ndarray]) -> None:
    loud = loud_gemma3
    cfg = TINY_CONFIGS["gemma3_text"]
    want, _ = FORWARDS[cfg["model_type"]](loud, cfg, ids())
    spec = model_spec(cfg)
    assert isinstance(spec, DecoderSpec)
    scaled, _, _ = build(spec, seq_len=8)
    plain, _, _ = build(dataclasses.replace(spec, stream_scale=None), seq_len=8)
    feeds = {"input_ids": ids()}

    # the stream as the model computes it (fp32, unscaled) passes fp16's range ...
    exact_run = milexec.execute(rlx_mil.convert(plain, loud, precision="fp32"), feeds, keep_values=True)
    residuals = [v for name, v in exact_run.values.items() if "residual" in name]
    assert residuals and max(float(np.abs(v).max()) for v in residuals) > FP16_MAX
    # ... so in fp16 without the scaling a residual add overflows
    broken = milexec.execute(rlx_mil.convert(plain, loud, precision="fp16"), feeds)
    assert not np.isfinite(broken.outputs["logits"]).all()
    assert broken.nonfinite_origins and "residual" in broken.nonfinite_origins[0]

    half = milexec.run(rlx_mil.convert(scaled, loud, precision="fp16"), feeds)["logits"]
    assert np.isfinite(half).all()
    assert np.abs(half - want).max() <= 5e-2 * np.abs(want).max()
    assert (half.argmax(-1) == want.argmax(-1)).mean() >= 0.75

    # fp32: the scaled graph computes what the plain one does (powers of two scale exactly).
    exact = milexec.run(rlx_mil.convert(scaled, loud, precision="fp32"), feeds)["logits"]
    unscaled = exact_run.outputs["logits"]
    assert np.abs(exact - want).max() <= 1e-4 * np.abs(want).max()
    assert np.abs(exact - unscaled).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("scale", [3.0, 0.0, -4.0, float("inf")])
def test_stream_scale_must_be_a_power_of_two(scale: float) -> None:
    spec = model_spec(TINY_CONFIGS["gemma3_text"])
    assert isinstance(spec, DecoderSpec)
    with pytest.raises(InvalidOptionError, match="stream_scale"):
        build(dataclasses.replace(spec, stream_scale=scale), seq_len=4)


def test_verify_names_the_op_where_an_fp16_package_overflows(loud_gemma3: dict[str, np.ndarray], tmp_path: Path) -> None:
    """`--verify` (verify_package) on a package that overflows: a typed warning naming the op."""
    loud = loud_gemma3
    spec = model_spec(TINY_CONFIGS["gemma3_text"])
    assert isinstance(spec, DecoderSpec)
    plain, _, _ = build(dataclasses.replace(spec, stream_scale=None), seq_len=8)
    package = tmp_path / "plain.mlpackage"
    rlx_mil.convert(plain, loud, precision="fp16").save(str(package))
    with pytest.warns(Fp16OverflowWarning, match="output 'logits' holds .* inf/NaN") as caught:
        checks = verify_package(plain, loud, package, {"input_ids": ids()}, "fp16")
    assert not checks[0].ok
    op = next(w.message for w in caught if isinstance(w.message, Fp16OverflowWarning)).op
    assert op is not None and "residual" in op and "(add)" in op

    scaled, _, _ = build(spec, seq_len=8)
    package = tmp_path / "scaled.mlpackage"
    rlx_mil.convert(scaled, loud, precision="fp16").save(str(package))
    with warnings.catch_warnings():
        warnings.simplefilter("error", Fp16OverflowWarning)
        assert all(c.ok for c in verify_package(scaled, loud, package, {"input_ids": ids()}, "fp16"))


def test_stateful_verify_names_the_op_where_fp16_logits_turn_nonfinite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stateful fp16 package of the loud Gemma 3 built without the stream scaling: the
    stateful verification warns, naming the op (with the scaling it passes, silently)."""
    from safetensors.numpy import load_file, save_file

    from rlx_mil.llm.package import convert_llm_checkpoint, verify_stateful
    from rlx_mil.models.families import gemma2

    cfg = TINY_CONFIGS["gemma3_text"]
    folder = write_random_checkpoint(tmp_path / "loud", cfg, seed=0)
    weights = load_file(str(folder / "model.safetensors"))
    for i in range(cfg["num_hidden_layers"]):
        name = f"model.layers.{i}.post_feedforward_layernorm.weight"
        weights[name] = np.full_like(weights[name], LOUD_GAMMA)
    save_file(weights, str(folder / "model.safetensors"))
    prompt = [int(t) for t in ids()[0]]

    scaled = tmp_path / "scaled.mlpackage"
    convert_llm_checkpoint(folder, scaled, max_context=32, precision="fp16")
    with warnings.catch_warnings():
        warnings.simplefilter("error", Fp16OverflowWarning)
        assert verify_stateful(folder, scaled, prompt, 2, precision="fp16").ok

    monkeypatch.setattr(gemma2, "GEMMA_STREAM_SCALE", None)
    plain = tmp_path / "plain.mlpackage"
    convert_llm_checkpoint(folder, plain, max_context=32, precision="fp16")
    with pytest.warns(Fp16OverflowWarning, match="logits of step 1 hold inf/NaN") as caught:
        assert not verify_stateful(folder, plain, prompt, 2, precision="fp16").ok
    op = next(w.message for w in caught if isinstance(w.message, Fp16OverflowWarning)).op
    assert op is not None and "residual" in op and "token" in op


def test_compression_check_names_the_node_that_leaves_fp16s_range(loud_gemma3: dict[str, np.ndarray]) -> None:
    """The compression check's reference run (on generated inputs) warns for an fp16
    conversion whose values pass 65,504, naming the node; not with the scaling, nor for fp32."""
    spec = model_spec(TINY_CONFIGS["gemma3_text"])
    assert isinstance(spec, DecoderSpec)
    plain, _, _ = build(dataclasses.replace(spec, stream_scale=None), seq_len=8)
    with pytest.warns(Fp16OverflowWarning, match="past fp16's 65,504") as caught:
        rlx_mil.convert(plain, loud_gemma3, precision="fp16", compress="int8")
    op = next(w.message for w in caught if isinstance(w.message, Fp16OverflowWarning)).op
    assert op is not None and "residual" in op

    scaled, _, _ = build(spec, seq_len=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Fp16OverflowWarning)
        rlx_mil.convert(scaled, loud_gemma3, precision="fp16", compress="int8")
        rlx_mil.convert(plain, loud_gemma3, precision="fp32", compress="int8")
