"""The vision towers (DINOv2 with and without registers, SigLIP, SigLIP2) from tiny random
checkpoints in the layout `save_pretrained` writes (BF16, sharded), against the independent
NumPy forwards of `vision_numpy`, and converted through the MIL executor."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from models.vision_numpy import dinov2_forward, siglip2_forward, siglip_forward, taps
from rlx_mil import convert, milexec, reference
from rlx_mil.errors import CheckpointError, InvalidOptionError, UnsupportedConfigError
from rlx_mil.ir import Param
from rlx_mil.models import from_pretrained
from rlx_mil.models.checkpoint import Checkpoint
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint
from rlx_mil.models.resize import resize_matrix

#: fp32: the done-when bound; fp16: rounding through two layers and the pooling head.
RELATIVE = {"fp32": 1e-4, "fp16": 2e-2}


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))


def _config(family: str, **changes: Any) -> dict[str, Any]:
    config = copy.deepcopy(TINY_CONFIGS[family])
    config.update(changes)
    return config


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vision")
    configs = {"dinov2": _config("dinov2"), "dinov2_swiglu": _config("dinov2", use_swiglu_ffn=True),
               "dinov2_nobias": _config("dinov2", qkv_bias=False, hidden_act="gelu_pytorch_tanh"),
               "dinov2_with_registers": _config("dinov2_with_registers"), "siglip": _config("siglip"),
               "siglip2": _config("siglip2")}
    return {name: write_random_checkpoint(root / name, config, dtype="bfloat16", shards=2, seed=index)
            for index, (name, config) in enumerate(configs.items())}


def _pixels(batch: int, height: int, width: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, height, width)).astype(np.float32)


def _naflex(n: int, shapes: list[tuple[int, int]], spatial_input: bool = True) -> dict[str, np.ndarray]:
    """NaFlex feeds: one image per shape, each mask covering its rows x columns patches."""
    mask = np.zeros((len(shapes), n), np.int32)
    for b, (rows, cols) in enumerate(shapes):
        mask[b, :rows * cols] = 1
    patches = np.random.default_rng(2).standard_normal((len(shapes), n, 3 * 4 * 4)).astype(np.float32)
    feeds = {"pixel_values": patches, "pixel_attention_mask": mask}
    if spatial_input:
        feeds["spatial_shapes"] = np.array(shapes, np.int32)
    return feeds


@pytest.mark.parametrize("name", ["dinov2", "dinov2_swiglu", "dinov2_nobias", "dinov2_with_registers"])
@pytest.mark.parametrize("size", [(16, 16), (24, 20), (12, 12)])
def test_dinov2_matches_independent_forward(folders: dict[str, Path], name: str, size: tuple[int, int]) -> None:
    """The trained 16 x 16 image keeps the position table; other sizes resize it (bicubic;
    antialiased with registers), a non-square one included."""
    folder = folders[name]
    config = json.loads((folder / "config.json").read_text())
    pixels = _pixels(2, *size)
    want_pooled, want_hidden = dinov2_forward(Checkpoint(folder), config, pixels)
    graph, params = from_pretrained(folder, batch_size=2, image_size=size)
    got = reference.evaluate(graph, {"pixel_values": pixels}, params)["pooler_output"]
    assert _relative(got, want_pooled) <= 1e-5
    graph, params = from_pretrained(folder, batch_size=2, image_size=size, pooling=None)
    got = reference.evaluate(graph, {"pixel_values": pixels}, params)["last_hidden_state"]
    assert got.shape == want_hidden.shape == (2, 1 + config.get("num_register_tokens", 0) + (size[0] // 4) * (size[1] // 4), 32)
    assert _relative(got, want_hidden) <= 1e-5


@pytest.mark.parametrize("size", [(16, 16), (20, 24), (8, 8)])
def test_siglip_matches_independent_forward(folders: dict[str, Path], size: tuple[int, int]) -> None:
    folder = folders["siglip"]
    config = json.loads((folder / "config.json").read_text())
    pixels = _pixels(2, *size)
    want_pooled, want_hidden = siglip_forward(Checkpoint(folder), config, pixels)
    graph, params = from_pretrained(folder, batch_size=2, image_size=size)
    assert _relative(reference.evaluate(graph, {"pixel_values": pixels}, params)["pooler_output"], want_pooled) <= 1e-5
    graph, params = from_pretrained(folder, batch_size=2, image_size=size, normalize=True)
    embeds = reference.evaluate(graph, {"pixel_values": pixels}, params)["image_embeds"]
    want = want_pooled / np.linalg.norm(want_pooled, axis=-1, keepdims=True)
    np.testing.assert_allclose(embeds, want, rtol=1e-5, atol=1e-6)
    graph, params = from_pretrained(folder, batch_size=2, image_size=size, pooling=None)
    assert _relative(reference.evaluate(graph, {"pixel_values": pixels}, params)["last_hidden_state"], want_hidden) <= 1e-5


@pytest.mark.parametrize(("n", "shapes"), [(16, [(4, 4), (2, 8)]), (20, [(3, 5), (5, 4)]), (30, [(6, 5), (1, 7)]),
                                           (9, [(2, 2), (3, 3)])])
def test_siglip2_naflex_matches_independent_forward(folders: dict[str, Path], n: int,
                                                    shapes: list[tuple[int, int]]) -> None:
    """Patches with their mask and each image's spatial shape (an input): the position grid
    resized (bilinear, antialias) per image, padded patches masked out of the attention and
    the pooling head."""
    folder = folders["siglip2"]
    config = json.loads((folder / "config.json").read_text())
    feeds = _naflex(n, shapes)
    want_pooled, want_hidden = siglip2_forward(Checkpoint(folder), config, feeds["pixel_values"],
                                               feeds["pixel_attention_mask"], shapes)
    graph, params = from_pretrained(folder, batch_size=2, seq_len=n)
    assert _relative(reference.evaluate(graph, feeds, params)["pooler_output"], want_pooled) <= 1e-5
    graph, params = from_pretrained(folder, batch_size=2, seq_len=n, pooling=None)
    assert _relative(reference.evaluate(graph, feeds, params)["last_hidden_state"], want_hidden) <= 1e-5


@pytest.mark.parametrize(("n", "shape"), [(16, (4, 4)), (20, (3, 5)), (9, (2, 2))])
def test_siglip2_fixed_spatial_shape(folders: dict[str, Path], n: int, shape: tuple[int, int]) -> None:
    """`spatial_shape` fixes one shape for every image: no spatial_shapes input, the resize
    two constant matrices."""
    folder = folders["siglip2"]
    config = json.loads((folder / "config.json").read_text())
    feeds = _naflex(n, [shape, shape], spatial_input=False)
    want, _ = siglip2_forward(Checkpoint(folder), config, feeds["pixel_values"], feeds["pixel_attention_mask"],
                              [shape, shape])
    graph, params = from_pretrained(folder, batch_size=2, seq_len=n, spatial_shape=shape)
    assert _relative(reference.evaluate(graph, feeds, params)["pooler_output"], want) <= 1e-5


CONVERSIONS = [
    ("dinov2_swiglu", {"image_size": (20, 16)}, lambda c, t, f: dinov2_forward(t, c, f["pixel_values"])[0]),
    ("dinov2_with_registers", {}, lambda c, t, f: dinov2_forward(t, c, f["pixel_values"])[0]),
    ("siglip", {}, lambda c, t, f: siglip_forward(t, c, f["pixel_values"])[0]),
    ("siglip2", {"seq_len": 20},
     lambda c, t, f: siglip2_forward(t, c, f["pixel_values"], f["pixel_attention_mask"], [(3, 5), (5, 4)])[0]),
    ("siglip2_fixed", {"seq_len": 20, "spatial_shape": (3, 5)},
     lambda c, t, f: siglip2_forward(t, c, f["pixel_values"], f["pixel_attention_mask"], [(3, 5), (3, 5)])[0]),
]


@pytest.mark.parametrize(("name", "options", "forward"), CONVERSIONS, ids=[c[0] for c in CONVERSIONS])
def test_package_matches_independent_forward(folders: dict[str, Path], name: str, options: dict[str, Any],
                                             forward: Any) -> None:
    """The converted program (fp32 and fp16) through the MIL executor against the NumPy forward."""
    folder = folders[name.removesuffix("_fixed")]
    config = json.loads((folder / "config.json").read_text())
    graph, params = from_pretrained(folder, batch_size=2, **options)
    if "spatial_shape" in options:
        feeds = _naflex(options["seq_len"], [options["spatial_shape"]] * 2, spatial_input=False)
    elif "seq_len" in options:
        feeds = _naflex(options["seq_len"], [(3, 5), (5, 4)])
    else:
        size = options.get("image_size", (16, 16))
        feeds = {"pixel_values": _pixels(2, *size)}
    want = forward(config, Checkpoint(folder), feeds)
    for precision, limit in RELATIVE.items():
        model = convert(graph, params, target="iOS18", precision=precision)
        got = milexec.run(model, feeds)["pooler_output"]
        assert _relative(got, want) <= limit, precision


def test_checkpoints_hold_what_save_pretrained_writes(folders: dict[str, Path]) -> None:
    """The tensors the towers do not read are in the random checkpoints and pass the check:
    DINOv2's mask token, the SigLIP text tower and logit scale / bias."""
    assert "embeddings.mask_token" in Checkpoint(folders["dinov2"])
    siglip = Checkpoint(folders["siglip"])
    assert {"logit_scale", "logit_bias", "text_model.head.weight", "text_model.encoder.layers.0.mlp.fc1.weight"} <= set(siglip)
    graph, params = from_pretrained(folders["siglip"])
    read = {n.op.name for n in graph if isinstance(n.op, Param)}
    assert read == set(params) and all(n.startswith("vision_model.") for n in read)


