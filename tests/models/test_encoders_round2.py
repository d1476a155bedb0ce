"""ModernBERT and RoBERTa / XLM-RoBERTa encoders (E5- and BGE-style sentence-transformers
folders among them) from Hugging Face-layout checkpoints (BF16, sharded): the graphs and the
converted packages (NumPy MIL executor) against independent NumPy forwards
(tests/models/encoders_numpy.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import rlx_mil
from models.encoders_numpy import cls_pool, modernbert_forward, roberta_forward
from models.hf_numpy import mean_pool
from models.test_encoders import sentence_transformers_folder
from rlx_mil import milexec, reference
from rlx_mil.errors import CheckpointError, InvalidOptionError, UnsupportedConfigError
from rlx_mil.models import from_pretrained
from rlx_mil.models.checkpoint import SINGLE_FILE, Checkpoint
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

SEQ = 7
MODERNBERT = TINY_CONFIGS["modernbert"]
XLMR = TINY_CONFIGS["xlm-roberta"]
#: fp32: 1e-4 of the output's largest magnitude; fp16: 2e-2 of it (two or three layers).
RELATIVE = {"fp32": 1e-4, "fp16": 2e-2}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("encoders2")
    return {
        "modernbert": write_random_checkpoint(root / "modernbert", MODERNBERT, dtype="bfloat16", shards=2, seed=5),
        "xlm-roberta": write_random_checkpoint(root / "xlmr", XLMR, dtype="bfloat16", shards=2, seed=6),
        "roberta": write_random_checkpoint(root / "roberta", TINY_CONFIGS["roberta"], seed=7),
    }


def feeds(cfg: dict[str, Any], batch: int = 2) -> dict[str, np.ndarray]:
    """Two sentences, the second right-padded with the pad token (as tokenizers pad)."""
    rng = np.random.default_rng(11)
    ids = rng.integers(3, cfg["vocab_size"], (batch, SEQ)).astype(np.int32)
    mask = np.ones((batch, SEQ), np.int32)
    mask[1, 4:] = 0
    ids[1, 4:] = cfg["pad_token_id"]
    return {"input_ids": ids, "attention_mask": mask}


def copy_folder(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def real_rows(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The token positions' rows (padding positions' outputs are unspecified)."""
    return hidden[mask.astype(bool)]


def test_modernbert_hidden_states_match_independent_forward(folders: dict[str, Path]) -> None:
    graph, params = from_pretrained(folders["modernbert"], seq_len=SEQ, batch_size=2, pooling=None)
    f = feeds(MODERNBERT)
    got = reference.evaluate(graph, f, params)["last_hidden_state"]
    want = modernbert_forward(Checkpoint(folders["modernbert"]), MODERNBERT, f["input_ids"], f["attention_mask"])
    assert relative_error(real_rows(got, f["attention_mask"]), real_rows(want, f["attention_mask"])) < 1e-5
    # Local layers see two positions either side: without the window the outputs differ.
    wide = {**MODERNBERT, "local_attention": 64}
    assert relative_error(real_rows(got, f["attention_mask"]),
                          real_rows(modernbert_forward(Checkpoint(folders["modernbert"]), wide, f["input_ids"],
                                                       f["attention_mask"]), f["attention_mask"])) > 1e-3


def test_modernbert_pools_by_classifier_pooling_without_sentence_transformers(folders: dict[str, Path]) -> None:
    """No modules.json: `classifier_pooling` (the tiny config's "mean") pools, unnormalised."""
    graph, params = from_pretrained(folders["modernbert"], seq_len=SEQ, batch_size=2)
    f = feeds(MODERNBERT)
    hidden = modernbert_forward(Checkpoint(folders["modernbert"]), MODERNBERT, f["input_ids"], f["attention_mask"])
    got = reference.evaluate(graph, f, params)["sentence_embedding"]
    np.testing.assert_allclose(got, mean_pool(hidden, f["attention_mask"], False), rtol=1e-5, atol=1e-5)


def test_modernbert_legacy_config_and_masked_lm_layout(folders: dict[str, Path], tmp_path: Path) -> None:
    """transformers 4's fields (`global_attn_every_n_layers`, `global_rope_theta`,
    `local_rope_theta`) give the graph of the 5.x form; ModernBertForMaskedLM's `model.` names and
    head load; a sentence-transformers CLS + Normalize pipeline pools."""
    folder = tmp_path / "mlm"
    folder.mkdir()
    legacy: dict[str, Any] = {k: v for k, v in MODERNBERT.items() if k not in ("layer_types", "rope_parameters")}
    legacy.update(architectures=["ModernBertForMaskedLM"], global_attn_every_n_layers=3, global_rope_theta=160000.0,
                  local_rope_theta=10000.0, reference_compile=None, repad_logits_with_grad=False)
    (folder / "config.json").write_text(json.dumps(legacy))
    tensors = Checkpoint(folders["modernbert"])
    stored = {f"model.{name}": np.asarray(tensors[name]) for name in tensors}
    e = MODERNBERT["hidden_size"]
    stored |= {"head.dense.weight": np.zeros((e, e), np.float32), "head.norm.weight": np.ones(e, np.float32),
               "decoder.bias": np.zeros(MODERNBERT["vocab_size"], np.float32)}
    save_file(stored, str(folder / SINGLE_FILE))
    sentence_transformers_folder(folder, "pooling_mode_cls_token", normalize=True)
    graph, params = from_pretrained(folder, seq_len=SEQ, batch_size=2)
    f = feeds(MODERNBERT)
    hidden = modernbert_forward(Checkpoint(folders["modernbert"]), MODERNBERT, f["input_ids"], f["attention_mask"])
    got = reference.evaluate(graph, f, params)["sentence_embedding"]
    np.testing.assert_allclose(got, cls_pool(hidden, True), rtol=1e-5, atol=1e-5)


