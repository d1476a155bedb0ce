"""Control flow and fused regions (spec part 2, section 7). Bodies are complete graphs whose
Input nodes, in node-id order, bind to the operands positionally."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from rlx_mil.errors import (
    AttributeValueError,
    ShapeError,
)
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.node import GraphValue, Node
from rlx_mil.ir.op_base import (
    NEWEST_FIELD,
    Op,
    collect_ops,
)
from rlx_mil.ir.ops.elementwise import ActivationKind, BinaryOp, CmpOp
from rlx_mil.ir.serde.codecs import (
    BOOL,
    DTYPE,
    MISSING,
    SUBGRAPH,
    U32,
    USIZE,
    USIZE_VEC,
    Codec,
    EnumCodec,
    OptionCodec,
    VecCodec,
    describe,
    did_you_mean,
    fail,
    json_array,
    struct_form,
    tagged,
)
from rlx_mil.ir.serde.versions import NEWEST, newest_only
from rlx_mil.ir.shape import DimLike, Shape, Static
from rlx_mil.ir.shape_checks import (
    conflict,
    fits_into,
    numel,
    require_int,
    require_rank,
)

#: How deeply bodies may nest (a body holding an If holding a body ...). Upstream graphs nest
#: one or two levels; the bound keeps hostile graphs from exhausting the stack of the
#: recursive checks, the reference and the lowering.
MAX_SUBGRAPH_DEPTH = 16


def body_inputs(body: GraphValue) -> list[Node]:
    """The Input nodes of a body, in node-id order: they bind to the operands positionally."""
    return [node for node in body.nodes if node.op.type_name == "Input"]


def nested_bodies(op: Op) -> list[GraphValue]:
    """The graphs `op` holds as attributes (none for ops without bodies)."""
    return [value for value in vars(op).values() if isinstance(value, GraphValue)]


def subgraph_depth(body: GraphValue) -> int:
    """1 for a body without control flow inside, 2 for a body holding one, ...

    Each distinct body is measured once: a body shared by both branches of an If (or by
    several levels) would otherwise be walked once per path to it, 2**depth times."""
    depths: dict[int, int] = {}

    def depth(graph: GraphValue) -> int:
        key = id(graph)
        if key not in depths:
            inner = [depth(b) for node in graph.nodes for b in nested_bodies(node.op)]
            depths[key] = 1 + max(inner, default=0)
        return depths[key]

    return depth(body)


def _check_body(body: object, role: str, operands: Sequence[Shape], outputs: int | None = None) -> GraphValue:
    """`body` must be a graph taking `operands` (shapes checked) with at least one output."""
    if not isinstance(body, GraphValue):
        raise AttributeValueError(f"{role} must be a graph, got {type(body).__name__}")
    depth = subgraph_depth(body)
    if depth > MAX_SUBGRAPH_DEPTH:
        raise AttributeValueError(f"{role} nests bodies {depth} deep, more than the {MAX_SUBGRAPH_DEPTH} rlx_mil accepts")
    inputs = body_inputs(body)
    if len(inputs) != len(operands):
        raise ShapeError(f"{role} has {len(inputs)} Input nodes but receives {len(operands)} operands")
    for i, (node, shape) in enumerate(zip(inputs, operands, strict=True)):
        if not node.shape.same_elements_as(shape) or node.shape.dtype is not shape.dtype:
            raise ShapeError(f"{role} input {i} is declared {node.shape} but receives {shape}")
    if any(node.op.type_name == "Param" for node in body.nodes):
        raise AttributeValueError(f"{role} holds Param nodes; bodies take their weights as operands")
    if not body.outputs:
        raise ShapeError(f"{role} has no outputs")
    if outputs is not None and len(body.outputs) != outputs:
        raise ShapeError(f"{role} must have {outputs} outputs, has {len(body.outputs)}")
    return body


def _output_shape(body: GraphValue, index: int = 0) -> Shape:
    return body.nodes[body.outputs[index]].shape


@dataclass(frozen=True)
class If(Op):
    """`then_branch(captures)` if `pred` (non-zero) else `else_branch(captures)`; inputs
    `[pred, captures...]`; the first output of the branch taken."""

    type_name: ClassVar[str] = "If"
    then_branch: GraphValue
    else_branch: GraphValue

    def arity(self) -> int | None:
        return None


@dataclass(frozen=True)
class While(Op):
    """`it = 0; while it < max_iterations and cond(c): c = body(c)`; result `c[0]`."""

    type_name: ClassVar[str] = "While"
    cond: GraphValue
    body: GraphValue
    max_iterations: int | None

    def arity(self) -> int | None:
        return None


@dataclass(frozen=True)
class Scan(Op):
    """`lax.scan` without per-step outputs: inputs `[init, bcast..., xs...]`, the body maps
    `(carry, *bcast, *x_t)` to the next carry; the result is the final carry, or with
    `save_trajectory` every carry stacked `[length, *carry]`."""

    type_name: ClassVar[str] = "Scan"
    body: GraphValue
    length: int
    save_trajectory: bool
    num_bcast: int
    num_xs: int
    num_checkpoints: int

    def arity(self) -> int | None:
        return 1 + self.num_bcast + self.num_xs


class ChainSource(enum.Enum):
    INPUT = "Input"
    STEP = "Step"


@dataclass(frozen=True)
class ChainOperand:
    """A region input (`Input(i)`) or the result of an earlier step (`Step(j)`)."""

    source: ChainSource
    index: int


@dataclass(frozen=True)
class ChainStep:
    """One element-wise step: `kind` is Activation / Cast / Binary / Compare / Where, `attr` its
    ActivationKind / DType / BinaryOp / CmpOp (None for Where)."""

    kind: str
    attr: ActivationKind | DType | BinaryOp | CmpOp | None
    operands: tuple[ChainOperand, ...]


class RegionPrologue(enum.Enum):
    NONE = "None"
    RESIZE_NEAREST_2X = "ResizeNearest2x"


newest_only(RegionPrologue.RESIZE_NEAREST_2X)


@dataclass(frozen=True)
class ElementwiseRegion(Op):
    """A fused chain of element-wise steps evaluated over the declared output shape."""

    type_name: ClassVar[str] = "ElementwiseRegion"
    chain: tuple[ChainStep, ...]
    num_inputs: int
    scalar_input_mask: int
    input_modulus: tuple[int, ...]
    prologue: RegionPrologue = field(default=RegionPrologue.NONE, metadata=NEWEST_FIELD)
    prologue_input: int = field(default=0, metadata=NEWEST_FIELD)

    def arity(self) -> int | None:
        return self.num_inputs if isinstance(self.num_inputs, int) and self.num_inputs >= 1 else None


@dataclass(frozen=True)
class BatchElementwiseRegion(Op):
    """One chain over `num_batch_inputs` planes (upstream's horizontal fusion of N single-input
    ElementwiseRegions on axis-0 slices of one tensor whose results were concatenated): each
    plane is the chain's `Input(0)`; the value is the planes' results concatenated on axis 0."""

    type_name: ClassVar[str] = "BatchElementwiseRegion"
    chain: tuple[ChainStep, ...]
    num_batch_inputs: int
    scalar_input_mask: int
    input_modulus: tuple[int, ...]
    prologue: RegionPrologue = RegionPrologue.NONE
    prologue_input: int = 0

    def arity(self) -> int | None:
        n = self.num_batch_inputs
        return n if isinstance(n, int) and n >= 1 else None


_STEP_OPERANDS = {"Activation": 1, "Cast": 1, "Binary": 2, "Compare": 2, "Where": 3}
_STEP_ATTRS: dict[str, type | None] = {
    "Activation": ActivationKind, "Cast": DType, "Binary": BinaryOp, "Compare": CmpOp, "Where": None,
}


# -------------------------------------------------------------------------------- shape rules


@shape_rule(If)
def _if(op: If, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    captures = list(ins[1:])
    then_branch = _check_body(op.then_branch, "then_branch", captures)
    else_branch = _check_body(op.else_branch, "else_branch", captures)
    out, other = _output_shape(then_branch), _output_shape(else_branch)
    if not out.same_elements_as(other) or out.dtype is not other.dtype:
        raise ShapeError(f"the branches produce {out} and {other}; they must agree")
    if not fits_into(ins[0].dims, out.dims):
        raise ShapeError(f"pred {ins[0]} does not broadcast onto the output {out}", operand="inputs[0]")
    return out


@shape_rule(While)
def _while(op: While, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    if op.max_iterations is None:
        raise AttributeValueError("max_iterations is required (an unbounded loop cannot be lowered)")
    require_int(op.max_iterations, "max_iterations", minimum=0)
    cond = _check_body(op.cond, "cond", ins, outputs=1)
    flag = _output_shape(cond)
    if flag.dtype is not DType.BOOL or numel(flag.dims) not in (None, 1):
        raise ShapeError(f"cond must produce a Bool scalar, produces {flag}")
    body = _check_body(op.body, "body", ins, outputs=len(ins))
    for i, shape in enumerate(ins):
        nxt = _output_shape(body, i)
        if not nxt.same_elements_as(shape) or nxt.dtype is not shape.dtype:
            raise ShapeError(f"body output {i} is {nxt} but carried value {i} is {shape}")
    return ins[0]


@shape_rule(Scan)
def _scan(op: Scan, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    length = require_int(op.length, "length", minimum=0)
    require_int(op.num_bcast, "num_bcast", minimum=0)
    require_int(op.num_xs, "num_xs", minimum=0)
    if op.num_checkpoints not in (0, length):
        raise AttributeValueError(f"num_checkpoints must be 0 or length={length}, got {op.num_checkpoints}")
    carry, bcast, xs = ins[0], list(ins[1:1 + op.num_bcast]), list(ins[1 + op.num_bcast:])
    steps: list[Shape] = []
    for i, x in enumerate(xs):
        operand = f"inputs[{1 + op.num_bcast + i}]"
        require_rank(x, operand, minimum=1)
        if conflict(x.dims[0], Static(length)):
            raise ShapeError(f"xs {i} {x} must have length={length} rows", operand=operand)
        steps.append(Shape(x.dims[1:], x.dtype))
    body = _check_body(op.body, "body", [carry, *bcast, *steps], outputs=1)
    nxt = _output_shape(body)
    if not nxt.same_elements_as(carry) or nxt.dtype is not carry.dtype:
        raise ShapeError(f"the body maps the carry {carry} to {nxt}; they must agree")
    return Shape((Static(length), *carry.dims), carry.dtype) if op.save_trajectory else carry


@shape_rule(ElementwiseRegion)
def _elementwise_region(op: ElementwiseRegion, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    n = require_int(op.num_inputs, "num_inputs", minimum=1)
    if n > 16:
        raise AttributeValueError(f"a region takes at most 16 inputs, got {n}")
    _check_chain(op.chain, n)
    if op.prologue is RegionPrologue.RESIZE_NEAREST_2X and not 0 <= op.prologue_input < n:
        raise AttributeValueError(f"prologue_input {op.prologue_input} is not a region input")
    if declared is None:
        raise ShapeError("a region's output shape is its declared shape: pass shape=")
    return None


@shape_rule(BatchElementwiseRegion)
def _batch_elementwise_region(op: BatchElementwiseRegion, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    n = require_int(op.num_batch_inputs, "num_batch_inputs", minimum=1)
    _check_chain(op.chain, 1)
    if op.prologue_input != 0:
        raise AttributeValueError(f"prologue_input {op.prologue_input} is not 0: each plane has one input")
    for i, shape in enumerate(ins[1:], start=1):
        if shape != ins[0]:
            raise ShapeError(f"plane {i} is {shape} but plane 0 is {ins[0]}; the planes must agree", operand=f"inputs[{i}]")
    if declared is None:
        raise ShapeError("a region's output shape is its declared shape: pass shape=")
    require_rank(declared, "the declared shape", minimum=1)
    first = declared.dims[0]
    if isinstance(first, Static) and first.size % n:
        raise ShapeError(f"the declared {declared} does not split into {n} planes along axis 0")
    return None


def _check_chain(chain: Sequence[ChainStep], n: int) -> None:
    """Each step a known kind with its attribute, reading inputs below `n` or earlier steps."""
    if not chain or len(chain) > 32:
        raise AttributeValueError(f"a region chain holds 1 to 32 steps, got {len(chain)}")
    for k, step in enumerate(chain):
        if not isinstance(step, ChainStep) or step.kind not in _STEP_OPERANDS:
            raise AttributeValueError(f"chain[{k}] is not an Activation, Cast, Binary, Compare or Where step")
        attr_type = _STEP_ATTRS[step.kind]
        if (attr_type is None) != (step.attr is None) or (attr_type is not None and not isinstance(step.attr, attr_type)):
            raise AttributeValueError(f"chain[{k}] ({step.kind}) has the attribute {step.attr!r}")
        if len(step.operands) != _STEP_OPERANDS[step.kind]:
            raise AttributeValueError(f"chain[{k}] ({step.kind}) takes {_STEP_OPERANDS[step.kind]} operands")
        for operand in step.operands:
            limit = n if operand.source is ChainSource.INPUT else k
            if not 0 <= operand.index < limit:
                raise AttributeValueError(f"chain[{k}] reads {operand.source.value}({operand.index}), which does not exist")


# -------------------------------------------------------------------------------- builder


@dataclass(frozen=True)
class CustomFn(Op):
    """A user sub-graph: the value is `fwd_body(inputs)` (its first output); `vjp_body` and
    `jvp_body` are differentiation rules, carried but not evaluated (newest upstream only)."""

    type_name: ClassVar[str] = "CustomFn"
    fwd_body: GraphValue
    vjp_body: GraphValue | None
    jvp_body: GraphValue | None
    num_inputs: int

    def arity(self) -> int | None:
        return self.num_inputs if isinstance(self.num_inputs, int) and self.num_inputs >= 0 else None


@dataclass(frozen=True)
class TransformRegion(Op):
    """A fused chain of resampling steps (each `ResizeNearest2x` of a region input or an earlier
    step's result); the value is the last step's (newest upstream only)."""

    type_name: ClassVar[str] = "TransformRegion"
    steps: tuple[ChainOperand, ...]
    num_inputs: int

    def arity(self) -> int | None:
        return self.num_inputs if isinstance(self.num_inputs, int) and self.num_inputs >= 1 else None


@shape_rule(CustomFn)
def _custom_fn(op: CustomFn, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    if op.num_inputs != len(ins):
        raise AttributeValueError(f"num_inputs is {op.num_inputs} but the node has {len(ins)} inputs")
    body = _check_body(op.fwd_body, "fwd_body", ins)
    for role in ("vjp_body", "jvp_body"):
        value = getattr(op, role)
        if value is not None and not isinstance(value, GraphValue):
            raise AttributeValueError(f"{role} must be a graph or null, got {type(value).__name__}")
    return _output_shape(body)


def transform_shapes(op: TransformRegion, ins: Sequence[Shape]) -> list[Shape]:
    """The shape after each step (NCHW, H and W doubled)."""
    if not op.steps:
        raise AttributeValueError("TransformRegion needs at least one step")
    done: list[Shape] = []
    for i, operand in enumerate(op.steps):
        if not isinstance(operand, ChainOperand):
            raise AttributeValueError(f"steps[{i}] must be a ResizeNearest2x of a ChainOperand, got {operand!r}")
        limit = len(ins) if operand.source is ChainSource.INPUT else i
        if not 0 <= operand.index < limit:
            raise AttributeValueError(f"steps[{i}] reads {operand.source.value}({operand.index}), outside [0, {limit})")
        src = ins[operand.index] if operand.source is ChainSource.INPUT else done[operand.index]
        if src.rank != 4:
            raise ShapeError(f"steps[{i}] resizes {src}; ResizeNearest2x takes NCHW tensors")
        n, c, h, w = src.dims
        grow = [Static(d.size * 2) if isinstance(d, Static) else d for d in (h, w)]
        done.append(Shape((n, c, *grow), src.dtype))
    return done


@shape_rule(TransformRegion)
def _transform_region(op: TransformRegion, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return transform_shapes(op, ins)[-1]


class ControlBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def if_(self, pred: int, then_branch: GraphValue, else_branch: GraphValue, captures: Sequence[int] = (),
            *, name: str | None = None) -> int:
        """`then_branch(*captures)` if pred else `else_branch(*captures)` (first outputs)."""
        return self.add_node(If(then_branch, else_branch), [pred, *captures], name=name)

    def while_(self, cond: GraphValue, body: GraphValue, carried: Sequence[int], max_iterations: int,
               *, name: str | None = None) -> int:
        """Loop `body` over the carried values while `cond` holds, at most `max_iterations` times."""
        return self.add_node(While(cond, body, max_iterations), list(carried), name=name)

    def scan(self, body: GraphValue, init: int, xs: Sequence[int], length: int, bcast: Sequence[int] = (),
             save_trajectory: bool = False, *, name: str | None = None) -> int:
        """Fold `body` over the rows of `xs` starting from `init`."""
        op = Scan(body, length, save_trajectory, len(bcast), len(xs), 0)
        return self.add_node(op, [init, *bcast, *xs], name=name)

    def custom_fn(self, fwd_body: GraphValue, inputs: Sequence[int], vjp_body: GraphValue | None = None,
                  jvp_body: GraphValue | None = None, *, name: str | None = None) -> int:
        """`fwd_body(*inputs)` (its first output); the AD bodies are carried along."""
        return self.add_node(CustomFn(fwd_body, vjp_body, jvp_body, len(inputs)), list(inputs), name=name)

    def transform_region(self, steps: Sequence[tuple[str, int]], inputs: Sequence[int], *,
                         name: str | None = None) -> int:
        """Nearest 2x resizes: each step `("Input", i)` or `("Step", j)`; the last step's value."""
        chain = tuple(ChainOperand(ChainSource(src), idx) for src, idx in steps)
        return self.add_node(TransformRegion(chain, len(inputs)), list(inputs), name=name)

    def elementwise_region(
        self, inputs: Sequence[int], chain: Sequence[ChainStep], shape: Sequence[DimLike], dtype: DType | str = "f32",
        *, name: str | None = None,
    ) -> int:
        """A fused element-wise region over `inputs` producing `shape`."""
        declared = self._shape_arg(shape, dtype, "ElementwiseRegion", name)
        op = ElementwiseRegion(tuple(chain), len(inputs), 0, (0,) * 16)
        return self.add_node(op, list(inputs), declared, name=name)

    def batch_elementwise_region(
        self, planes: Sequence[int], chain: Sequence[ChainStep], resize_prologue: bool = False,
        dtype: DType | str | None = None, *, name: str | None = None,
    ) -> int:
        """`chain` on each plane (its `Input(0)`, nearest-2x resized first with `resize_prologue`),
        the results concatenated on axis 0; the result type is the planes' unless `dtype` says."""
        op_name = "BatchElementwiseRegion"
        if not planes or not self._is_node_id(planes[0]) or not self._nodes[planes[0]].shape.is_static:
            raise self._fail(ShapeError, "the planes must be existing nodes of static shape", op_name, name)
        plane = self._nodes[planes[0]].shape
        dims = list(plane.sizes())
        if resize_prologue:
            dims[2:] = [d * 2 for d in dims[2:]]
        dims[0] *= len(planes)
        declared = self._shape_arg(dims, dtype or plane.dtype, op_name, name)
        prologue = RegionPrologue.RESIZE_NEAREST_2X if resize_prologue else RegionPrologue.NONE
        op = BatchElementwiseRegion(tuple(chain), len(planes), 0, (0,) * 16, prologue, 0)
        return self.add_node(op, list(planes), declared, name=name)


class ChainOperandCodec(Codec):
    def decode(self, value: object, path: str) -> ChainOperand:
        tag, content = tagged(value, path, "a ChainOperand")
        source = next((s for s in ChainSource if s.value == tag), None)
        if source is None or content is MISSING:
            fail(path, f'expected {{"Input": i}} or {{"Step": j}}, got {describe(value)}')
        return ChainOperand(source, USIZE.decode(content, f"{path}.{tag}"))

    def encode(self, value: object, path: str) -> object:
        if not isinstance(value, ChainOperand):
            fail(path, f"expected a ChainOperand, got {value!r}")
        return {value.source.value: USIZE.encode(value.index, f"{path}.{value.source.value}")}


_OPERAND = ChainOperandCodec()


class TransformStepCodec(Codec):
    """`{"ResizeNearest2x": {"Input": i}}` (upstream's only TransformStep)."""

    def decode(self, value: object, path: str) -> ChainOperand:
        tag, content = tagged(value, path, "a TransformStep")
        if tag != "ResizeNearest2x" or content is MISSING:
            fail(path, f'expected {{"ResizeNearest2x": operand}}, got {describe(value)}')
        return _OPERAND.decode(content, f"{path}.ResizeNearest2x")

    def encode(self, value: object, path: str) -> object:
        return {"ResizeNearest2x": _OPERAND.encode(value, f"{path}.ResizeNearest2x")}
_ATTR_CODECS: dict[str, Codec] = {
    "Activation": EnumCodec(ActivationKind, "Activation"), "Cast": DTYPE,
    "Binary": EnumCodec(BinaryOp, "BinaryOp"), "Compare": EnumCodec(CmpOp, "CmpOp"),
}


class ChainStepCodec(Codec):
    """`{"Binary": ["Add", {"Input": 0}, {"Step": 1}]}`: a tuple variant, serialised as an array."""

    def decode(self, value: object, path: str) -> ChainStep:
        tag, content = tagged(value, path, "a ChainStep")
        if tag not in _STEP_OPERANDS:
            fail(path, f"unknown ChainStep variant {describe(tag)}{did_you_mean(tag, _STEP_OPERANDS)}")
        items = json_array(content, f"{path}.{tag}")
        codec = _ATTR_CODECS.get(tag)
        want = _STEP_OPERANDS[tag] + (codec is not None)
        if len(items) != want:
            fail(f"{path}.{tag}", f"expected {want} entries, got {len(items)}")
        attr = codec.decode(items[0], f"{path}.{tag}[0]") if codec is not None else None
        first = 1 if codec is not None else 0
        operands = tuple(_OPERAND.decode(item, f"{path}.{tag}[{first + i}]") for i, item in enumerate(items[first:]))
        return ChainStep(tag, attr, operands)  # type: ignore[arg-type]

    def encode(self, value: object, path: str) -> object:
        if not isinstance(value, ChainStep) or value.kind not in _STEP_OPERANDS:
            fail(path, f"expected a ChainStep, got {value!r}")
        codec = _ATTR_CODECS.get(value.kind)
        head = [] if codec is None else [codec.encode(value.attr, f"{path}.{value.kind}[0]")]
        operands = [_OPERAND.encode(o, f"{path}.{value.kind}[{len(head) + i}]") for i, o in enumerate(value.operands)]
        return {value.kind: [*head, *operands]}


#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    struct_form(If, ("then_branch", SUBGRAPH), ("else_branch", SUBGRAPH)),
    struct_form(While, ("cond", SUBGRAPH), ("body", SUBGRAPH), ("max_iterations", OptionCodec(USIZE))),
    struct_form(Scan, ("body", SUBGRAPH), ("length", U32), ("save_trajectory", BOOL), ("num_bcast", U32), ("num_xs", U32), ("num_checkpoints", U32)),
    struct_form(CustomFn, ("fwd_body", SUBGRAPH), ("vjp_body", OptionCodec(SUBGRAPH)), ("jvp_body", OptionCodec(SUBGRAPH)),
                ("num_inputs", U32), since=NEWEST),
    struct_form(TransformRegion, ("steps", VecCodec(TransformStepCodec())), ("num_inputs", U32), since=NEWEST),
    struct_form(ElementwiseRegion, ("chain", VecCodec(ChainStepCodec())), ("num_inputs", USIZE), ("scalar_input_mask", U32), ("input_modulus", USIZE_VEC), ("prologue", EnumCodec(RegionPrologue, "RegionPrologue")), ("prologue_input", USIZE), newest_fields=(("prologue", RegionPrologue.NONE), ("prologue_input", 0))),
    struct_form(BatchElementwiseRegion, ("chain", VecCodec(ChainStepCodec())), ("num_batch_inputs", U32), ("scalar_input_mask", U32), ("input_modulus", USIZE_VEC), ("prologue", EnumCodec(RegionPrologue, "RegionPrologue")), ("prologue_input", U32), since=NEWEST),
)
