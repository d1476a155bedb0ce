"""Reading upstream RLX's serde JSON into a graph (spec section 2).

Reading treats the text as untrusted. Every defect (bad JSON, wrong types, out-of-range
integers, unknown variants, dangling node ids, payload sizes, IR rule violations found by
`add_node`) raises :class:`~rlx_mil.errors.GraphFormatError` whose message starts with the
JSON path at fault, e.g. ``nodes[3].op.Attention.num_heads: expected a non-negative integer,
got "4"``. No other exception type escapes, and sizes are checked against :class:`JsonLimits`
before anything proportional to them is built.

The graph class is passed in (`new_graph`), so this module does not depend on `Graph`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol, TypeVar

from rlx_mil.errors import GraphError, GraphFormatError, UnsupportedOpFormatError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.node import Node, NodeOrigin
from rlx_mil.ir.ops import Constant, GatherElements, GatherNd, Op
from rlx_mil.ir.serde.codecs import (
    DTYPE,
    MISSING,
    STR,
    U32,
    USIZE,
    DuplicateKeyObject,
    FloatToken,
    OptionCodec,
    SubGraphCodec,
    describe,
    did_you_mean,
    fail,
    json_array,
    json_object,
    required,
    tagged,
)
from rlx_mil.ir.serde.complex import add_promoted
from rlx_mil.ir.serde.custom import (
    GATHER_ELEMENTS_NAME,
    GATHER_ND_NAME,
    CumProdAttrs,
    EinsumEquation,
    OneHotAxis,
    ScatterElementsAttrs,
    add_cum_prod,
    add_einsum,
    add_gather_elements,
    add_gather_nd,
    add_one_hot,
    add_scatter_elements,
    custom_name,
    custom_operands,
    decode_custom,
)
from rlx_mil.ir.serde.custom_alignment import AlignmentHelper, add_alignment_helper
from rlx_mil.ir.serde.custom_nonzero import NonZeroRead, add_non_zero
from rlx_mil.ir.serde.forms import OP_FORMS, UNSUPPORTED_UPSTREAM_OPS, needs_newest
from rlx_mil.ir.serde.payloads import ExtractedPayloads, extract_payloads
from rlx_mil.ir.serde.versions import NEWEST, V0_2_2
from rlx_mil.ir.shape import Dim, Dynamic, Shape, Static


class GraphSink(Protocol):
    def add_node(
        self,
        op: Op,
        inputs: Sequence[int],
        shape: Shape | None = None,
        *,
        name: str | None = None,
        origin: NodeOrigin | None = None,
    ) -> int: ...

    def set_outputs(self, ids: Sequence[int] | int) -> None: ...

    @property
    def nodes(self) -> tuple[Node, ...]: ...

    json_version: str | None


GraphT = TypeVar("GraphT", bound=GraphSink)


@dataclass(frozen=True)
class JsonLimits:
    """Size caps applied while reading untrusted JSON.

    `max_text_length` counts characters of a `str`, or bytes of `bytes` and files; it is
    checked before parsing, so oversized input never reaches the JSON parser. `max_numel`
    caps the element count of every declared shape (static dims). `max_constant_bytes` caps
    the sum of all `Constant` payloads and is checked from the declared shape before the
    payload is converted. `max_subgraph_depth` caps how deeply If/While/Scan bodies nest and
    `max_subgraph_nodes` the nodes of all bodies together, each checked before a body's nodes
    are decoded.
    """

    max_text_length: int = 1 << 32
    max_numel: int = 1 << 40
    max_constant_bytes: int = 2 << 30
    max_subgraph_depth: int = 16
    max_subgraph_nodes: int = 1 << 20


DEFAULT_LIMITS = JsonLimits()


# ============================================================================ parsing


def _object_from_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        marked = DuplicateKeyObject(result)
        for key, _ in pairs:
            if key in seen:
                marked.duplicate = key
                break
            seen.add(key)
        return marked
    return result


def _reject_constant(name: str) -> NoReturn:
    raise GraphFormatError(f"invalid JSON: {name} is not a JSON value (non-finite numbers are not allowed)")


_DECODER = json.JSONDecoder(
    object_pairs_hook=_object_from_pairs,
    parse_float=FloatToken,
    parse_constant=_reject_constant,
)


def _parse_document(text: str | bytes | bytearray | memoryview, limits: JsonLimits) -> object:
    if isinstance(text, (bytes, bytearray, memoryview)):
        raw = bytes(text)
        if len(raw) > limits.max_text_length:
            raise GraphFormatError(
                f"JSON text has {len(raw)} bytes, more than the limit of {limits.max_text_length}"
            )
        try:
            decoded = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise GraphFormatError(f"JSON text is not valid UTF-8 (byte offset {err.start})") from err
    elif isinstance(text, str):
        decoded = text
        if len(decoded) > limits.max_text_length:
            raise GraphFormatError(
                f"JSON text has {len(decoded)} characters, more than the limit of {limits.max_text_length}"
            )
    else:
        raise GraphFormatError(f"expected JSON text as str or bytes, got {type(text).__name__}")
    if decoded.startswith("\ufeff"):
        raise GraphFormatError("invalid JSON: text starts with a byte-order mark (U+FEFF)")
    try:
        return _DECODER.decode(decoded)
    except GraphFormatError:
        raise
    except json.JSONDecodeError as err:
        raise GraphFormatError(f"invalid JSON: {err.msg} at line {err.lineno} column {err.colno}") from err
    except RecursionError as err:
        raise GraphFormatError("invalid JSON: nesting is too deep") from err
    except MemoryError as err:
        raise GraphFormatError("invalid JSON: out of memory while parsing") from err
    except (ValueError, OverflowError) as err:
        # E.g. integer literals beyond Python's int-from-string digit limit.
        raise GraphFormatError(f"invalid JSON: {err}") from err



# ============================================================================ graph decoding


@dataclass
class _DecodeState:
    limits: JsonLimits
    new_graph: Callable[[str], Any]
    constant_bytes: int = 0
    #: How many bodies enclose the graph being decoded, and the nodes of all bodies so far.
    depth: int = 0
    subgraph_nodes: int = 0
    #: Whether the document spells something only the newest upstream JSON has.
    newest_syntax: bool = False
    #: Constant payloads decoded before parsing (see `payloads`), by the key standing for each.
    extracted: ExtractedPayloads | None = None


def _decode_dim(value: object, path: str) -> Dim:
    tag, content = tagged(value, path, 'a dim ({"Static": n} or {"Dynamic": symbol})')
    if content is MISSING:
        fail(path, f'expected {{"Static": n}} or {{"Dynamic": symbol}}, got {describe(value)}')
    if tag == "Static":
        return Static(USIZE.decode(content, f"{path}.Static"))
    if tag == "Dynamic":
        return Dynamic(U32.decode(content, f"{path}.Dynamic"))
    fail(path, f'unknown Dim variant {describe(tag)} (expected "Static" or "Dynamic")')


def _static_numel(dims: Sequence[Dim], cap: int) -> int:
    """Element count over the static dims, or cap + 1 as soon as it exceeds cap."""
    sizes = [d.size for d in dims if isinstance(d, Static)]
    if 0 in sizes:
        return 0
    numel = 1
    for size in sizes:
        numel *= size
        if numel > cap:
            return cap + 1
    return numel


def _decode_shape(value: object, path: str, state: _DecodeState) -> Shape:
    obj = json_object(value, path)
    dims_path = f"{path}.dims"
    raw_dims = json_array(required(obj, "dims", path), dims_path)
    dims = tuple(_decode_dim(d, f"{dims_path}[{i}]") for i, d in enumerate(raw_dims))
    dtype = DTYPE.decode(required(obj, "dtype", path), f"{path}.dtype")
    assert isinstance(dtype, DType)
    cap = state.limits.max_numel
    if _static_numel(dims, cap) > cap:
        fail(dims_path, f"shape has more than {cap} elements (the configured limit)")
    return Shape(dims, dtype)


def _decode_origin(value: object, path: str) -> NodeOrigin | None:
    if value is None:
        return None
    obj = json_object(value, path)
    opt_u32, opt_str = OptionCodec(U32), OptionCodec(STR)
    hir = opt_u32.decode(obj.get("hir"), f"{path}.hir")
    label = opt_str.decode(obj.get("label"), f"{path}.label")
    pass_name = opt_str.decode(obj.get("pass"), f"{path}.pass")
    assert hir is None or isinstance(hir, int)
    assert label is None or isinstance(label, str)
    assert pass_name is None or isinstance(pass_name, str)
    return NodeOrigin(hir=hir, label=label, pass_name=pass_name)


def _byte_at_fault(items: list[object]) -> tuple[int, object]:
    for i, item in enumerate(items):
        if type(item) is not int or not 0 <= item <= 255:
            return i, item
    raise AssertionError("no offending byte")


def _decode_constant(content: object, path: str, shape: Shape, state: _DecodeState) -> Constant:
    body = json_object(content, path)
    data_path = f"{path}.data"
    data = required(body, "data", path)
    ready = None if state.extracted is None else state.extracted.take(data)
    items = [] if ready is not None else json_array(data, data_path)
    if not shape.is_static:
        fail(path, f"a Constant needs a static shape to size its payload, got {shape}")
    expected = _static_numel(shape.dims, state.limits.max_numel) * shape.dtype.itemsize
    budget = state.limits.max_constant_bytes - state.constant_bytes
    if expected > budget:
        fail(
            data_path,
            f"constant payloads would total more than {state.limits.max_constant_bytes} bytes"
            f" (this one needs {expected}; the configured limit)",
        )
    count = len(ready) if ready is not None else len(items)
    if count != expected:
        fail(
            data_path,
            f"payload has {count} bytes but shape {shape} needs {expected}"
            f" ({shape.numel()} elements x {shape.dtype.itemsize} bytes)",
        )
    if ready is not None:
        state.constant_bytes += len(ready)
        return Constant(ready)
    # set(map(type, ...)) and bytes() run in C; the per-item loop only runs to explain a failure.
    if set(map(type, items)) - {int}:
        index, item = _byte_at_fault(items)
        fail(f"{data_path}[{index}]", f"expected a byte value 0..255, got {describe(item)}")
    try:
        payload = bytes(items)  # type: ignore[arg-type]
    except ValueError:
        index, item = _byte_at_fault(items)
        fail(f"{data_path}[{index}]", f"expected a byte value 0..255, got {describe(item)}")
    state.constant_bytes += len(payload)
    return Constant(payload)


def _decode_op(value: object, path: str, shape: Shape, state: _DecodeState) -> Op:
    tag, content = tagged(value, path, "an op")
    form = OP_FORMS.get(tag)
    if form is None and tag == "Custom":
        state.newest_syntax = True
        return decode_custom(content, f"{path}.Custom")
    if form is None:
        if tag in UNSUPPORTED_UPSTREAM_OPS:
            raise UnsupportedOpFormatError(
                f"{path}: upstream op {tag} is not supported by rlx_mil (no IR definition or lowering)"
            )
        fail(path, f"unknown or unsupported op variant {describe(tag)}{did_you_mean(tag, OP_FORMS)}")
    op_path = f"{path}.{tag}"
    if form.since != V0_2_2:
        state.newest_syntax = True
    if form.form == "unit" or (form.legacy_unit and content is MISSING):
        if content is not MISSING and content is not None:
            fail(op_path, f"{tag} takes no attributes, got {describe(content)}")
        # A struct op 0.2.2 spelled bare (ScatterAdd): the newest fields take their 0.2.2 meaning.
        return _construct(form.op_type, form.legacy_defaults, op_path)
    if content is MISSING:
        fail(path, f'{tag} needs its attributes: {{"{tag}": ...}}')
    if form.op_type is Constant:
        return _decode_constant(content, op_path, shape, state)
    kwargs: dict[str, object] = {}
    if form.form == "newtype":
        ((field_name, codec),) = form.fields
        kwargs[field_name] = codec.decode(content, op_path)
        return _construct(form.op_type, kwargs, op_path)
    body = json_object(content, op_path)
    known = {field_name for field_name, _ in form.fields}
    for key in body:
        if key not in known:
            fail(
                f"{op_path}.{key}",
                f'unknown field "{key}" for op {tag} (its fields: {", ".join(sorted(known)) or "none"})',
            )
    legacy = form.legacy_defaults
    if form.legacy_unit:
        state.newest_syntax = True
    for field_name, codec in form.fields:
        raw = body.get(field_name, MISSING)
        field_path = f"{op_path}.{field_name}"
        if field_name in legacy:
            if raw is MISSING:
                # A 0.2.2 document: the field did not exist yet (spec upgrade rules).
                kwargs[field_name] = legacy[field_name]
                continue
            state.newest_syntax = True
        if raw is MISSING:
            if not codec.optional:
                fail(op_path, f'missing required field "{field_name}"')
            raw = None
        if isinstance(codec, SubGraphCodec):
            kwargs[field_name] = _decode_subgraph(raw, field_path, state)
        elif isinstance(codec, OptionCodec) and isinstance(codec.inner, SubGraphCodec):
            kwargs[field_name] = None if raw is None else _decode_subgraph(raw, field_path, state)
        else:
            kwargs[field_name] = codec.decode(raw, field_path)
    return _construct(form.op_type, kwargs, op_path)


def _construct(op_type: type[Op], kwargs: dict[str, object], op_path: str) -> Op:
    try:
        return op_type(**kwargs)
    except (ValueError, TypeError) as err:
        raise GraphFormatError(f"{op_path}: {err}") from err


def _decode_subgraph(value: object, path: str, state: _DecodeState) -> object:
    """A nested graph (If/While/Scan bodies): a complete graph object with its own node ids."""
    limits = state.limits
    if state.depth >= limits.max_subgraph_depth:
        fail(path, f"bodies nest more than {limits.max_subgraph_depth} deep (the configured limit)")
    raw_nodes = json_object(value, path, "a graph object").get("nodes")
    if isinstance(raw_nodes, list):
        state.subgraph_nodes += len(raw_nodes)
        if state.subgraph_nodes > limits.max_subgraph_nodes:
            fail(f"{path}.nodes", f"the bodies hold more than {limits.max_subgraph_nodes} nodes together"
                 " (the configured limit)")
    state.depth += 1
    try:
        return _build_graph(value, path, state)
    except GraphFormatError as err:
        raise type(err)(f"{path}: {err}") from err
    finally:
        state.depth -= 1


_NodeFields = tuple[Op, tuple[int, ...], Shape, "str | None", "NodeOrigin | None"]


def _decode_node(value: object, index: int, state: _DecodeState) -> _NodeFields:
    path = f"nodes[{index}]"
    obj = json_object(value, path)
    node_id = U32.decode(required(obj, "id", path), f"{path}.id")
    if node_id != index:
        # Upstream consumers look nodes up by position and never read this field, so a
        # mismatch means the producer and its consumers disagree about which node an input
        # id names. Renumbering would silently pick one reading; refusing makes the
        # inconsistency visible instead.
        fail(f"{path}.id", f"node id {node_id} differs from its position {index} in nodes")
    inputs_path = f"{path}.inputs"
    raw_inputs = json_array(required(obj, "inputs", path), inputs_path)
    inputs: list[int] = []
    for pos, raw in enumerate(raw_inputs):
        input_id = U32.decode(raw, f"{inputs_path}[{pos}]")
        if input_id >= index:
            fail(
                f"{inputs_path}[{pos}]",
                f"node {input_id} is not defined before node {index}"
                " (inputs must name earlier nodes; forward references and cycles are not allowed)",
            )
        inputs.append(input_id)
    shape = _decode_shape(required(obj, "shape", path), f"{path}.shape", state)
    name = OptionCodec(STR).decode(obj.get("name"), f"{path}.name")
    assert name is None or isinstance(name, str)
    origin = _decode_origin(obj.get("origin"), f"{path}.origin")
    raw_op = required(obj, "op", path)
    op = _decode_op(raw_op, f"{path}.op", shape, state)
    return op, tuple(custom_operands(raw_op, inputs)), shape, name, origin


def _build_graph(document: object, root: str, state: _DecodeState) -> Any:
    obj = json_object(document, root, "a graph object")
    name = STR.decode(required(obj, "name", root), "name")
    raw_nodes = json_array(required(obj, "nodes", root), "nodes")
    raw_outputs = json_array(required(obj, "outputs", root), "outputs")
    graph = state.new_graph(name)
    # Node ids of the graph by JSON position: a C64 op may become several nodes (serde/complex.py).
    ids: list[int] = []
    complex_ids: set[int] = set()
    for index, raw_node in enumerate(raw_nodes):
        op, json_inputs, shape, node_name, origin = _decode_node(raw_node, index, state)
        inputs = [ids[i] for i in json_inputs]
        try:
            custom = custom_name(raw_node.get("op") if isinstance(raw_node, dict) else None)
            if custom == GATHER_ND_NAME and isinstance(op, GatherNd) and len(inputs) == 2:
                ids.append(add_gather_nd(graph.add_node, graph.nodes[inputs[0]].shape, graph.nodes[inputs[1]].shape,
                                         op, inputs, shape, node_name, origin))
            elif isinstance(op, ScatterElementsAttrs):
                ids.append(add_scatter_elements(graph.add_node, [graph.nodes[i].shape for i in inputs], op, inputs,
                                                shape, f"nodes[{index}]", node_name, origin))
            elif isinstance(op, EinsumEquation):
                ids.append(add_einsum(graph.add_node, [graph.nodes[i].shape for i in inputs], op.equation, inputs,
                                      shape, f"nodes[{index}]", node_name, origin))
            elif isinstance(op, CumProdAttrs):
                ids.append(add_cum_prod(graph.add_node, lambda i: graph.nodes[i], op, inputs, shape,
                                        f"nodes[{index}]", node_name, origin))
            elif isinstance(op, NonZeroRead):
                ids.append(add_non_zero(graph.add_node, [graph.nodes[i].shape for i in inputs], inputs, shape,
                                        f"nodes[{index}]", node_name, origin))
            elif isinstance(op, AlignmentHelper):
                ids.append(add_alignment_helper(graph.add_node, [graph.nodes[i].shape for i in inputs], op.helper,
                                                inputs, shape, f"nodes[{index}]", node_name, origin))
            elif isinstance(op, OneHotAxis):
                ids.append(add_one_hot(graph.add_node, [graph.nodes[i].shape for i in inputs], op.axis, inputs, shape,
                                       f"nodes[{index}]", node_name, origin))
            elif custom == GATHER_ELEMENTS_NAME and isinstance(op, GatherElements) and len(inputs) == 2:
                ids.append(add_gather_elements(graph.add_node, graph.nodes[inputs[0]].shape,
                                               graph.nodes[inputs[1]].shape, op.axis, inputs, shape, node_name, origin))
            elif shape.dtype is DType.C64 or complex_ids.intersection(inputs):
                ids.append(add_promoted(graph.add_node, lambda i: graph.nodes[i].shape, op, inputs, shape,
                                        complex_ids, f"nodes[{index}]", node_name, origin))
            else:
                ids.append(graph.add_node(op, inputs, shape, name=node_name, origin=origin))
        except GraphError as err:
            # The GraphError text already names the node id, name and op.
            raise GraphFormatError(f"nodes[{index}]: {err}") from err
        except (ValueError, TypeError, IndexError, KeyError, ArithmeticError, AssertionError) as err:
            # IR validation is meant to raise GraphError only; keep the loader's promise of a
            # single error type even if a validation rule trips over a hostile value (the
            # original exception stays attached as the cause).
            raise GraphFormatError(
                f"nodes[{index}] ({op.type_name}): validation failed: {type(err).__name__}: {err}"
            ) from err
    outputs: list[int] = []
    for pos, raw in enumerate(raw_outputs):
        output_id = U32.decode(raw, f"outputs[{pos}]")
        if output_id >= len(raw_nodes):
            fail(f"outputs[{pos}]", f"node {output_id} does not exist (the graph has {len(raw_nodes)} nodes)")
        outputs.append(ids[output_id])
    graph.set_outputs(outputs)
    return graph


def _decode_graph(
    document: object, limits: JsonLimits, new_graph: Callable[[str], GraphT], extracted: ExtractedPayloads | None = None
) -> GraphT:
    json_object(document, "graph", "a JSON object at the top level")
    state = _DecodeState(limits, new_graph, extracted=extracted)
    graph: GraphT = _build_graph(document, "graph", state)
    if extracted is not None and extracted.payloads:
        raise _NotPlain  # a payload array somewhere the reader did not take it from
    newest = state.newest_syntax or any(needs_newest(node) for node in graph.nodes)
    graph.json_version = NEWEST if newest else V0_2_2
    return graph


# ============================================================================ entry point


class _NotPlain(Exception):
    """The extracted form did not decode cleanly: read the original text the ordinary way."""


def _decode_text(text: str | bytes, new_graph: Callable[[str], GraphT], limits: JsonLimits,
                 extracted: ExtractedPayloads | None = None) -> GraphT:
    document = _parse_document(text, limits)
    try:
        return _decode_graph(document, limits, new_graph, extracted)
    except RecursionError as err:
        raise GraphFormatError("graph is nested too deeply to process") from err
    except MemoryError as err:
        raise GraphFormatError("out of memory while building the graph") from err


def _decode_extracted(text: list[bytes], new_graph: Callable[[str], GraphT], limits: JsonLimits) -> GraphT | None:
    """The graph of the text `text` holds (taken out of it, so that it is released once its
    payloads are decoded unless the caller keeps another reference) read with its Constant payloads taken out first (memory near the
    text's size rather than several times it), or None to read it the ordinary way: no payload
    to take, or any error (whose exact message the ordinary reading gives)."""
    raw = text.pop()
    if len(raw) > limits.max_text_length:
        return None
    extracted = extract_payloads(raw, limits.max_constant_bytes)
    del raw
    if extracted is None:
        return None
    try:
        return _decode_text(extracted.skeleton, new_graph, limits, extracted)
    except (GraphFormatError, GraphError, _NotPlain):
        return None


def decode_graph(text: str | bytes, new_graph: Callable[[str], GraphT], limits: JsonLimits = DEFAULT_LIMITS) -> GraphT:
    """Build a graph from upstream RLX's serde JSON (compact or pretty) with `new_graph(name)`.

    Every node goes through the graph's `add_node`, so the IR checks apply. Any defect
    raises :class:`GraphFormatError` naming the JSON path at fault.
    """
    if isinstance(text, bytes):
        graph = _decode_extracted([text], new_graph, limits)
        if graph is not None:
            return graph
    return _decode_text(text, new_graph, limits)


def decode_graph_file(
    path: str | os.PathLike[str], new_graph: Callable[[str], GraphT], limits: JsonLimits = DEFAULT_LIMITS
) -> GraphT:
    """Load a graph from a JSON file. A missing file, a device or FIFO (refused before it is
    read), no permission... raise FileAccessError subclasses (also the matching OSError).

    The text is released as soon as its Constant payloads are decoded, so peak memory stays
    near the file's size plus the payloads; a file that does not decode that way is read again
    the ordinary way for its exact error."""
    from rlx_mil.fileio import read_regular_file

    file_path = Path(path)

    def read() -> bytes:
        return read_regular_file(file_path, limits.max_text_length, GraphFormatError, "graph JSON file")

    try:
        graph = _decode_extracted([read()], new_graph, limits)
        return graph if graph is not None else _decode_text(read(), new_graph, limits)
    except GraphFormatError as err:
        raise GraphFormatError(f"{file_path}: {err}") from err
