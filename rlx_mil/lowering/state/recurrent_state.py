"""Carried recurrent states as Core ML states (iOS18), through the `kv_cache=` option.

An op that writes its final state back into an Input (GatedDeltaNet `carry_state`, the RNNs'
`carry`; see `Op.carried_operands`) is normally converted with that Input and an extra output
`<input>_out` (`rlx_mil.naming.state_outputs`) the caller feeds back. With `kv_cache="auto"`
(or `kv_cache={input_name: "<input>_out"}`) the stateful lowering that keeps KV caches in
states keeps these states there too: the Input and the `_out` output leave the interface, an
fp16 state named after the Input holds the value, the program reads it with `read_state` where
the Input was used and writes the published final state back with `coreml_update_state`.
A fresh Core ML state is zeros, which is the recurrence's own zero initial state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlx_mil.errors import GraphError
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import Input
from rlx_mil.lowering.target import Precision
from rlx_mil.naming import mil_identifier, state_outputs


@dataclass(frozen=True)
class RecurrentState:
    """A carried state Input kept as a Core ML state."""

    input_id: int
    input_name: str
    #: The `<input>_out` output it replaces.
    output_name: str
    shape: tuple[int, ...]
    #: (node id, operand) whose published final state is written back.
    writer: tuple[int, int]

    @property
    def state_name(self) -> str:
        return mil_identifier(self.input_name)


def carried_input_names(graph: Graph) -> set[str]:
    """Names of the Inputs that feed a carried state operand."""
    sources = (graph.node(s.source).op for s in state_outputs(graph))
    return {op.name for op in sources if isinstance(op, Input)}


def find_recurrent_states(graph: Graph, kv_cache: str | bool | Mapping[str, str]) -> list[RecurrentState]:
    """Every carried state fed by an Input (`kv_cache` "auto"/True), or those named in a
    `{input_name: output_name}` mapping whose output is a carried state's `<input>_out`."""
    found: list[RecurrentState] = []
    named = kv_cache if isinstance(kv_cache, Mapping) else None
    writers: dict[int, tuple[int, int]] = {}
    for carried in state_outputs(graph):
        source = graph.node(carried.source)
        if not isinstance(source.op, Input):
            continue
        if named is not None and named.get(source.op.name) != carried.name:
            continue
        if source.id in writers:
            raise GraphError(
                f"Input {source.op.name!r} is the carried state of two nodes (%{writers[source.id][0]} and"
                f" %{carried.node}); one Core ML state cannot hold both",
                node=carried.node, op=graph.node(carried.node).op.type_name,
            )
        writers[source.id] = (carried.node, carried.operand)
        others = [u for u in graph.consumers()[source.id] if u != carried.node]
        if others:
            raise GraphError(
                f"carried state Input {source.op.name!r} also feeds nodes {others}; a Core ML state is read by"
                " the recurrence only (convert without kv_cache= to keep it an input)",
                node=source.id, op="Input", name=source.op.name,
            )
        try:
            sizes = source.shape.sizes()
        except ValueError:
            raise GraphError(f"carried state Input {source.op.name!r} has dynamic shape {source.shape}; bind the dims"
                             " first", node=source.id, op="Input", name=source.op.name) from None
        found.append(RecurrentState(source.id, source.op.name, carried.name, sizes, (carried.node, carried.operand)))
    return found


def read_states(states: list[RecurrentState], state_vars: Mapping[str, Any], precision: Precision,
                env: dict[int, Any], name: Any) -> None:
    """Bind each state Input to the value read from its state (fp32 programs widen it)."""
    from coremltools.converters.mil import Builder as mb

    for state in states:
        var = mb.read_state(input=state_vars[state.state_name], name=name(f"{state.state_name}_read"))
        if precision is Precision.FP32:
            var = mb.cast(x=var, dtype="fp32", name=name(f"{state.state_name}_fp32"))
        env[state.input_id] = var


def write_states(states: list[RecurrentState], state_vars: Mapping[str, Any], precision: Precision,
                 published: Mapping[tuple[int, int], Any], name: Any) -> None:
    """Write each published final state back into its Core ML state (fp16)."""
    from coremltools.converters.mil import Builder as mb

    for state in states:
        value = published.get(state.writer)
        if value is None:
            raise GraphError(f"node %{state.writer[0]} published no final state for {state.input_name!r}")
        if precision is Precision.FP32:
            value = mb.cast(x=value, dtype="fp16", name=name(f"{state.state_name}_fp16"))
        mb.coreml_update_state(state=state_vars[state.state_name], value=value, name=name(f"{state.state_name}_write"))
