"""Quantized GGUF files: every llama.cpp type the converter reads stays compressed in the
package (its codes taken from the blocks), the executor's outputs equal the reference on the
same codes, and the reference on the file's exact decode equals an independent forward."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.gguf.gguf_files import write_gguf
from models.hf_numpy import FORWARDS
from rlx_mil import reference
from rlx_mil.compress import dequantized_params, report_of
from rlx_mil.lowering.target import Target
from rlx_mil.models import from_gguf
from rlx_mil.models.checkpoint import Checkpoint
from rlx_mil.models.gguf.codes import EXACT, FORMATS, split_form
from rlx_mil.models.gguf.reader import GGUFFile
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

# K-quants need rows of 256 elements: hidden and intermediate sizes of 256.
WIDE: dict[str, Any] = {"hidden_size": 256, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
                        "vocab_size": 64, "num_hidden_layers": 2}
TYPES = sorted(FORMATS)
SEQ = 6


def _config(family: str, **extra: Any) -> dict[str, Any]:
    cfg = {**copy.deepcopy(TINY_CONFIGS[family]), **WIDE, **extra}
    cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    if family in ("gemma2", "gemma3_text"):
        cfg["query_pre_attn_scalar"] = 64
    return cfg


def _cycling(types: list[str]) -> Any:
    """Each 2-D tensor gets the next type of `types`, in the order the writer asks."""
    order: dict[str, str] = {}

    def pick(name: str, shape: tuple[int, ...]) -> str:
        if name not in order:
            order[name] = types[len(order) % len(types)]
        return order[name]

    return pick


def _write(tmp: Path, cfg: dict[str, Any], types: Any, seed: int = 0) -> tuple[Path, dict[str, np.ndarray]]:
    ckpt = write_random_checkpoint(tmp / "hf", cfg, seed=seed)
    weights = Checkpoint(ckpt)
    held = write_gguf(tmp / "m.gguf", cfg, {k: weights[k] for k in weights}, types=types)
    return tmp / "m.gguf", held


def _converted(root: Path, types: Any) -> tuple[Path, dict[str, Any], Any, Any, dict[str, Any]]:
    """A 1-layer Llama GGUF in `root` whose tensors take `types`, its graph and params, and its
    packages (fp32, fp16), converted and saved once: precision -> (model, saved path)."""
    import rlx_mil
    from rlx_mil.models import from_gguf

    cfg = _config("llama", rope_parameters=None, num_hidden_layers=1)
    path, _ = _write(root, cfg, types)
    graph, params = from_gguf(path, seq_len=SEQ)
    models = {p: rlx_mil.convert(graph, params, precision=p) for p in ("fp32", "fp16")}
    saved = {p: (m, Path(rlx_mil.save(m, root / f"{p}.mlpackage"))) for p, m in models.items()}
    return path, cfg, graph, params, saved


def _ids(vocab: int) -> np.ndarray:
    return np.random.default_rng(5).integers(0, vocab, (1, SEQ)).astype(np.int32)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray], dict[str, Any]]:
    """A 2-layer Llama whose 16 matrices cycle through every type (embeddings and head too)."""
    cfg = _config("llama", rope_parameters=None)
    path, held = _write(tmp_path_factory.mktemp("mixed"), cfg, _cycling(TYPES))
    return path, held, cfg


def test_every_type_is_in_the_file(mixed: Any) -> None:
    path, _, _ = mixed
    kinds = {t.type_name for t in GGUFFile(path).tensors.values()}
    assert set(TYPES) <= kinds


def test_exact_decode_matches_independent_forward(mixed: Any) -> None:
    path, held, cfg = mixed
    graph, params = from_gguf(path, seq_len=SEQ)
    ids = _ids(cfg["vocab_size"])
    got = reference.evaluate(graph, {"input_ids": ids}, params)["logits"]
    want, _ = FORWARDS["llama"](held, cfg, ids)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_every_type_converts_compressed(mixed: Any, precision: str) -> None:
    import rlx_mil
    from rlx_mil import milexec

    path, _, cfg = mixed
    graph, params = from_gguf(path, seq_len=SEQ)
    model = rlx_mil.convert(graph, params, precision=precision)
    report = report_of(model)
    assert report is not None
    by_name = {w.name: w for w in report.weights}
    assert set(by_name) == set(params.prequantized_weights())  # type: ignore[attr-defined]
    file = GGUFFile(path)
    for name, w in by_name.items():
        kind = file.tensors[params.names[name]].type_name  # type: ignore[attr-defined]
        assert w.scheme == f"gguf-{kind}"
        assert w.max_error is not None
        if kind in EXACT or precision == "fp32":
            assert w.max_error <= 1e-6 * max(1.0, w.bytes_before)
        split = split_form(kind, Target.IOS18)  # 5-bit codes: scale and bias at run time
        if kind in EXACT and not (split and precision == "fp16"):
            assert w.max_error == 0.0
        if split:  # llama.cpp's decode bit for bit in fp32; in fp16 a few roundings (table, product, sum)
            assert w.max_error <= (0.0 if precision == "fp32" else 2**-9 * float(np.abs(params[name]).max())), (name, kind)
    ids = _ids(cfg["vocab_size"])
    want = reference.evaluate(graph, {"input_ids": ids}, dequantized_params(params, model))["logits"]
    exact = reference.evaluate(graph, {"input_ids": ids}, params)["logits"]
    got = milexec.run(model, {"input_ids": ids})["logits"]
    scale = np.abs(want).max()
    tol = 1e-4 if precision == "fp32" else 5e-2
    np.testing.assert_allclose(got, want, atol=tol * scale, rtol=tol)
    np.testing.assert_allclose(got, exact, atol=tol * scale, rtol=tol)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "gemma2", "gemma3_text", "phi3"])
def test_every_family_with_every_type(tmp_path: Path, family: str) -> None:
    """Three layers whose matrices cycle through every type, tied quantized embeddings: one
    constexpr feeds the gather and the LM head."""
    import rlx_mil
    from rlx_mil import milexec

    cfg = _config(family, tie_word_embeddings=True, num_hidden_layers=3)
    path, held = _write(tmp_path, cfg, _cycling(TYPES[::-1]), seed=2)
    assert set(TYPES) <= {t.type_name for t in GGUFFile(path).tensors.values()}
    graph, params = from_gguf(path, seq_len=SEQ)
    ids = _ids(cfg["vocab_size"])
    exact = reference.evaluate(graph, {"input_ids": ids}, params)["logits"]
    want, _ = FORWARDS[family](held, cfg, ids)
    np.testing.assert_allclose(exact, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())
    model = rlx_mil.convert(graph, params, precision="fp32")
    names = [w.name for w in report_of(model).weights]  # type: ignore[union-attr]
    assert names.count("model.embed_tokens.weight") == 1
    got = milexec.run(model, {"input_ids": ids})["logits"]
    np.testing.assert_allclose(got, exact, atol=1e-4 * np.abs(exact).max(), rtol=1e-4)