def test_refusals(folders: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match="pooling 'auto'"):
        from_pretrained(folders["dinov2"], pooling="mean")
    with pytest.raises(InvalidOptionError, match="image encoder"):
        from_pretrained(folders["dinov2"], variant="decode", cache_len=4)
    with pytest.raises(InvalidOptionError, match="NaFlex"):
        from_pretrained(folders["siglip2"], image_size=16)
    with pytest.raises(InvalidOptionError, match="spatial_shape 5 x 5"):
        from_pretrained(folders["siglip2"], seq_len=20, spatial_shape=(5, 5))
    with pytest.raises(InvalidOptionError, match="whole images"):
        from_pretrained(folders["siglip"], spatial_shape=(4, 4))
    with pytest.raises(InvalidOptionError, match="smaller than one"):
        from_pretrained(folders["dinov2"], image_size=(2, 16))
    bad = json.loads((folders["siglip"] / "config.json").read_text())
    bad["vision_config"]["use_rope"] = True
    with pytest.raises(UnsupportedConfigError, match="use_rope"):
        _copy_with_config(folders["siglip"], tmp_path / "unknown", bad)
    bad = json.loads((folders["siglip"] / "config.json").read_text())
    bad["vision_config"]["vision_use_head"] = False
    folder = _copy_with_config(folders["siglip"], tmp_path / "headless", bad, load=False)
    with pytest.raises(InvalidOptionError, match="no pooling head"):
        from_pretrained(folder)
    bad = json.loads((folders["dinov2"] / "config.json").read_text())
    bad["num_hidden_layers"] = 3
    with pytest.raises(CheckpointError, match=r"encoder\.layer\.2"):
        _copy_with_config(folders["dinov2"], tmp_path / "layers", bad)
    bad = json.loads((folders["dinov2"] / "config.json").read_text())
    bad["image_size"] = [16, 32]
    with pytest.raises(UnsupportedConfigError, match="square grid"):
        _copy_with_config(folders["dinov2"], tmp_path / "oblong", bad)