def test_modernbert_converts_to_its_forward(folders: dict[str, Path], tmp_path: Path) -> None:
    """fp32 and fp16 packages through the executor against the NumPy forward, with a second
    RoPE table and the window's Bias mask in the program."""
    graph, params = from_pretrained(folders["modernbert"], seq_len=SEQ, batch_size=2, pooling=None)
    f = feeds(MODERNBERT)
    want = real_rows(modernbert_forward(Checkpoint(folders["modernbert"]), MODERNBERT, f["input_ids"],
                                        f["attention_mask"]), f["attention_mask"])
    for precision in ("fp32", "fp16"):
        path = rlx_mil.save(rlx_mil.convert(graph, params, target="iOS18", precision=precision),
                            tmp_path / f"modernbert-{precision}.mlpackage")
        got = real_rows(milexec.run(path, f)["last_hidden_state"], f["attention_mask"])
        assert relative_error(got, want) < RELATIVE[precision], precision


@pytest.mark.parametrize("family", ["xlm-roberta", "roberta"])
def test_roberta_hidden_states_match_independent_forward(family: str, folders: dict[str, Path]) -> None:
    """Positions from padding_idx + 1 over the non-pad tokens; pad tokens at padding_idx."""
    cfg = TINY_CONFIGS[family]
    graph, params = from_pretrained(folders[family], seq_len=SEQ, batch_size=2)
    f = feeds(cfg)
    got = reference.evaluate(graph, f, params)["last_hidden_state"]
    want = roberta_forward(Checkpoint(folders[family]), cfg, f["input_ids"], f["attention_mask"])
    assert relative_error(got, want) < 1e-5  # padding positions included: they are defined here
    # BERT's positions (0, 1, ...) give other numbers.
    shifted = {**cfg, "pad_token_id": -1}
    assert relative_error(got, roberta_forward(Checkpoint(folders[family]), shifted, f["input_ids"],
                                               f["attention_mask"])) > 1e-3


@pytest.mark.parametrize(("style", "mode"), [("e5", "pooling_mode_mean_tokens"), ("bge", "pooling_mode_cls_token")])
def test_e5_and_bge_folders_convert_to_their_embeddings(style: str, mode: str, folders: dict[str, Path],
                                                        tmp_path: Path) -> None:
    """E5 (mean pooling, Normalize) and BGE (CLS pooling, Normalize) on XLM-RoBERTa as
    sentence-transformers folders, `roberta.`-prefixed as a task model's export stores them:
    the fp32 package's sentence embedding against the forward's."""
    folder = tmp_path / style
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**XLMR, "architectures": ["XLMRobertaForMaskedLM"]}))
    stored: dict[str, np.ndarray] = {}
    for file in sorted(folders["xlm-roberta"].glob("*.safetensors")):
        stored |= {f"roberta.{k}": v for k, v in load_file(str(file)).items()}
    stored["lm_head.bias"] = np.zeros(XLMR["vocab_size"], np.float32)
    save_file(stored, str(folder / SINGLE_FILE))
    sentence_transformers_folder(folder, mode, normalize=True)
    graph, params = from_pretrained(folder, seq_len=SEQ, batch_size=2)
    f = feeds(XLMR)
    hidden = roberta_forward(Checkpoint(folders["xlm-roberta"]), XLMR, f["input_ids"], f["attention_mask"])
    want = mean_pool(hidden, f["attention_mask"], True) if style == "e5" else cls_pool(hidden, True)
    path = rlx_mil.save(rlx_mil.convert(graph, params, target="iOS18", precision="fp32"), tmp_path / f"{style}.mlpackage")
    got = milexec.run(path, f)["sentence_embedding"]
    assert relative_error(got, want) < RELATIVE["fp32"]
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("family", ["xlm-roberta", "roberta"])
def test_roberta_packages(family: str, precision: str, folders: dict[str, Path], tmp_path: Path) -> None:
    cfg = TINY_CONFIGS[family]
    graph, params = from_pretrained(folders[family], seq_len=SEQ, batch_size=2)
    f = feeds(cfg)
    want = roberta_forward(Checkpoint(folders[family]), cfg, f["input_ids"], f["attention_mask"])
    path = rlx_mil.save(rlx_mil.convert(graph, params, target="iOS18", precision=precision),
                        tmp_path / f"{family}-{precision}.mlpackage")
    assert relative_error(milexec.run(path, f)["last_hidden_state"], want) < RELATIVE[precision]


