"""BERT / MiniLM encoders from Hugging Face-layout checkpoints, as sentence-transformers use
them: against an independent NumPy forward, and converted through the executor."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from models.hf_numpy import bert_forward, mean_pool
from rlx_mil import reference
from rlx_mil.errors import UnsupportedConfigError
from rlx_mil.lowering.target import Precision
from rlx_mil.models import from_pretrained
from rlx_mil.models.checkpoint import SINGLE_FILE, Checkpoint
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint
from rlx_mil.testing import Tolerance, check_conversion

CFG = TINY_CONFIGS["bert"]
SEQ = 7


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("bert") / "minilm", CFG, seed=4)


def sentence_transformers_folder(folder: Path, pooling: str = "pooling_mode_mean_tokens", normalize: bool = True) -> None:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    modes = {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False}
    modes[pooling] = True
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": CFG["hidden_size"], **modes}))


def feeds(batch: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    mask = np.ones((batch, SEQ), np.int32)
    mask[1, 4:] = 0  # the second sentence is padded
    return {"input_ids": rng.integers(0, CFG["vocab_size"], (batch, SEQ)).astype(np.int32), "attention_mask": mask}


def test_hidden_states_match_independent_forward(bert: Path) -> None:
    graph, params = from_pretrained(bert, seq_len=SEQ, batch_size=2)
    f = feeds()
    got = reference.evaluate(graph, f, params)["last_hidden_state"]
    want = bert_forward(Checkpoint(bert), CFG, f["input_ids"], f["attention_mask"])
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_token_type_ids_input(bert: Path) -> None:
    graph, params = from_pretrained(bert, seq_len=SEQ, batch_size=2, token_type_ids=True)
    f = feeds()
    f["token_type_ids"] = np.array([[0, 0, 0, 1, 1, 1, 1], [0, 1, 0, 1, 0, 1, 0]], np.int32)
    got = reference.evaluate(graph, f, params)["last_hidden_state"]
    want = bert_forward(Checkpoint(bert), CFG, f["input_ids"], f["attention_mask"], f["token_type_ids"])
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("normalize", [False, True])
def test_sentence_transformers_mean_pooling(normalize: bool, bert: Path, tmp_path: Path) -> None:
    folder = tmp_path / "st"
    folder.mkdir()
    for item in bert.iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    sentence_transformers_folder(folder, normalize=normalize)
    graph, params = from_pretrained(folder, seq_len=SEQ, batch_size=2)
    f = feeds()
    got = reference.evaluate(graph, f, params)["sentence_embedding"]
    hidden = bert_forward(Checkpoint(folder), CFG, f["input_ids"], f["attention_mask"])
    want = mean_pool(hidden, f["attention_mask"], normalize)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, rtol=1e-5)


def test_cls_pooling_and_unsupported_modes(bert: Path, tmp_path: Path) -> None:
    folder = tmp_path / "cls"
    folder.mkdir()
    for item in bert.iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    sentence_transformers_folder(folder, "pooling_mode_cls_token", normalize=False)
    graph, params = from_pretrained(folder, seq_len=SEQ, batch_size=2)
    f = feeds()
    hidden = bert_forward(Checkpoint(folder), CFG, f["input_ids"], f["attention_mask"])
    np.testing.assert_allclose(reference.evaluate(graph, f, params)["sentence_embedding"], hidden[:, 0], rtol=2e-4, atol=2e-4)
    sentence_transformers_folder(folder, "pooling_mode_max_tokens")
    with pytest.raises(UnsupportedConfigError, match="pooling_mode_max_tokens"):
        from_pretrained(folder, seq_len=SEQ)


def test_bert_prefixed_names_and_pretraining_heads(bert: Path, tmp_path: Path) -> None:
    """bert-base style exports store `bert.` names plus pooler/cls heads; both load."""
    folder = tmp_path / "bert-base"
    folder.mkdir()
    (folder / "config.json").write_bytes((bert / "config.json").read_bytes())
    tensors = {f"bert.{k}": v for k, v in load_file(str(bert / SINGLE_FILE)).items()}
    tensors["bert.pooler.dense.weight"] = np.zeros((CFG["hidden_size"], CFG["hidden_size"]), np.float32)
    tensors["cls.predictions.bias"] = np.zeros(CFG["vocab_size"], np.float32)
    save_file(tensors, str(folder / SINGLE_FILE))
    graph, params = from_pretrained(folder, seq_len=SEQ, batch_size=2)
    plain, plain_params = from_pretrained(bert, seq_len=SEQ, batch_size=2)
    f = feeds()
    np.testing.assert_array_equal(reference.evaluate(graph, f, params)["last_hidden_state"],
                                  reference.evaluate(plain, f, plain_params)["last_hidden_state"])


def test_encoder_converts(bert: Path, tmp_path: Path) -> None:
    folder = tmp_path / "st"
    folder.mkdir()
    for item in bert.iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    sentence_transformers_folder(folder)
    graph, params = from_pretrained(folder, seq_len=SEQ, batch_size=2)
    check_conversion(graph, params, feeds(), targets=["iOS18"], roundtrip=False,
                     tolerances={Precision.FP16: Tolerance(atol=2e-2, rtol=2e-2)})
    graph, params = from_pretrained(bert, seq_len=SEQ, batch_size=2)
    check_conversion(graph, params, feeds(), targets=["iOS18"], roundtrip=False,
                     tolerances={Precision.FP16: Tolerance(atol=5e-2, rtol=5e-2)})


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_bf16_sharded_packages_match_the_independent_forward(precision: str, tmp_path: Path) -> None:
    """A BF16 checkpoint in two shards: the package's hidden states through the executor
    within 1e-4 (fp32) or 2e-2 (fp16) of the NumPy forward's largest magnitude."""
    import rlx_mil
    from rlx_mil import milexec

    folder = write_random_checkpoint(tmp_path / "minilm", CFG, seed=5, dtype="bfloat16", shards=2)
    assert len(list(folder.glob("model-*.safetensors"))) == 2
    graph, params = from_pretrained(folder, seq_len=SEQ, batch_size=2, pooling=None)
    f = feeds()
    want = bert_forward(Checkpoint(folder), CFG, f["input_ids"], f["attention_mask"])
    path = rlx_mil.save(rlx_mil.convert(graph, params, target="iOS18", precision=precision),
                        tmp_path / f"minilm-{precision}.mlpackage")
    got = milexec.run(path, f)["last_hidden_state"]
    assert np.abs(got - want).max() <= {"fp32": 1e-4, "fp16": 2e-2}[precision] * np.abs(want).max()