def _copy_with_config(source: Path, folder: Path, config: dict[str, Any], load: bool = True) -> Path:
    folder.mkdir()
    for item in source.iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    (folder / "config.json").write_text(json.dumps(config))
    if load:
        from_pretrained(folder)
    return folder


def test_convert_hf_stores_the_image_preprocessing(folders: dict[str, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """preprocessor_config.json's resize and normalisation settings go into the package's metadata."""
    from rlx_mil.cli import main
    from rlx_mil.coreml.package_info import package_info
    from rlx_mil.models.image_preprocessing import METADATA_KEY

    folder = tmp_path / "siglip"
    folder.mkdir()
    for item in folders["siglip"].iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    settings = {"image_processor_type": "SiglipImageProcessor", "do_resize": True, "size": {"height": 16, "width": 16},
                "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "processor_class": "SiglipProcessor"}
    (folder / "preprocessor_config.json").write_text(json.dumps(settings))
    out = tmp_path / "siglip.mlpackage"
    assert main(["convert-hf", str(folder), "-o", str(out), "--normalize", "--verify", "--quiet"]) == 0
    assert "check image_embeds" in capsys.readouterr().out
    stored = json.loads(package_info(out).metadata[METADATA_KEY])
    assert stored == {k: v for k, v in settings.items() if k != "processor_class"}


@given(n_in=st.integers(1, 12), n_out=st.integers(1, 24), mode=st.sampled_from(["bicubic", "bilinear"]),
       antialias=st.booleans())
def test_resize_weights_match_the_tap_formulas(n_in: int, n_out: int, mode: str, antialias: bool) -> None:
    """The graph's resize matrices against the per-sample taps of the NumPy forwards."""
    matrix = resize_matrix(n_in, n_out, mode, antialias)
    want = np.zeros((n_out, n_in))
    for i in range(n_out):
        for j, weight in taps(n_in, n_out, mode, antialias, i).items():
            want[i, j] += weight
    np.testing.assert_allclose(matrix, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(matrix.sum(axis=1), 1.0, rtol=1e-5)  # every scheme preserves constants


@pytest.mark.parametrize("family", ["siglip", "siglip2"])
@pytest.mark.parametrize("prefixed", [False, True])
def test_vision_only_folders_read_as_the_dual_encoder(folders: dict[str, Path], tmp_path: Path, family: str,
                                                      prefixed: bool) -> None:
    """`SiglipVisionModel` / `Siglip2VisionModel` folders: the tower's config at the top level,
    its tensors at the root (transformers 5's save_pretrained) or under `vision_model.` (4's)."""
    from safetensors.numpy import save_file

    dual = folders[family]
    config = json.loads((dual / "config.json").read_text())["vision_config"]
    config["architectures"] = ["SiglipVisionModel" if family == "siglip" else "Siglip2VisionModel"]
    folder = tmp_path / "vision_only"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    stored = Checkpoint(dual)
    keep = "vision_model."
    tensors = {(name if prefixed else name[len(keep):]): np.asarray(stored[name]) for name in stored if name.startswith(keep)}
    save_file(tensors, str(folder / "model.safetensors"))
    feeds = _naflex(16, [(4, 4), (2, 8)]) if family == "siglip2" else {"pixel_values": _pixels(2, 16, 16)}
    graph, params = from_pretrained(folder, batch_size=2)
    want_graph, want_params = from_pretrained(dual, batch_size=2)
    np.testing.assert_array_equal(reference.evaluate(graph, feeds, params)["pooler_output"],
                                  reference.evaluate(want_graph, feeds, want_params)["pooler_output"])


def test_only_image_encoders_carry_the_image_preprocessing(folders: dict[str, Path], tmp_path: Path) -> None:
    """A vision-language folder converted as text keeps its image processor out of the package."""
    from types import SimpleNamespace

    from rlx_mil.llm.package_files import prepare_package
    from rlx_mil.models.image_preprocessing import METADATA_KEY

    settings = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "size": {"shortest_edge": 256}}
    text = write_random_checkpoint(tmp_path / "gemma3", TINY_CONFIGS["gemma3"])
    for folder, carried in ((folders["dinov2"], True), (text, False)):
        (folder / "preprocessor_config.json").write_text(json.dumps(settings))
        model = SimpleNamespace(user_defined_metadata={}, package_path=None)
        prepare_package(model, folder)
        assert (METADATA_KEY in model.user_defined_metadata) is carried
        if carried:
            assert json.loads(model.user_defined_metadata[METADATA_KEY]) == settings
        (folder / "preprocessor_config.json").unlink()


def test_spatial_shapes_range_is_declared_and_checked(folders: dict[str, Path]) -> None:
    """A SigLIP2 package declares spatial_shapes within [0, N]; the executor refuses more."""
    from rlx_mil.errors import MilExecError
    from rlx_mil.input_contract import INPUT_RANGES_METADATA_KEY

    graph, params = from_pretrained(folders["siglip2"], seq_len=12)
    model = convert(graph, params, target="iOS18", precision="fp32")
    assert json.loads(model.user_defined_metadata[INPUT_RANGES_METADATA_KEY])["main"]["spatial_shapes"] == [0, 12]
    feeds = _naflex(12, [(3, 4)])
    feeds["spatial_shapes"] = np.array([[1, 13]], np.int32)
    with pytest.raises(MilExecError, match="spatial_shapes"):
        milexec.run(model, feeds)
