"""Run a whole graph on NumPy: feed validation, dynamic-dim binding, node-by-node evaluation."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rlx_mil.errors import EvaluationError, GraphError, ShapeError, UnsupportedOpError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph, Node
from rlx_mil.ir.naming import output_names, state_outputs
from rlx_mil.ir.ops import DequantMatMul, Input, Param, QuantKind
from rlx_mil.ir.shape import MAX_TENSOR_ELEMENTS, Dynamic, Shape, Static
from rlx_mil.ir.values import BFLOAT16, numeric_kind, value_problem
from rlx_mil.reference.registry import install_body_runner, kernel_for, state_kernel_for, to_dtype

_SCALARISH = ((), (1,))
_FOUR_BIT = (QuantKind.INT4_BLOCK, QuantKind.NVFP4_BLOCK)


class _Bindings:
    """Sizes of dynamic symbols, with the source that fixed each one (for messages)."""

    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}
        self.sources: dict[int, str] = {}

    def resolve(self, shape: Shape) -> Shape:
        dims = tuple(
            Static(self.sizes[d.symbol]) if isinstance(d, Dynamic) and d.symbol in self.sizes else d
            for d in shape.dims
        )
        return Shape(dims, shape.dtype)

    def match(self, declared: Shape, actual: tuple[int, ...], source: str) -> list[str]:
        """Problems with `actual` against `declared`; binds unseen symbols."""
        if len(actual) != declared.rank:
            if declared.dims in ((), (Static(1),)) and actual in _SCALARISH:
                return []
            return [f"{source}: shape {list(actual)} has rank {len(actual)}, declared {declared} has rank {declared.rank}"]
        problems = []
        for axis, (dim, size) in enumerate(zip(declared.dims, actual, strict=True)):
            if isinstance(dim, Static):
                if dim.size != size:
                    problems.append(f"{source}: shape {list(actual)} does not match the declared {declared} (dim {axis})")
            elif dim.symbol in self.sizes:
                if self.sizes[dim.symbol] != size:
                    problems.append(
                        f"{source}: dim {axis} (?{dim.symbol}) is {size}, but ?{dim.symbol} is"
                        f" {self.sizes[dim.symbol]} from {self.sources[dim.symbol]}"
                    )
            else:
                self.sizes[dim.symbol] = size
                self.sources[dim.symbol] = source
        return problems


def _convert(value: Any, dtype: DType) -> tuple[np.ndarray | None, str | None]:
    """A fed value as an array of `dtype`'s NumPy type, or the reason it cannot be one."""
    try:
        arr = np.asarray(value)
    except Exception as exc:
        return None, f"cannot be converted to an array ({exc})"
    problem = value_problem(arr, dtype)
    if problem is not None:
        return None, problem
    if arr.dtype == BFLOAT16:
        arr = arr.astype(np.float32)
    out = to_dtype(arr, dtype)
    # The caller's array is never bound itself (a kernel's result may be it); a converted one is new.
    return (out.copy() if np.may_share_memory(out, arr) else out), None


def _feed_nodes(graph: Graph, kind: type[Input] | type[Param]) -> dict[str, list[Node]]:
    nodes: dict[str, list[Node]] = {}
    for node in graph:
        if isinstance(node.op, kind):
            nodes.setdefault(node.op.name, []).append(node)
    return nodes


def _packed_weight_sizes(graph: Graph) -> dict[int, int]:
    """Leaves that are the 4-bit weight of a DequantMatMul and declared with their logical
    `[K, N]` shape (as upstream does), mapped to the byte count of their packed form."""
    sizes: dict[int, int] = {}
    for node in graph:
        if not isinstance(node.op, DequantMatMul) or node.op.scheme.kind not in _FOUR_BIT:
            continue
        weight = graph.node(node.inputs[1])
        if isinstance(weight.op, (Input, Param)) and weight.shape.rank == 2 and weight.shape.is_static:
            k, n = weight.shape.sizes()
            sizes[weight.id] = (k * n + 1) // 2
    return sizes


