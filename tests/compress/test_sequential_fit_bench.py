"""The fitting benchmark's sequential mode (benchmarks/gptq_lut_bench.py, `--sequential`): each
layer's weights are fitted to the inputs the already-encoded weights before them produce, on a
tiny random Llama (no checkpoint)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gptq_lut_bench import LINEARS, Llama, sequential_encode


def _tiny_llama(seed: int = 0, layers: int = 2, hidden: int = 16, heads: int = 4, kv: int = 2, inter: int = 24) -> Llama:
    rng = np.random.default_rng(seed)
    model = object.__new__(Llama)
    model.layers, model.heads, model.kv, model.hd = layers, heads, kv, hidden // heads
    model.eps, model.theta = 1e-5, 10000.0
    hd = hidden // heads
    shapes = {"q_proj": (heads * hd, hidden), "k_proj": (kv * hd, hidden), "v_proj": (kv * hd, hidden),
              "o_proj": (hidden, heads * hd), "gate_proj": (inter, hidden), "up_proj": (inter, hidden),
              "down_proj": (hidden, inter)}
    w = {"model.embed_tokens.weight": rng.standard_normal((50, hidden)).astype(np.float32),
         "model.norm.weight": np.ones(hidden, np.float32)}
    for i in range(layers):
        w[f"model.layers.{i}.input_layernorm.weight"] = np.ones(hidden, np.float32)
        w[f"model.layers.{i}.post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
        for p in LINEARS:
            w[model.full_name(i, p)] = (rng.standard_normal(shapes[p]) / np.sqrt(shapes[p][1])).astype(np.float32)
    model.w = w
    return model


def test_each_weight_is_fitted_to_the_inputs_of_the_encoded_weights_before_it() -> None:
    model = _tiny_llama()
    ids = np.arange(3, 15)
    given: dict[str, np.ndarray] = {}

    def encode(name: str, x: np.ndarray) -> np.ndarray:  # a crude "compression": every weight x 0.5
        given[name] = x
        return model.w[name] * np.float32(0.5)

    new = sequential_encode(model, ids, encode)
    assert list(given) == model.linear_names()  # in the order the model reaches them
    halved = {k: (v * np.float32(0.5) if k in given else v) for k, v in model.w.items()}
    assert all(np.array_equal(new[k], halved[k]) for k in model.w)
    # Independently: what each projection sees with exactly the weights before it encoded.
    x = model.w["model.embed_tokens.weight"][ids]
    for i in range(model.layers):
        for proj in LINEARS:
            name = model.full_name(i, proj)
            before = {k: halved[k] if k in model.linear_names()[:model.linear_names().index(name)] else v
                      for k, v in model.w.items()}
            record: dict[str, Any] = {}
            model.layer(i, x, before, record)
            np.testing.assert_array_equal(given[name], np.concatenate(record[name]))
        x = model.layer(i, x, halved)
    # and not the float model's: from layer 0's o_proj on, the inputs differ.
    float_record: dict[str, Any] = {}
    model.forward(ids, record=float_record)
    first = model.full_name(0, "q_proj")
    np.testing.assert_array_equal(given[first], np.concatenate(float_record[first]))
    for name in (model.full_name(0, "o_proj"), model.full_name(1, "q_proj"), model.full_name(1, "down_proj")):
        assert np.abs(given[name] - np.concatenate(float_record[name])).max() > 1e-3, name