@pytest.mark.parametrize("family", ["modernbert", "xlm-roberta"])
def test_demo_family(family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`rlx-mil demo --family` writes, converts and verifies a tiny checkpoint of the family."""
    from rlx_mil.cli import main

    out = tmp_path / f"{family}.mlpackage"
    assert main(["demo", "--family", family, "-o", str(out), "--layers", "2", "--hidden", "32", "--heads", "4",
                 "--kv-heads", "2", "--seq", "8", "--precision", "fp32", "-q"]) == 0
    checks = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("check ")]
    assert checks and all(ln.endswith(" ok") for ln in checks)


def test_encoder_refusals(folders: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match="no token type embeddings"):
        from_pretrained(folders["modernbert"], seq_len=SEQ, token_type_ids=True)
    # 66 positions hold 64 tokens after padding_idx + 1 = 2.
    with pytest.raises(InvalidOptionError, match="padding_idx"):
        from_pretrained(folders["xlm-roberta"], seq_len=65)
    from_pretrained(folders["xlm-roberta"], seq_len=64)
    bad = copy_folder(folders["modernbert"], tmp_path / "bad")
    for key, value, field in [("classifier_pooling", "max", "classifier_pooling"), ("hidden_activation", "relu", "hidden_activation"),
                              ("layer_types", ["full_attention", "chunked", "full_attention"], "layer_types"),
                              ("rope_parameters", {"global": {"rope_type": "default"}}, "rope_parameters"),
                              ("sliding_window", 2, "sliding_window")]:
        (bad / "config.json").write_text(json.dumps({**MODERNBERT, key: value}))
        with pytest.raises(UnsupportedConfigError) as err:
            from_pretrained(bad, seq_len=SEQ)
        assert err.value.field == field
    (bad / "config.json").write_text(json.dumps({**MODERNBERT, "num_hidden_layers": 2,
                                                 "layer_types": ["full_attention", "sliding_attention"]}))
    with pytest.raises(CheckpointError, match=r"layers\.2"):
        from_pretrained(bad, seq_len=SEQ)


def test_encoder_sizes_are_checked_before_building() -> None:
    """Attention scores Core ML cannot address, and RoPE tables beyond the build budget, are
    refused naming what, before a table or mask exists."""
    from rlx_mil.models.families import model_spec
    from rlx_mil.models.pretrained import build

    long = model_spec({**MODERNBERT, "max_position_embeddings": 10**7})
    with pytest.raises(InvalidOptionError, match="attention scores"):
        build(long, seq_len=10**6)
    wide = model_spec({**MODERNBERT, "max_position_embeddings": 10**7, "hidden_size": 4096, "num_attention_heads": 4})
    with pytest.raises(InvalidOptionError, match="RoPE table pairs"):
        build(wide, seq_len=10**5)


def test_modernbert_window_covering_the_sequence_is_global(folders: dict[str, Path]) -> None:
    """A local window reaching every key is the key-padding mask alone (no Bias mask built)."""
    graph, _ = from_pretrained(folders["modernbert"], seq_len=3, batch_size=1, pooling=None)
    kinds = {str(n.op.mask_kind) for n in graph if type(n.op).__name__ == "Attention"}
    assert kinds == {"Custom"}
    graph, _ = from_pretrained(folders["modernbert"], seq_len=SEQ, batch_size=1, pooling=None)
    assert {str(n.op.mask_kind) for n in graph if type(n.op).__name__ == "Attention"} == {"Custom", "Bias"}


def test_tiny_configs_hold_every_config_class_field() -> None:
    """Every family's tiny config is written as transformers' `to_dict()` writes one: every
    field of its config class (the family's defaults table) present, RoPE as `rope_parameters`."""
    from rlx_mil.models.families import records

    #: GraniteMoeHybridConfig's `time_step_limit` default (0.0, inf) is not JSON; to_dict()
    #: writes Qwen3.5's `partial_rotary_factor` inside `rope_parameters`, and private fields
    #: (Dinov2Config's `_out_features`) under their public names.
    unwritable = {"granitemoehybrid": {"time_step_limit"}, "qwen3_5_text": {"partial_rotary_factor"}}
    for model_type, record in records().items():
        tiny = record.tiny
        lacking = {k for k in set(record.defaults) - set(tiny) - unwritable.get(model_type, set()) if k[0] != "_"}
        assert not lacking, f"{model_type}: tiny config lacks {sorted(lacking)}"
        # transformers 5 writes RoPE as rope_parameters only (the < 5 form is tested on its own).
        assert not {"rope_theta", "rope_scaling"} & set(tiny.get("text_config", tiny)), model_type
        for name, variant in record.variants.items():
            assert not set(record.defaults) - set(variant), name
