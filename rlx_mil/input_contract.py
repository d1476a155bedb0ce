"""Value ranges of a model's integer inputs, declared in its metadata.

Core ML's `gather` wraps a negative index around (`-1` reads the last row) and a
`cache_position` beyond the cache silently writes nowhere, where the RLX reference refuses
both. So every package rlx_mil writes declares, per function, the inclusive range of each
integer input whose values index something:

* an input used as the indices of a `Gather` (token ids, position ids): `[0, rows - 1]` of the
  smallest table it indexes;
* a stateful model's `cache_position`: `[0, max_context - n]` for a function taking n new
  tokens (the rows written must fit the cache).

The metadata value (`INPUT_RANGES_METADATA_KEY`) is JSON `{function: {input: [min, max]}}`
keyed by interface (MIL) names, the names a Swift caller feeds; the NumPy MIL executor
refuses values outside them, and Swift callers can check them the same way (docs/llm.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx_mil.errors import MilExecError
from rlx_mil.fileio import nesting_depth
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import Gather, Input
from rlx_mil.ir.shape import Static

#: user_defined_metadata key: JSON {function name: {interface input name: [min, max]}}.
INPUT_RANGES_METADATA_KEY = "rlx_mil.input_ranges"

Ranges = dict[str, tuple[int, int]]


def graph_input_ranges(graph: Graph) -> Ranges:
    """IR input name -> inclusive range, for inputs read as Gather indices of a static dim."""
    inputs = {node.id: node.op.name for node in graph if isinstance(node.op, Input)}
    ranges: Ranges = {}
    for node in graph:
        if not isinstance(node.op, Gather) or len(node.inputs) != 2 or node.inputs[1] not in inputs:
            continue
        dims = graph.node(node.inputs[0]).shape.dims
        dim = dims[node.op.axis % len(dims)] if dims else None
        if not isinstance(dim, Static) or dim.size < 1:
            continue
        name = inputs[node.inputs[1]]
        hi = dim.size - 1
        ranges[name] = (0, min(hi, ranges.get(name, (0, hi))[1]))
    return ranges


def encode_ranges(ranges: Mapping[str, Mapping[str, tuple[int, int]]]) -> str:
    """The metadata value for `{function: {interface input: (min, max)}}`."""
    return json.dumps({f: {k: [int(lo), int(hi)] for k, (lo, hi) in r.items()} for f, r in ranges.items()}, sort_keys=True)


def read_ranges(metadata: Mapping[str, Any], function_name: str) -> Ranges:
    """The declared ranges of `function_name` (empty when the model declares none)."""
    text = metadata.get(INPUT_RANGES_METADATA_KEY)
    if text is None:
        return {}
    where = f"model metadata '{INPUT_RANGES_METADATA_KEY}'"
    if not isinstance(text, str) or nesting_depth(text.encode("utf-8", "surrogatepass")) > 3:
        raise MilExecError(f"{where} must be JSON {{function: {{input: [min, max]}}}}")
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise MilExecError(f"{where} is not valid JSON: {err}") from None
    table = raw.get(function_name, {}) if isinstance(raw, dict) else None
    if not isinstance(table, dict):
        raise MilExecError(f"{where} must be JSON {{function: {{input: [min, max]}}}}")
    out: Ranges = {}
    for name, bounds in table.items():
        ok = isinstance(bounds, list) and len(bounds) == 2 and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
        if not ok or bounds[0] > bounds[1]:
            raise MilExecError(f"{where}: input {name!r} has range {bounds!r}, expected [min, max] integers")
        out[name] = (bounds[0], bounds[1])
    return out


def range_problem(array: np.ndarray, bounds: tuple[int, int]) -> str | None:
    """Why the values of an integer feed break its declared range (None when they do not)."""
    lo, hi = bounds
    if not array.size:
        return None
    # A float feed of an index input is truncated to int32 by the program (the IR's Cast), as
    # the reference does: 0.5 indexes row 0.
    values = np.trunc(array) if array.dtype.kind == "f" else array
    bad = (values < lo) | (values > hi)
    if not bad.any():
        return None
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    count = int(bad.sum())
    return (f"{count} value{'s' if count > 1 else ''} outside the declared range [{lo}, {hi}], e.g."
            f" {array[where].item()} at {list(where)}")
