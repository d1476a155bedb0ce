"""Driving a stateful model step by step through the MIL executor, and the stateless
reference it must match."""

from __future__ import annotations

import atexit
import shutil
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.lowering.state.kv_cache import NeuralEngineWarning

from .decode_graphs import TinyLM, decode_graph

_PACKAGES: list[str] = []


def _remove_packages() -> None:
    while _PACKAGES:
        shutil.rmtree(_PACKAGES.pop(), ignore_errors=True)


atexit.register(_remove_packages)


def convert_stateful(graph: Any, params: Mapping[str, np.ndarray], **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuralEngineWarning)
        model = rlx_mil.convert(graph, params, kv_cache=kwargs.pop("kv_cache", "auto"), **kwargs)
    if getattr(model, "package_path", None):
        _PACKAGES.append(str(model.package_path))
    return model


def step_feeds(
    c: TinyLM, tokens: list[int], position: int, max_context: int | None, hidden: frozenset[int] = frozenset()
) -> dict[str, np.ndarray]:
    """Inputs of one call writing `tokens` at `position`; `max_context` None = stateless graph.
    `hidden`: positions the Custom key-padding mask hides."""
    n = len(tokens)
    feeds = {
        "input_ids": np.array([tokens], np.int32),
        "position_ids": np.arange(position, position + n, dtype=np.int32)[None, :],
    }
    if c.mask == "custom":
        width = position + n if max_context is None else max_context
        flags = np.ones((1, width), np.float32)
        flags[0, [h for h in hidden if h < width]] = 0.0
        feeds["attention_mask"] = flags
    if max_context is not None:
        feeds["cache_position"] = np.array([position], np.int32)
    return feeds


class StatelessReference:
    """The decode graph evaluated by the reference with its caches passed in and out."""

    def __init__(self, c: TinyLM, params: Mapping[str, np.ndarray], hidden: frozenset[int] = frozenset()) -> None:
        self.c, self.params, self.hidden = c, params, hidden
        self.caches: dict[str, np.ndarray] | None = None
        self.position = 0

    def __call__(self, tokens: list[int]) -> np.ndarray:
        c = self.c
        past = None if self.caches is None else self.position
        feeds = step_feeds(c, tokens, self.position, None, self.hidden)
        if self.caches is not None:
            feeds.update({name.replace("new_", "past_"): value for name, value in self.caches.items()})
        graph = decode_graph(c, len(tokens), past, cache_outputs=True)
        out = reference.evaluate(graph, feeds, self.params)
        self.caches = {k: v for k, v in out.items() if k != "logits"}
        self.position += len(tokens)
        return out["logits"]


def full_sequence_logits(c: TinyLM, params: Mapping[str, np.ndarray], tokens: list[int]) -> np.ndarray:
    """Last-position logits of the plain graph over the whole sequence so far."""
    graph = decode_graph(c, len(tokens), None)
    return reference.evaluate(graph, step_feeds(c, tokens, 0, None), params)["logits"]


def run_stateful(
    models: Mapping[int, Any], c: TinyLM, tokens: list[int], position: int, states: dict[str, np.ndarray],
    max_context: int, precision_model: str = "declared", hidden: frozenset[int] = frozenset(),
) -> np.ndarray:
    model = models[len(tokens)]
    out = milexec.run(
        model, step_feeds(c, tokens, position, max_context, hidden), states=states, precision_model=precision_model,  # type: ignore[arg-type]
    )
    return out["logits"]
