"""The calibration statistics fitted codes are fitted to, gathered in bounded memory.

A fit (`rlx_mil.compress.fitting`) needs of each matmul weight's input only its second moment
H = mean over positions of x x^T / |x|^2 (and, to refit a table to its codes, any rows R with
R^T R = N H). So the fit's calibration need not be one long run whose every value is held:
its inputs are fed to the calibration graph one at a time (`FitFeed`: a sequence and the
positions the fit uses of it), each run passes the matmul inputs to the statistics as they are
computed and lets them go (`rlx_mil.reference.evaluate_visiting`), and each distinct input
(q/k/v share one, gate/up one) keeps a `SecondMoment`: its unit-length rows while there are
no more of them than it is wide, then only their Gram matrix. A gather holds one layer's
activations of one feed at a time, and at most width^2 values per input however many tokens
the fit sees (a 512-token run holding every value took SmolLM2-135M's conversion from 2.1 to
3.6 GB).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_mil.ir.graph import Graph


@dataclass(frozen=True)
class FitFeed:
    """One run of the calibration graph the fit gathers from: its `inputs`, and where a split
    calibration holds its later positions apart (`rlx_mil.compress.sensitivity.held_apart`)
    the first position the fit does not use (None: every position)."""

    inputs: Mapping[str, Any]
    first: int | None = None

    @property
    def length(self) -> int:
        """The sequence length `first` counts in (the token ids' last axis; 1 without them)."""
        ids = self.inputs.get("input_ids")
        return 1 if ids is None else int(np.shape(ids)[-1])

    def rows(self, value: np.ndarray) -> np.ndarray | None:
        """The rows ([positions, width]) of an activation of this run that the fit uses: each
        sequence's positions before `first` (all without a split); None when the activation is
        not one row per position of a split run (its weights are then not fitted)."""
        if np.ndim(value) < 1:
            return None
        x = np.asarray(value).reshape(-1, np.shape(value)[-1])
        if self.first is None:
            return x
        if x.shape[0] % self.length:
            return None
        return x.reshape(-1, self.length, x.shape[1])[:, :self.first].reshape(-1, x.shape[1])


class SecondMoment:
    """The running second moment of one activation's rows (each scaled to unit length, as
    `rlx_mil.compress.fitting.input_hessian` weighs positions): the rows themselves while there
    are at most `width` of them (float32), then their Gram matrix (float32, width x width)."""

    def __init__(self, width: int) -> None:
        self.width = width
        #: Positions added (all-zero ones count, adding nothing, as in `input_hessian`).
        self.count = 0
        self._rows: list[np.ndarray] = []
        self._gram: np.ndarray | None = None
        #: `hessian()` and `factor()` as last computed (the weights sharing an input ask in a row).
        self._hessian: np.ndarray | None = None
        self._factor: np.ndarray | None = None

    def release(self) -> None:
        """Let go of the H and factor kept since they were last asked for."""
        self._hessian = self._factor = None

    def add(self, rows: np.ndarray) -> None:
        """Add activation rows ([positions, width])."""
        self.release()
        x = np.asarray(rows, np.float64).reshape(-1, self.width)
        norm = np.linalg.norm(x, axis=1, keepdims=True)
        x = x / np.where(norm > 0, norm, 1.0)
        self.count += x.shape[0]
        if self._gram is None and sum(r.shape[0] for r in self._rows) + x.shape[0] <= self.width:
            self._rows.append(x.astype(np.float32))
            return
        gram = x.T @ x
        for held in self._rows:
            h = held.astype(np.float64)
            gram += h.T @ h
        self._rows = []
        self._gram = (gram if self._gram is None else self._gram + gram).astype(np.float32)

    @property
    def held(self) -> int:
        """Numbers held (at most width^2, or the rows' count times the width while fewer)."""
        return sum(r.size for r in self._rows) if self._gram is None else int(self._gram.size)

    def hessian(self) -> np.ndarray:
        """H ([width, width], float64): the mean of x x^T over the unit-length rows added."""
        if self._hessian is None:
            if self._gram is not None:
                self._hessian = self._gram.astype(np.float64) / max(self.count, 1)
            else:
                x = np.concatenate(self._rows).astype(np.float64) if self._rows else np.zeros((0, self.width))
                self._hessian = x.T @ x / max(self.count, 1)
        return self._hessian

    def factor(self) -> tuple[np.ndarray, int]:
        """(R, N): rows R (float64, [<= width, width]) with R^T R = N H, and N the positions
        added: what a least-squares refit weighs its error with (the rows themselves while
        they are few, else the Gram matrix's square root from its eigenvectors)."""
        if self._factor is None:
            if self._gram is None:
                self._factor = np.concatenate(self._rows).astype(np.float64) if self._rows else np.zeros((0, self.width))
            else:
                values, vectors = np.linalg.eigh(self._gram.astype(np.float64))
                keep = values > values[-1] * 1e-12
                self._factor = (vectors[:, keep] * np.sqrt(values[keep])).T
        return self._factor, self.count


def second_moments(
    graph: Graph, params: Mapping[str, Any], feeds: Sequence[FitFeed], names: Container[str] | None = None,
) -> dict[str, SecondMoment]:
    """Param name -> the `SecondMoment` of the input its matmuls multiply, over every feed (each
    run alone, `FitFeed`; only `names` when given). Weights that share an input share the
    object; a weight used by several matmuls gets all their rows (of the first one's width).
    Where a feed is split, a weight whose input is not one row per position gets none (it is
    then encoded plainly rather than fitted to positions the plan measures on)."""
    from rlx_mil.compress.calibration import matmul_inputs
    from rlx_mil.reference import evaluate_visiting

    sources: dict[str, tuple[int, ...]] = {}
    for name, source in matmul_inputs(graph):
        if names is None or name in names:
            sources[name] = (*sources.get(name, ()), source)
    keys = {name: tuple(dict.fromkeys(found)) for name, found in sources.items()}
    moments: dict[tuple[int, ...], SecondMoment | None] = {}
    readers: dict[int, list[tuple[int, ...]]] = {}
    for key in dict.fromkeys(keys.values()):
        for source in key:
            readers.setdefault(source, []).append(key)

    def visitor(feed: FitFeed) -> Callable[[int, np.ndarray], None]:
        def visit(source: int, value: np.ndarray) -> None:
            x = feed.rows(value)
            if x is None:  # not per position: no fit for its weights
                if np.ndim(value) >= 1:
                    moments.update((key, None) for key in readers[source])
                return
            for key in readers[source]:
                if key not in moments:
                    moments[key] = SecondMoment(x.shape[1])
                moment = moments[key]
                if moment is not None and moment.width == x.shape[1]:
                    moment.add(x)
        return visit

    for feed in feeds:
        evaluate_visiting(graph, feed.inputs, params, readers, visitor(feed))
    out = {}
    for name, key in keys.items():
        moment = moments.get(key)
        if moment is not None and moment.count > 0:
            out[name] = moment
    return out


def fit_tokens(feeds: Sequence[FitFeed]) -> int:
    """Token positions the fit uses over `feeds` (per sequence row: `first`, else its length)."""
    total = 0
    for feed in feeds:
        ids = feed.inputs.get("input_ids")
        rows = 1 if ids is None else int(np.prod(np.shape(ids)[:-1], dtype=np.int64))
        total += rows * (feed.length if feed.first is None else feed.first)
    return total