def _packed_feed(value: Any, nodes: list[Node], packed_sizes: dict[int, int]) -> np.ndarray | str | None:
    """A 4-bit weight fed as packed bytes: flat uint8 bytes, a problem message, or None when
    the value is not a packed feed (it then goes through the ordinary checks)."""
    want = {packed_sizes.get(node.id) for node in nodes}
    if len(want) != 1 or None in want:
        return None
    try:
        arr = np.asarray(value)
    except Exception:
        return None
    declared = nodes[0].shape.sizes()
    if arr.shape == declared or arr.size != want.pop() or arr.dtype.kind not in "iuf":
        return None
    with np.errstate(invalid="ignore"):
        values = arr.astype(np.float64).reshape(-1)
    if values.size and (not np.all(np.trunc(values) == values) or values.min() < -128 or values.max() > 255):
        return "holds packed 4-bit bytes outside -128..255 or non-integer values"
    return (values.astype(np.int64) & 0xFF).astype(np.uint8)


def _described(params: Mapping[str, Any]) -> bool:
    """Whether `params` tells a param's shape and dtype without reading it (a lazy mapping:
    `ModelParams`, a package's `PackageParams`)."""
    return callable(getattr(params, "shape_of", None)) and callable(getattr(params, "dtype_of", None))


def _deferred_problems(
    params: Mapping[str, Any], name: str, nodes: list[Node], bindings: _Bindings
) -> list[str]:
    """The problems `_bind_feeds` would find with the float param `name`, from its shape and
    dtype alone (a float declaration checks nothing else of the values)."""
    shape = tuple(int(d) for d in params.shape_of(name))  # type: ignore[attr-defined]
    dtype = np.dtype(params.dtype_of(name))  # type: ignore[attr-defined]
    if numeric_kind(dtype) is None:
        return [f"param '{name}' has dtype {dtype}, which is not a numeric array"]
    found = [problem for node in nodes for problem in bindings.match(node.shape, shape, f"param '{name}'")]
    problem = value_problem(np.empty((0,), dtype), nodes[0].shape.dtype)
    return found + ([f"param '{name}' {problem}"] if problem is not None else [])


def _bind_feeds(
    graph: Graph, inputs: Mapping[str, Any], params: Mapping[str, Any], deferred: dict[int, str] | None = None
) -> tuple[dict[int, np.ndarray], _Bindings]:
    """The feeds by node id, every problem found raised at once. With `deferred` (a dict to
    fill) and a lazy `params` mapping (`_described`), a float param is checked by its shape
    and dtype only and left unread: `deferred` maps its nodes to its name, for `_read_param`
    when a node first uses it."""
    problems: list[str] = []
    feeds: dict[int, np.ndarray] = {}
    lazy = deferred is not None and _described(params)
    bindings = _Bindings()
    input_nodes, param_nodes = _feed_nodes(graph, Input), _feed_nodes(graph, Param)
    packed_sizes = _packed_weight_sizes(graph)
    for label, nodes, given, other, other_label in (
        ("input", input_nodes, inputs, param_nodes, "params"),
        ("param", param_nodes, params, input_nodes, "inputs"),
    ):
        for name in given:
            if name not in nodes:
                hint = f"; it is a {'param' if label == 'input' else 'input'}, pass it in {other_label}=" if name in other else ""
                known = ", ".join(sorted(nodes)) or "none"
                problems.append(f"unexpected {label} '{name}' (the graph's {label}s: {known}){hint}")
        for name, same_name in nodes.items():
            declared = same_name[0].shape
            if name not in given:
                problems.append(f"{label} '{name}' is missing (declared {declared})")
                continue
            if label == "param" and lazy and declared.dtype.is_float and not any(n.id in packed_sizes for n in same_name):
                assert deferred is not None
                found = _deferred_problems(given, name, same_name, bindings)
                problems.extend(found)
                if not found:
                    deferred.update((node.id, name) for node in same_name)
                continue
            value = given[name]  # read once (a lazy mapping decodes on every read)
            packed = _packed_feed(value, same_name, packed_sizes)
            if packed is not None:
                if isinstance(packed, str):
                    problems.append(f"{label} '{name}' {packed}")
                else:
                    feeds.update((node.id, packed) for node in same_name)
                continue
            try:
                raw = np.asarray(value)
            except Exception as exc:
                problems.append(f"{label} '{name}' cannot be converted to an array ({exc})")
                continue
            # Shapes first: a huge value for a small tensor is refused before it is converted.
            found = [] if numeric_kind(raw.dtype) is None else [  # a non-numeric value: say that instead
                problem for node in same_name for problem in bindings.match(node.shape, raw.shape, f"{label} '{name}'")
            ]
            if found:
                problems.extend(found)
                continue
            arr, why = _convert(raw, declared.dtype)
            if arr is None:
                problems.append(f"{label} '{name}' {why}")
                continue
            for node in same_name:
                feeds[node.id] = _shaped(arr, node)
    if problems:
        raise EvaluationError("cannot evaluate the graph with these inputs/params", problems)
    return feeds, bindings


