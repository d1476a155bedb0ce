"""What autoN measures a weight's effect on the outputs with: the units, which weights are
measured when not all can be, the KL a top-1 target asks for, and params with one weight
replaced (what each measurement runs the reference on)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from rlx_mil.compress.auto import weight_kind

#: The units of autoN's measured sensitivities (`WeightCompressor._output_sensitivity`).
KL_UNIT = "mean KL"
SQUARED_UNIT = "squared output error"
#: Fewer measured weights than this say too little: autoN then uses role factors.
MIN_SAMPLE = 8


def kl_for_top1(min_top1: float) -> float:
    """The mean KL a teacher-forced top-1 agreement of `min_top1` asks for, as autoN searches
    in KL: ``(2 (1 - top1))^2``, from the measured pairs on SmolLM2-135M (int8: KL 0.0048, top-1
    0.968; the GPU mix 0.0012, 0.975; Neural Engine mixes 0.178, 0.756 and 0.525, 0.64; lut6
    0.265, 0.706: ``1 - top1 ~= 0.5 sqrt(KL)`` within about 20 %). The check after converting
    judges the top-1 itself."""
    return (2.0 * (1.0 - min_top1)) ** 2


def measure_sample(names: list[str], roles: Mapping[str, str], count: int) -> list[str] | None:
    """The weights autoN measures when it cannot afford all of `names`: every embedding / LM
    head, then ordinary weights taken kind by kind (`weight_kind`: the same weight of each
    layer), one of each kind per round at layers spread over the depth (each kind and round
    at another depth), `count` in all; None below `MIN_SAMPLE`."""
    if count < MIN_SAMPLE:
        return None
    special = [n for n in names if roles.get(n, "weight") != "weight"][:count]
    kinds: dict[str, list[str]] = {}
    for n in names:
        if n not in special:
            kinds.setdefault(weight_kind(n), []).append(n)
    groups = list(kinds.values())
    chosen = list(special)
    seen = set(chosen)
    for r in range(max(map(len, groups), default=0)):
        for j, group in enumerate(groups):
            if len(chosen) >= count:
                return chosen
            depth = ((j + 0.5) / len(groups) + r * 0.618034) % 1.0
            free = [n for n in group if n not in seen]
            if free:
                # The free weight nearest the wanted depth (layers already taken are skipped).
                pick = min(free, key=lambda n: abs(group.index(n) - depth * (len(group) - 1)))
                chosen.append(pick)
                seen.add(pick)
    return chosen



class Replaced(Mapping[str, Any]):
    """`params` with one weight's value replaced (`many`: several)."""

    def __init__(self, params: Mapping[str, Any], name: str, value: np.ndarray) -> None:
        self._params, self._values = params, {name: value}

    @classmethod
    def many(cls, params: Mapping[str, Any], values: Mapping[str, np.ndarray]) -> Replaced:
        out = cls.__new__(cls)
        out._params, out._values = params, dict(values)
        return out

    def __getitem__(self, name: str) -> Any:
        return self._values[name] if name in self._values else self._params[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)


class Overlaid(Mapping[str, Any]):
    """`params`, except where `graph` declares a Param of another shape and `own` (the graph's
    own params) has it: a calibration graph's RoPE tables, sized for its length."""

    def __init__(self, params: Mapping[str, Any], graph: Any, own: Mapping[str, Any] | None) -> None:
        from rlx_mil.ir.ops import Param

        self._params = params
        self._own: dict[str, Any] = {}
        if own is not None:
            for node in graph:
                if isinstance(node.op, Param) and node.op.name in own and node.shape.is_static:
                    shape = getattr(params, "shape_of", None)
                    held = tuple(shape(node.op.name)) if shape is not None else np.shape(params[node.op.name])
                    if tuple(held) != tuple(node.shape.sizes()):
                        self._own[node.op.name] = own[node.op.name]

    def __getitem__(self, name: str) -> Any:
        return self._own[name] if name in self._own else self._params[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)
