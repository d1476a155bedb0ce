"""Codes fitted in GPTQ's order (`fit=MODE,sequential`): each matmul weight fitted to the
inputs the calibration graph gives with every weight before it already encoded, where
`fit=MODE,float` fits every weight to the float model's activations (as autoN's measurements
always do: each measures one weight or layer alone, the rest float).

The lowering asks for weights one at a time, in the order of the graph it lowers (a stateful
decode step, one function of several), which need not be the calibration graph's. So the
conversion's final codes come from one pass over the calibration graph in its own order
(`SequentialCodes`): the weights that read the same activation form a group (q/k/v; gate/up),
the groups are taken in graph order, and for each the run (`rlx_mil.reference.stepwise`; one
per fit sequence, `sensitivity.fit_feeds`) computes that activation with every weight it reads
decoded from its codes (`EncodedParams`: decoded at each read, never held), then the group's
weights are fitted to the `SecondMoment` of its rows (the positions before the held-apart
split) and encoded. A weight asked for before its turn is encoded ahead with the groups before
it; its codes wait for the lowering. Weights that are compressed but not fitted (an embedding,
weights autoN found better plain) are encoded plainly when a run first reads them, so the
later weights see them as the package holds them. Whatever order the lowering asks in, the
codes are the same. A weight several matmuls multiply is fitted to its first one's input.

Cost: one run of the calibration graph per fit sequence up to its last matmul's input (the
float fit's runs go to the logits), holding only the values still to be used; the fits as
before. Measured on SmolLM2-135M: docs/compression.md ("Codes fitted to the calibration").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlx_mil.compress.calibration import matmul_inputs
from rlx_mil.compress.linear import LinearCodes
from rlx_mil.compress.moments import FitFeed, SecondMoment
from rlx_mil.compress.palette import PaletteCodes
from rlx_mil.errors import CompressionError
from rlx_mil.ir.graph import Graph
from rlx_mil.reference.overlay import OverlaidParams

Codes = LinearCodes | PaletteCodes | Any  # or a `lowrank.CorrectedCodes` of them
#: `(name, second moment of its input or None) -> codes` of the weight in its planned storage layout.
Encoder = Callable[[str, "SecondMoment | None"], Codes]


class EncodedParams(OverlaidParams):
    """`params` with each compressed weight read as its codes decode (`SequentialCodes.codes_of`
    encodes it first if it is not yet), in the param's shape, float32."""

    def __init__(self, params: Mapping[str, Any], owner: SequentialCodes) -> None:
        super().__init__(params)
        self._owner = owner

    def _overlaid(self, name: str) -> bool:
        return name in self._owner.compressed

    def __getitem__(self, name: str) -> Any:
        if not self._overlaid(name):
            return self._params[name]
        back = np.asarray(self._owner.codes_of(name).dequantize(), np.float32)
        shape = self.shape_of(name)
        if self._owner.transposed(name):
            back = back.reshape(back.shape[0], -1).T
        return back.reshape(shape)