def _shaped(arr: np.ndarray, node: Node) -> np.ndarray:
    return arr.reshape(arr.shape if arr.ndim == node.shape.rank else (1,) * node.shape.rank)


def _read_param(node: Node, name: str, params: Mapping[str, Any]) -> np.ndarray:
    """A deferred float param read and converted to its declared dtype (`_bind_feeds` checked
    the shape and dtype its mapping declares; the value read must have them)."""
    arr, why = _convert(params[name], node.shape.dtype)
    declared = tuple(int(d) for d in params.shape_of(name))  # type: ignore[attr-defined]
    if arr is not None and tuple(arr.shape) != declared:
        why = f"has shape {list(arr.shape)}, not the {list(declared)} its params declared"
    if arr is None or why is not None:
        raise EvaluationError("cannot evaluate the graph with these inputs/params", [f"param '{name}' {why}"])
    return _shaped(arr, node)


def _needed(graph: Graph, roots: Iterable[int]) -> set[int]:
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        node_id = stack.pop()
        if node_id in seen:
            continue
        seen.add(node_id)
        stack.extend(graph.node(node_id).inputs)
    return seen


def _run_node(
    node: Node, args: list[np.ndarray], bindings: _Bindings, states: dict[int, tuple[np.ndarray, ...]] | None = None
) -> np.ndarray:
    """The node's value; the final states of an op that carries state go into `states`."""
    out = bindings.resolve(node.shape)
    op_name = node.op.type_name
    if out.is_static and out.numel() > MAX_TENSOR_ELEMENTS:
        raise ShapeError(
            f"the result would hold {out.numel()} elements ({out}), more than the {MAX_TENSOR_ELEMENTS}"
            " rlx_mil evaluates or converts",
            node=node.id, op=op_name, name=node.name,
        )
    where = f"node %{node.id}" + (f" '{node.name}'" if node.name else "") + f" ({op_name})"
    try:
        kernel = kernel_for(node.op)
        if node.op.carried_operands():
            result, finals = state_kernel_for(node.op)(node.op, args, out)
            if states is not None:
                states[node.id] = finals
        elif out.is_static and out.numel() == 0:
            # An empty result holds no values (and kernels need not handle empty reductions).
            result = np.zeros(out.sizes(), np.float32 if out.dtype is DType.BF16 else out.dtype.numpy)
        else:
            result = kernel(node.op, args, out)
    except GraphError as err:
        raise type(err)(err.detail, node=node.id, op=op_name, name=node.name, operand=err.operand) from None
    except EvaluationError as err:
        raise EvaluationError(f"{where}: {err.args[0].splitlines()[0].rstrip(':')}", err.problems) from None
    except UnsupportedOpError as err:
        raise UnsupportedOpError(f"node %{node.id} ({op_name}): {err}") from None
    except MemoryError as err:
        raise EvaluationError(f"{where}: out of memory computing its {out} result ({err})") from None
    except Exception as err:
        # Feeds and attributes are validated before this point; anything else a kernel raises
        # still names the node rather than surfacing from deep inside NumPy.
        raise EvaluationError(f"{where}: the reference kernel failed: {type(err).__name__}: {err}") from err
    result = np.asarray(result)
    found = bindings.match(out, result.shape, "result")
    if found:
        bound = ", ".join(f"?{sym}={size}" for sym, size in sorted(bindings.sizes.items()))
        raise ShapeError(
            f"the reference result has shape {list(result.shape)}, but the node declares {node.shape}"
            + (f" (with {bound})" if bound else ""),
            node=node.id, op=op_name, name=node.name,
        )
    if result.ndim != out.rank:
        result = result.reshape((1,) * out.rank)
    if result.dtype != (np.dtype(np.float32) if out.dtype is DType.BF16 else out.dtype.numpy):
        result = to_dtype(result, out.dtype)
    return result


