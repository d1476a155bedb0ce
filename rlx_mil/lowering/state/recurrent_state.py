"""Carried recurrent states as Core ML states (iOS18), through the `kv_cache=` option.

An op that writes its final state back into an Input (GatedDeltaNet `carry_state`, the RNNs'
`carry`; see `Op.carried_operands`) is normally converted with that Input and an extra output
`<input>_out` (`rlx_mil.ir.naming.state_outputs`) the caller feeds back. With `kv_cache="auto"`
(or `kv_cache={input_name: "<input>_out"}`) the stateful lowering that keeps KV caches in
states keeps these states there too: the Input and the `_out` output leave the interface, an
fp16 state named after the Input holds the value, the program reads it with `read_state` where
the Input was used and writes the published final state back with `coreml_update_state`.
A fresh Core ML state is zeros, which is the recurrence's own zero initial state.

A state a graph threads by itself (a causal convolution's window of recent inputs) is an Input
`X` with a regular output `X_out` of the same shape and dtype (`rlx_mil.ir.naming.STATE_OUTPUT_SUFFIX`;
the decoders' `conv_state_{i}` / `conv_state_{i}_out`): the same conversion keeps it in a state,
read where the Input was used and overwritten with the output's value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlx_mil.errors import GraphError
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.naming import STATE_OUTPUT_SUFFIX, mil_identifier, output_names, state_outputs
from rlx_mil.ir.ops import Input
from rlx_mil.lowering.target import Precision


@dataclass(frozen=True)
class RecurrentState:
    """A carried state Input kept as a Core ML state."""

    input_id: int
    input_name: str
    #: The `<input>_out` output it replaces.
    output_name: str
    shape: tuple[int, ...]
    #: (node id, operand) whose published final state is written back.
    writer: tuple[int, int] | None
    #: Or the graph output node whose value is written back (a state the graph threads itself).
    output_node: int | None = None

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
    return found + _threaded_states(graph, named, {s.input_id for s in found})


def _threaded_states(graph: Graph, named: Mapping[str, str] | None, taken: set[int]) -> list[RecurrentState]:
    """Input `X` + regular output `X_out` pairs of one shape and dtype (all of them, or those
    `named` maps)."""
    outputs = dict(zip(output_names(graph), graph.outputs, strict=True))
    found: list[RecurrentState] = []
    for node in graph:
        if not isinstance(node.op, Input) or node.id in taken:
            continue
        out_name = node.op.name + STATE_OUTPUT_SUFFIX
        if out_name not in outputs or (named is not None and named.get(node.op.name) != out_name):
            continue
        out = graph.node(outputs[out_name])
        if out.shape != node.shape:
            raise GraphError(
                f"Input {node.op.name!r} and output {out_name!r} look like a state the graph threads, but their"
                f" shapes differ ({node.shape} vs {out.shape})", node=out.id, op=out.op.type_name, name=out_name,
            )
        try:
            sizes = node.shape.sizes()
        except ValueError:
            raise GraphError(f"state Input {node.op.name!r} has dynamic shape {node.shape}; bind the dims first",
                             node=node.id, op="Input", name=node.op.name) from None
        found.append(RecurrentState(node.id, node.op.name, out_name, sizes, None, out.id))
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
                 published: Mapping[tuple[int, int], Any], var_of: Callable[[int], Any], name: Any) -> None:
    """Write each published final state (or threaded state output) back into its Core ML state (fp16)."""
    from coremltools.converters.mil import Builder as mb

    for state in states:
        if state.writer is None:
            assert state.output_node is not None
            value = var_of(state.output_node)
        else:
            value = published.get(state.writer)
            if value is None:
                raise GraphError(f"node %{state.writer[0]} published no final state for {state.input_name!r}")
        if precision is Precision.FP32:
            value = mb.cast(x=value, dtype="fp16", name=name(f"{state.state_name}_fp16"))
        mb.coreml_update_state(state=state_vars[state.state_name], value=value, name=name(f"{state.state_name}_write"))
