"""Names at the model boundary.

`reference.evaluate`, the converted model and the MIL executor all key outputs the same way:
by the output node's name, or a stable generated name where it has none. Core ML only takes
identifiers (`[A-Za-z_][A-Za-z0-9_]*`), so a model's interface uses `mil_identifier` of those
names, and the original names travel in the model metadata (`IO_NAMES_METADATA_KEY`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import Input

#: user_defined_metadata key holding JSON {"inputs": {mil: ir}, "outputs": {mil: ir}}.
IO_NAMES_METADATA_KEY = "rlx_mil.io_names"

_NOT_IDENT = re.compile(r"[^A-Za-z0-9_]")


def generated_name(graph: Graph, node_id: int) -> str:
    """Name of an unnamed node: op type in snake case plus its id, e.g. `attention_backward_7`."""
    type_name = graph.node(node_id).op.type_name
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", type_name).lower()
    return f"{snake}_{node_id}"


def output_names(graph: Graph) -> list[str]:
    """The keys of the graph's outputs, in output order, unique.

    A named node keeps its name; an unnamed one gets `generated_name`. A name used twice (the
    same node listed twice, or two nodes sharing a name) gets `_1`, `_2`... on its repeats.
    """
    names: list[str] = []
    seen: set[str] = set()
    for node_id in graph.outputs:
        node = graph.node(node_id)
        base = node.name if node.name else generated_name(graph, node_id)
        name, k = base, 1
        while name in seen:
            name, k = f"{base}_{k}", k + 1
        seen.add(name)
        names.append(name)
    return names


#: Suffix of the extra output that publishes a carried state (`state` -> `state_out`).
STATE_OUTPUT_SUFFIX = "_out"


@dataclass(frozen=True)
class StateOutput:
    """A final state an op writes back into one of its inputs (`Op.carried_operands`), which
    rlx_mil publishes as an extra output named after that input."""

    name: str
    node: int
    operand: int
    #: The node feeding the state operand (an Input in upstream's decode graphs).
    source: int


def state_outputs(graph: Graph) -> list[StateOutput]:
    """The carried states of `graph`, in node order, each keyed `<state input name>_out` (the
    operand's Input name, else its node name), unique among the outputs and inputs."""
    taken = set(output_names(graph)) | set(input_names(graph))
    found: list[StateOutput] = []
    for node in graph:
        for operand in node.op.carried_operands():
            source = graph.node(node.inputs[operand])
            if isinstance(source.op, Input):
                stem = source.op.name
            else:
                stem = source.name if source.name else generated_name(graph, source.id)
            base = stem + STATE_OUTPUT_SUFFIX
            name, k = base, 1
            while name in taken:
                name, k = f"{base}_{k}", k + 1
            taken.add(name)
            found.append(StateOutput(name, node.id, operand, source.id))
    return found


def input_names(graph: Graph) -> list[str]:
    """Names of the graph's Input nodes, in node order."""
    return [n.op.name for n in graph if isinstance(n.op, Input)]


#: Names coremltools' name sanitizer renames (to `<name>_workaround`) because they are MIL
#: type or keyword names; a model interface name must avoid them or the metadata goes stale.
MIL_RESERVED_NAMES = frozenset({
    "any", "bool", "program", "func", "tensor", "list", "dict", "tuple", "true", "false", "string",
    "bf16", "fp16", "fp32", "fp64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
    "uint64", "state",
})


def mil_identifier(name: str) -> str:
    """A Core ML-legal identifier for `name` (identity for names that already are legal)."""
    ident = _NOT_IDENT.sub("_", name)
    if not ident or ident[0].isdigit():
        ident = "var_" + ident
    if ident in MIL_RESERVED_NAMES:
        ident = "var_" + ident
    return ident


def mil_identifiers(names: Iterable[str], taken: Iterable[str] = ()) -> dict[str, str]:
    """Map each name to a unique legal identifier, avoiding `taken`."""
    used = set(taken)
    out: dict[str, str] = {}
    for name in names:
        base = mil_identifier(name)
        ident, k = base, 1
        while ident in used:
            ident, k = f"{base}_{k}", k + 1
        used.add(ident)
        out[name] = ident
    return out
