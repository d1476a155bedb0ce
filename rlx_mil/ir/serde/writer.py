"""Writing a graph in upstream RLX's serde JSON form, byte for byte as serde_json would."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from rlx_mil.errors import GraphFormatError, JsonVersionError
from rlx_mil.ir.node import Node, NodeOrigin
from rlx_mil.ir.ops import Constant, Op
from rlx_mil.ir.serde.codecs import DTYPE, STR, U32, USIZE, OptionCodec, RawNumber, SubGraphCodec, fail
from rlx_mil.ir.serde.forms import OP_FORMS, legacy_problem
from rlx_mil.ir.serde.versions import NEWEST, V0_2_2, VERSIONS
from rlx_mil.ir.shape import Dynamic, Shape, Static


def encode_graph(
    name: str, nodes: Sequence[Node], outputs: Sequence[int], *, indent: int | None = None, version: str = NEWEST
) -> str:
    """Serialize exactly as upstream's serde_json (of `version`: "0.2.2" or "newest") would.

    `indent=None` gives `serde_json::to_string`'s compact form; an int gives
    `to_string_pretty`'s layout with that many spaces (upstream uses 2). Values upstream
    cannot represent (non-finite floats, out-of-range integers, payloads not matching their
    shape, and in the 0.2.2 form whatever 0.2.2 has no spelling for) raise GraphFormatError
    naming the node and field.
    """
    if indent is not None and (isinstance(indent, bool) or not isinstance(indent, int) or indent < 0):
        raise ValueError(f"indent must be None or a non-negative int, got {indent!r}")
    if version not in VERSIONS:
        raise ValueError(f"version must be one of {', '.join(map(repr, VERSIONS))}, got {version!r}")
    document = _graph_document(name, nodes, outputs, version)
    out: list[str] = []
    _emit(document, out, None if indent is None else " " * indent, 0)
    return "".join(out)


# ============================================================================ encoding


def _graph_document(name: str, nodes: Sequence[Node], outputs: Sequence[int], version: str) -> dict[str, object]:
    return {
        "name": STR.encode(name, "name"),
        "nodes": [_encode_node(node, index, version) for index, node in enumerate(nodes)],
        "outputs": [U32.encode(output_id, f"outputs[{pos}]") for pos, output_id in enumerate(outputs)],
    }


def _encode_node(node: Node, index: int, version: str) -> dict[str, object]:
    path = f"nodes[{index}]"
    if node.id != index:
        fail(f"{path}.id", f"node id {node.id} differs from its position {index}")
    return {
        "id": U32.encode(node.id, f"{path}.id"),
        "op": _encode_op(node.op, node.shape, f"{path}.op", version),
        "inputs": [U32.encode(i, f"{path}.inputs[{pos}]") for pos, i in enumerate(node.inputs)],
        "shape": _encode_shape(node.shape, f"{path}.shape"),
        "name": OptionCodec(STR).encode(node.name, f"{path}.name"),
        "origin": _encode_origin(node.origin, f"{path}.origin"),
    }


def _encode_shape(shape: Shape, path: str) -> dict[str, object]:
    dims: list[object] = []
    for i, dim in enumerate(shape.dims):
        dim_path = f"{path}.dims[{i}]"
        if isinstance(dim, Static):
            dims.append({"Static": USIZE.encode(dim.size, f"{dim_path}.Static")})
        elif isinstance(dim, Dynamic):
            dims.append({"Dynamic": U32.encode(dim.symbol, f"{dim_path}.Dynamic")})
        else:
            fail(dim_path, f"expected Static or Dynamic, got {dim!r}")
    return {"dims": dims, "dtype": DTYPE.encode(shape.dtype, f"{path}.dtype")}


def _encode_origin(origin: NodeOrigin | None, path: str) -> object:
    if origin is None:
        return None
    return {
        "hir": OptionCodec(U32).encode(origin.hir, f"{path}.hir"),
        "label": OptionCodec(STR).encode(origin.label, f"{path}.label"),
        "pass": OptionCodec(STR).encode(origin.pass_name, f"{path}.pass"),
    }


def _encode_op(op: Op, shape: Shape, path: str, version: str) -> object:
    form = OP_FORMS.get(op.type_name)
    if form is None or type(op) is not form.op_type:
        fail(path, f"no JSON form for op {type(op).__name__}")
    tag = op.type_name
    op_path = f"{path}.{tag}"
    legacy = version == V0_2_2
    if legacy:
        problem = legacy_problem(op, shape)
        if problem is not None:
            raise JsonVersionError(f"{path}: cannot be written as 0.2.2 JSON: {problem}")
    if form.form == "unit" or (legacy and form.legacy_unit):
        return tag
    if isinstance(op, Constant):
        data = op.data
        if shape.is_static and len(data) != shape.numel() * shape.dtype.itemsize:
            fail(
                f"{op_path}.data",
                f"payload has {len(data)} bytes but shape {shape} needs {shape.numel() * shape.dtype.itemsize}",
            )
        return {tag: {"data": bytes(data)}}
    if form.form == "newtype":
        ((field_name, codec),) = form.fields
        return {tag: codec.encode(getattr(op, field_name), op_path)}
    skipped = form.legacy_defaults if legacy else {}
    body: dict[str, object] = {}
    for field_name, codec in form.fields:
        if field_name in skipped:
            continue
        value = getattr(op, field_name)
        field_path = f"{op_path}.{field_name}"
        is_graph = isinstance(codec, SubGraphCodec) or (
            isinstance(codec, OptionCodec) and isinstance(codec.inner, SubGraphCodec))
        if is_graph and value is None:
            body[field_name] = None
        elif is_graph:
            try:
                body[field_name] = _graph_document(value.name, value.nodes, value.outputs, version)
            except GraphFormatError as err:
                raise type(err)(f"{field_path}: {err}") from err
        else:
            body[field_name] = codec.encode(value, field_path)
    return {tag: body}


# serde_json escapes exactly what json's non-ASCII-preserving encoder escapes: quote,
# backslash and C0 controls (short forms for \b \f \n \r \t, else lowercase \u00XX).
_quote: Callable[[str], str] = json.encoder.encode_basestring
_BYTE_TEXT = [str(i) for i in range(256)]


def _emit(value: object, out: list[str], indent: str | None, depth: int) -> None:
    """Write `value` in serde_json's compact (indent None) or pretty layout."""
    if isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        if indent is None:
            out.append("{")
            for i, (key, item) in enumerate(value.items()):
                out.append(("," if i else "") + _quote(key) + ":")
                _emit(item, out, indent, depth + 1)
            out.append("}")
        else:
            inner = "\n" + indent * (depth + 1)
            out.append("{")
            for i, (key, item) in enumerate(value.items()):
                out.append(("," if i else "") + inner + _quote(key) + ": ")
                _emit(item, out, indent, depth + 1)
            out.append("\n" + indent * depth + "}")
    elif isinstance(value, (list, bytes)):
        if not value:
            out.append("[]")
            return
        if isinstance(value, bytes):
            # Constant payloads can be large: join the byte values in one C-level pass.
            separator = "," if indent is None else ",\n" + indent * (depth + 1)
            head = "[" if indent is None else "[\n" + indent * (depth + 1)
            tail = "]" if indent is None else "\n" + indent * depth + "]"
            out.append(head + separator.join(map(_BYTE_TEXT.__getitem__, value)) + tail)
            return
        if indent is None:
            out.append("[")
            for i, item in enumerate(value):
                if i:
                    out.append(",")
                _emit(item, out, indent, depth + 1)
            out.append("]")
        else:
            inner = "\n" + indent * (depth + 1)
            out.append("[")
            for i, item in enumerate(value):
                out.append(("," if i else "") + inner)
                _emit(item, out, indent, depth + 1)
            out.append("\n" + indent * depth + "]")
    elif isinstance(value, str):
        out.append(_quote(value))
    elif value is None:
        out.append("null")
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, RawNumber):
        out.append(value.text)
    else:
        raise AssertionError(f"unexpected value in JSON document: {value!r}")