def _check_arguments(graph: object, inputs: object, params: object) -> None:
    if not isinstance(graph, Graph):
        raise GraphError(f"expected an rlx_mil Graph, got {type(graph).__name__}")
    for label, given in (("inputs", inputs), ("params", params)):
        if given is not None and not isinstance(given, Mapping):
            raise EvaluationError(f"{label} must map names to arrays, got {type(given).__name__}")


def _evaluate(
    graph: Graph, inputs: Mapping[str, Any], params: Mapping[str, Any] | None, only: set[int] | None,
    states: dict[int, tuple[np.ndarray, ...]] | None = None, keep: set[int] | None = None,
    visit: tuple[set[int], Callable[[int, np.ndarray], None]] | None = None,
) -> dict[int, np.ndarray]:
    """Every value computed (all of `only`'s nodes, or the graph's). With `keep`, the run holds
    only what is still to be used: a value is dropped after its last use unless kept, and a
    lazy mapping's float params are read at each use (`_bind_feeds`), so a model's weights are
    never all in float32 at once: the run holds one weight at a time beyond its activations.
    `visit` (node ids, callback): each of those values is passed to the callback once computed."""
    given = params or {}
    deferred: dict[int, str] | None = {} if keep is not None else None
    feeds, bindings = _bind_feeds(graph, inputs, given, deferred)
    order = [node for node in graph if only is None or node.id in only]
    last_use: dict[int, int] = {}
    if keep is not None:
        for index, node in enumerate(order):
            last_use.update((i, index) for i in node.inputs)
    values: dict[int, np.ndarray] = {}
    for index, node in enumerate(order):
        if isinstance(node.op, (Input, Param)):
            if deferred and node.id in deferred:
                if keep is not None and node.id in keep:  # an output itself: read now
                    values[node.id] = _read_param(node, deferred[node.id], given)
            else:
                values[node.id] = feeds.pop(node.id)
            continue
        # A deferred param is read for each node that uses it and not held between them (a
        # tied embedding is read again for the head rather than held through every layer).
        read = {i: _read_param(graph.node(i), deferred[i], given) for i in node.inputs if deferred and i in deferred}
        values[node.id] = _run_node(node, [read[i] if i in read else values[i] for i in node.inputs], bindings, states)
        del read
        if visit is not None and node.id in visit[0]:
            visit[1](node.id, values[node.id])
            if keep is not None and node.id not in last_use and node.id not in keep:  # nothing else reads it
                del values[node.id]
        if keep is not None:
            for i in node.inputs:
                if last_use.get(i) == index and i not in keep:
                    values.pop(i, None)
    return values