class SequentialCodes:
    """Every compressed weight's codes, fitted in the calibration graph's order (module doc).

    `compressed`: the weights the package holds as codes (each is read decoded); `fitted`: those
    of them fitted to their activations (the rest are encoded with no statistics, plainly);
    `encode(name, moment)`: a weight's codes in its planned storage layout fitted to that
    `SecondMoment` of its input (`transposed(name)`: that layout is the param's transpose);
    `feeds`: the runs of the calibration graph the fit sees (`FitFeed`: each sequence and the
    positions of it the fit uses), advanced together group by group."""

    def __init__(self, graph: Graph, params: Mapping[str, Any], feeds: Sequence[FitFeed], compressed: frozenset[str],
                 fitted: frozenset[str], encode: Encoder, transposed: Callable[[str], bool]) -> None:
        self.compressed = compressed
        self.transposed = transposed
        self._encode = encode
        self._feeds = list(feeds)
        self._codes: dict[str, Codes] = {}
        groups: dict[int, list[str]] = {}
        for name, source in matmul_inputs(graph):
            if name in fitted and not any(name in g for g in groups.values()):  # a weight's first use
                groups.setdefault(source, []).append(name)
        self._group_of = {n: source for source, names in groups.items() for n in names}
        self._groups = [(source, groups[source]) for source in sorted(groups, key=_order(graph).__getitem__)]
        self._next = 0
        self._busy = False
        self._graph, self._params = graph, params
        self._runs: list[Any] | None = None

    def final_codes(self, name: str, transposed: bool) -> Codes | None:
        """`name`'s codes for the lowering, which holds it `transposed` (or not) against the
        param: None when that is not the planned layout (the caller encodes it as it holds it)."""
        if name not in self.compressed or transposed != self.transposed(name):
            return None
        return self.codes_of(name)

    def codes_of(self, name: str) -> Codes:
        """`name`'s codes, encoding the groups up to its own first if they are not yet."""
        if name in self._codes:
            return self._codes[name]
        if name not in self._group_of or self._busy:  # not fitted here (or read by the run inside a group: plainly)
            self._codes[name] = self._encode(name, None)
            return self._codes[name]
        while name not in self._codes:
            self._advance()
        return self._codes[name]

    def _advance(self) -> None:
        from rlx_mil.reference.stepwise import StepwiseRun

        if self._runs is None:
            params = EncodedParams(self._params, self)
            self._runs = [StepwiseRun(self._graph, feed.inputs, params, [source for source, _ in self._groups])
                          for feed in self._feeds]
        source, names = self._groups[self._next]
        self._next += 1
        moment: SecondMoment | None = None
        per_position = True
        self._busy = True
        try:
            for feed, run in zip(self._feeds, self._runs, strict=True):
                act = run.value(source)
                x = feed.rows(act)
                if x is None:  # not one row per position of a split run: its weights are not fitted
                    per_position = per_position and np.ndim(act) < 1
                    continue
                moment = SecondMoment(x.shape[1]) if moment is None else moment
                if moment.width == x.shape[1]:
                    moment.add(x)
                del act, x
        finally:
            self._busy = False
        for name in names:
            if name not in self._codes:
                self._codes[name] = self._encode(name, moment if per_position else None)
        if self._next == len(self._groups):
            self._runs = None  # every group fitted: the runs' values go


def _order(graph: Graph) -> dict[int, int]:
    return {node.id: k for k, node in enumerate(graph)}


def sequential_codes(compressor: Any, fit: Any) -> SequentialCodes:
    """The `SequentialCodes` of a `WeightCompressor`'s final codes, its plan made: the
    calibration graph and the fit's feeds (`sensitivity.fit_feeds`: the held-apart split, the
    fit's own sequences), each compressed weight encoded as `WeightCompressor.compress` would
    (its scheme fitted to its planned storage shape) with `fit` (a `CalibrationFit`: its
    `skip` weights plainly). One per conversion: the functions of a multifunction conversion
    share it."""
    from rlx_mil.compress.emit import check_target
    from rlx_mil.compress.fit import fit_to_shape
    from rlx_mil.compress.layout import _predicted_layout, _user_map
    from rlx_mil.compress.lowrank import correct
    from rlx_mil.compress.schemes import LinearScheme, PaletteScheme
    from rlx_mil.compress.sensitivity import fit_feeds

    shared = compressor.shared
    if shared is not None and compressor._shared_key in shared.sequential:  # another function's: one pass
        found: SequentialCodes = shared.sequential[compressor._shared_key]
        return found
    schemes = compressor.schemes
    compressed = frozenset(n for n, s in schemes.items() if isinstance(s, (LinearScheme, PaletteScheme)))
    users = _user_map(compressor.graph)
    kn = {n: _predicted_layout(compressor.graph, n, users) == "kn" for n in compressed}
    params, target = compressor.params, compressor.target

    def encode(name: str, moment: SecondMoment | None) -> Codes:
        arr = np.asarray(params[name])
        storage = arr.reshape(arr.shape[-2:]).T if kn[name] else arr
        scheme, _ = fit_to_shape(schemes[name], tuple(int(d) for d in storage.shape), target)
        check_target(scheme, target, name)
        if not scheme.rank:
            codes: Codes = fit.encode_moment(storage, scheme, name, moment, compressor.store.writer)
            return codes
        if not kn[name]:
            raise CompressionError(f"weight {name!r}: {scheme.label}: a low-rank correction runs beside a matmul;"
                                   " this use of the weight is not one")
        base = fit.encode_moment(storage, dataclasses.replace(scheme, rank=0), name, moment, compressor.store.writer)
        fitted = moment is not None and fit.options is not None and name not in fit.skip
        h = moment.hessian() if fitted and moment is not None and moment.width == storage.shape[1] else None
        return correct(base, storage, scheme, fit.store, name, None if h is None else np.diag(h))

    made = SequentialCodes(compressor._calibration_graph(), compressor._calibration_params(), fit_feeds(compressor),
                           compressed, compressed - fit.skip, encode, kn.__getitem__)
    if shared is not None:
        shared.sequential[compressor._shared_key] = made
    return made