def evaluate_body(body: Graph, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The outputs of a control-flow body or an expanded region: its Input nodes, in node-id
    order, take `args` positionally (names play no part), each node then runs as in
    `evaluate` (declared dtypes, F16/BF16 rounding at every node)."""
    inputs = [node for node in body if isinstance(node.op, Input)]
    if len(inputs) != len(args):
        raise EvaluationError(f"body {body.name!r} takes {len(inputs)} operands, got {len(args)}")
    bindings = _Bindings()
    values: dict[int, np.ndarray] = {}
    for node, arg in zip(inputs, args, strict=True):
        value = np.asarray(arg)
        if node.shape.is_static and value.shape != node.shape.sizes() and value.size == node.shape.numel():
            value = value.reshape(node.shape.sizes())  # same elements, e.g. [4] bound to [1, 4]
        problems = bindings.match(node.shape, value.shape, f"body {body.name!r} input %{node.id}")
        if problems:
            raise EvaluationError(f"body {body.name!r} received an operand of the wrong shape", problems)
        values[node.id] = to_dtype(value, node.shape.dtype)
    needed = _needed(body, body.outputs)
    for node in body:
        if node.id in values or node.id not in needed:
            continue
        if isinstance(node.op, Param):
            raise EvaluationError(f"body {body.name!r} holds the Param {node.op.name!r}; bodies take weights as operands")
        values[node.id] = _run_node(node, [values[i] for i in node.inputs], bindings)
    return [values[i] for i in body.outputs]


install_body_runner(evaluate_body)


def evaluate(
    graph: Graph, inputs: Mapping[str, Any], params: Mapping[str, Any] | None = None
) -> dict[str, np.ndarray]:
    """Run `graph` with the NumPy reference semantics.

    `inputs` are keyed by Input op names, `params` by Param op names; each value must convert
    to its node's declared dtype (float32 arrays are accepted for integer and bool dtypes) and
    match its declared shape, with equal dynamic symbols bound to equal sizes. Any problem
    raises EvaluationError listing every problem found. The result is keyed by
    `rlx_mil.ir.naming.output_names(graph)`, in output order, followed by the final state of every
    op that writes one back into an input (`rlx_mil.ir.naming.state_outputs`, e.g. `state_out`).
    """
    _check_arguments(graph, inputs, params)
    carried = state_outputs(graph)
    finals: dict[int, tuple[np.ndarray, ...]] = {}
    roots = [*graph.outputs, *(s.node for s in carried)]
    values = _evaluate(graph, inputs or {}, params, _needed(graph, roots), finals, keep=set(roots))
    result = {name: values[node_id] for name, node_id in zip(output_names(graph), graph.outputs, strict=True)}
    for state in carried:
        index = graph.node(state.node).op.carried_operands().index(state.operand)
        result[state.name] = finals[state.node][index]
    return result


def evaluate_all(
    graph: Graph, inputs: Mapping[str, Any], params: Mapping[str, Any] | None = None, *, weights: bool = True,
) -> dict[int, np.ndarray]:
    """Like `evaluate`, but computes every node and returns all values keyed by node id.
    `weights=False` leaves out the float params of a lazy mapping: each is read at its use and
    let go (the run never holds a model's weights in float32 at once)."""
    _check_arguments(graph, inputs, params)
    keep = None if weights else {node.id for node in graph if not isinstance(node.op, Param)}
    return _evaluate(graph, inputs or {}, params, None, keep=keep)


def evaluate_visiting(
    graph: Graph, inputs: Mapping[str, Any], params: Mapping[str, Any] | None, nodes: Iterable[int],
    visit: Callable[[int, np.ndarray], None],
) -> None:
    """Run what the values of `nodes` (node ids) need, passing each to `visit(node id, value)`
    as soon as it is computed. Nothing is kept for the caller: a value is let go after its
    last use, and a lazy mapping's float params are read at each use, so the run holds one
    layer's working set however many nodes are visited (what a statistic over a model's
    activations gathers from, where `evaluate_all` would hold every value of the run)."""
    _check_arguments(graph, inputs, params)
    watched = set(nodes)
    _evaluate(graph, inputs or {}, params, _needed(graph, watched), keep=set(), visit=(watched, visit))


def evaluate_changed(
    graph: Graph, inputs: Mapping[str, Any], params: Mapping[str, Any], base: Mapping[int, np.ndarray],
    changed: Iterable[str],
) -> dict[str, np.ndarray]:
    """`evaluate`'s outputs when only the Params named in `changed` differ from the run that
    gave `base` (`evaluate_all` of the same graph and inputs): a node that depends on none of
    them keeps its value in `base`, so changing one layer's weights recomputes that layer and
    the ones after it. `base` needs no Input or Param values (each run binds its own feeds).
    A graph whose ops carry state runs whole (`evaluate`)."""
    _check_arguments(graph, inputs, params)
    if state_outputs(graph):
        return evaluate(graph, inputs, params)
    names = set(changed)
    # A lazy mapping's float params are read where a recomputed node uses them, not all at once.
    deferred: dict[int, str] = {}
    feeds, bindings = _bind_feeds(graph, inputs or {}, params, deferred)
    needed = _needed(graph, graph.outputs)
    values: dict[int, np.ndarray] = {}
    dirty: set[int] = set()
    for node in graph:
        if node.id not in needed:
            continue
        if isinstance(node.op, (Input, Param)):  # this run's feeds: `base` need not hold the weights
            if node.id not in deferred:
                values[node.id] = feeds[node.id]
            if isinstance(node.op, Param) and node.op.name in names:
                dirty.add(node.id)
        elif not any(i in dirty for i in node.inputs):
            values[node.id] = base[node.id]
        else:
            read = {i: _read_param(graph.node(i), deferred[i], params) for i in node.inputs if i in deferred}
            values[node.id] = _run_node(node, [read[i] if i in read else values[i] for i in node.inputs], bindings)
            del read
            dirty.add(node.id)
    return {name: values[node_id] if node_id not in deferred else _read_param(graph.node(node_id), deferred[node_id], params)
            for name, node_id in zip(output_names(graph), graph.outputs, strict=True)}
