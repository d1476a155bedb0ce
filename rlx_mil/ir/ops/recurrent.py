"""Recurrences over the sequence axis: gated delta rule, selective scan, Mamba-2, LSTM/GRU/RNN
(spec part 2, section 2). Inputs are batch-first; states are held in f32."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from rlx_mil.errors import (
    AttributeValueError,
    DTypeError,
    ShapeError,
)
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import (
    NEWEST_FIELD,
    Op,
    collect_ops,
)
from rlx_mil.ir.serde.codecs import (
    BOOL,
    USIZE,
    struct_form,
)
from rlx_mil.ir.serde.versions import NEWEST
from rlx_mil.ir.shape import Shape, Static
from rlx_mil.ir.shape_checks import (
    conflict,
    require_dims,
    require_int,
    require_numel,
    require_rank,
    size_of,
)


@dataclass(frozen=True)
class GatedDeltaNet(Op):
    """Gated delta rule over `q, k, v [B, S, H, n]`, log-gate `g` (`[B, S, H]`, or per channel
    `[B, S, H, n]`), `beta [B, S, H]` and, with `carry_state`, the initial `state [B, H, n, n]`."""

    type_name: ClassVar[str] = "GatedDeltaNet"
    state_size: int
    carry_state: bool
    #: Newest upstream only; a 0.2.2 document means a scalar gate per head.
    gate_per_channel: bool = field(default=False, metadata=NEWEST_FIELD)

    def arity(self) -> int | None:
        return 6 if self.carry_state else 5

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("q", "k", "v", "g", "beta", *(("state",) if self.carry_state else ()))

    def carried_operands(self) -> tuple[int, ...]:
        return (5,) if self.carry_state else ()


@dataclass(frozen=True)
class SelectiveScan(Op):
    """Mamba-1 scan: `h <- exp(delta*A) h + delta*B*x`, `y = C . h`, over `x, delta [B, S, H]`,
    `a [H, N]`, `b, c [B, S, N]`."""

    type_name: ClassVar[str] = "SelectiveScan"
    state_size: int

    def arity(self) -> int | None:
        return 5

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "delta", "a", "b", "c")


@dataclass(frozen=True)
class Mamba2(Op):
    """Mamba-2 SSD recurrence over `x [B, S, H, P]`, `dt [B, S, H]`, `a [H]`, `b, c [B, S, H, N]`."""

    type_name: ClassVar[str] = "Mamba2"
    head_dim: int
    state_size: int

    def arity(self) -> int | None:
        return 5

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "dt", "a", "b", "c")


@dataclass(frozen=True)
class RnnOp(Op):
    """A PyTorch-style multi-layer (bidirectional) recurrent net over batch-first `x [B, S, I]`
    with flat packed weights; output `[B, S, D*H]`."""

    hidden_size: int
    num_layers: int
    bidirectional: bool
    carry: bool

    GATES: ClassVar[int] = 1
    BIASES: ClassVar[tuple[str, ...]] = ("bias",)
    STATES: ClassVar[tuple[str, ...]] = ("h0",)

    def arity(self) -> int | None:
        return 3 + len(self.BIASES) + (len(self.STATES) if self.carry else 0)

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "w_ih", "w_hh", *self.BIASES, *(self.STATES if self.carry else ()))

    def carried_operands(self) -> tuple[int, ...]:
        first = 3 + len(self.BIASES)
        return tuple(range(first, first + len(self.STATES))) if self.carry else ()


@dataclass(frozen=True)
class Lstm(RnnOp):
    """LSTM, gates i, f, g, o; merged bias `b_ih + b_hh`; `carry` adds `h0, c0 [L*D, B, H]`."""

    type_name: ClassVar[str] = "Lstm"
    GATES: ClassVar[int] = 4
    STATES: ClassVar[tuple[str, ...]] = ("h0", "c0")


@dataclass(frozen=True)
class Gru(RnnOp):
    """GRU, gates r, z, n; separate `b_ih` and `b_hh`; `carry` adds `h0`."""

    type_name: ClassVar[str] = "Gru"
    GATES: ClassVar[int] = 3
    BIASES: ClassVar[tuple[str, ...]] = ("b_ih", "b_hh")


@dataclass(frozen=True)
class Rnn(RnnOp):
    """Elman RNN: `h' = act(x W_ih^T + h W_hh^T + b)`, act = relu if `relu` else tanh."""

    type_name: ClassVar[str] = "Rnn"
    relu: bool = False


# -------------------------------------------------------------------------------- shape rules


def _require_f32(shapes: Sequence[Shape], roles: Sequence[str], op: str) -> None:
    for shape, role in zip(shapes, roles, strict=True):
        if shape.dtype is not DType.F32:
            raise DTypeError(f"{op} needs F32 inputs, got {shape.dtype.value} for {role}", operand=role)


@shape_rule(GatedDeltaNet)
def _gated_delta_net(op: GatedDeltaNet, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    roles = op.roles(len(ins)) or ()
    _require_f32(ins, roles, "GatedDeltaNet")
    n = require_int(op.state_size, "state_size", minimum=1)
    q = ins[0]
    require_rank(q, "q", exact=(4,))
    b, s, h, width = q.dims
    if conflict(width, Static(n)):
        raise ShapeError(f"q {q} must be [B, S, H, state_size={n}]", operand="q")
    for role in ("k", "v"):
        require_dims(ins[roles.index(role)], q.dims, role, "q's shape")
    gate_dims = (b, s, h, Static(n)) if op.gate_per_channel else (b, s, h)
    require_dims(ins[3], gate_dims, "g", "[B, S, H(, n)] =")
    require_dims(ins[4], (b, s, h), "beta", "[B, S, H] =")
    if op.carry_state:
        require_dims(ins[5], (b, h, Static(n), Static(n)), "state", "[B, H, n, n] =")
    return q


@shape_rule(SelectiveScan)
def _selective_scan(op: SelectiveScan, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    _require_f32(ins, ("x", "delta", "a", "b", "c"), "SelectiveScan")
    x, delta, a, bm, cm = ins
    require_rank(x, "x", exact=(3,))
    batch, seq, h = x.dims
    require_dims(delta, x.dims, "delta", "x's shape")
    require_rank(a, "a", exact=(2,))
    require_dims(a, (h, a.dims[1]), "a", "[H, N] =")
    if conflict(a.dims[1], Static(require_int(op.state_size, "state_size", minimum=1))):
        raise ShapeError(f"a {a} must have N = state_size = {op.state_size} columns", operand="a")
    for role, t in (("b", bm), ("c", cm)):
        require_dims(t, (batch, seq, a.dims[1]), role, "[B, S, N] =")
    return x


@shape_rule(Mamba2)
def _mamba2(op: Mamba2, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    _require_f32(ins, ("x", "dt", "a", "b", "c"), "Mamba2")
    x, dt, a, bm, cm = ins
    require_rank(x, "x", exact=(4,))
    batch, seq, h, p = x.dims
    if conflict(p, Static(require_int(op.head_dim, "head_dim", minimum=1))):
        raise ShapeError(f"x {x} must be [B, S, H, head_dim={op.head_dim}]", operand="x")
    n = Static(require_int(op.state_size, "state_size", minimum=1))
    require_dims(dt, (batch, seq, h), "dt", "[B, S, H] =")
    require_dims(a, (h,), "a", "[H] =")
    for role, t in (("b", bm), ("c", cm)):
        require_dims(t, (batch, seq, h, n), role, "[B, S, H, N] =")
    return x


def _rnn(op: RnnOp, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    roles = op.roles(len(ins)) or ()
    _require_f32(ins, roles, op.type_name)
    hidden = require_int(op.hidden_size, "hidden_size", minimum=1)
    layers = require_int(op.num_layers, "num_layers", minimum=1)
    directions = 2 if op.bidirectional else 1
    x = ins[0]
    require_rank(x, "x", exact=(3,))
    batch, _, features = x.dims
    i_size = size_of(features)
    gates = op.GATES * hidden
    if i_size is not None:
        # Weights are flat packed blocks per (layer, direction); their element counts are fixed.
        w_ih = sum(gates * (i_size if layer == 0 else directions * hidden) for layer in range(layers)) * directions
        require_numel(ins[1], w_ih, "w_ih", "the packed input weights")
    require_numel(ins[2], layers * directions * gates * hidden, "w_hh", "the packed hidden weights")
    for role in op.BIASES:
        require_numel(ins[roles.index(role)], layers * directions * gates, role, "the packed biases")
    if op.carry:
        for role in op.STATES:
            require_dims(ins[roles.index(role)], (Static(layers * directions), batch, Static(hidden)), role,
                         "[L*D, B, H] =")
    return Shape((x.dims[0], x.dims[1], Static(directions * hidden)), x.dtype)


shape_rule(Lstm)(_rnn)
shape_rule(Gru)(_rnn)
shape_rule(Rnn)(_rnn)


# -------------------------------------------------------------------------------- builder


class RecurrentBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def gated_delta_net(
        self, q: int, k: int, v: int, g: int, beta: int, state_size: int, state: int | None = None,
        gate_per_channel: bool = False, *, name: str | None = None,
    ) -> int:
        """Gated delta rule; `state` (the carried `[B, H, n, n]`) sets carry_state."""
        op = GatedDeltaNet(state_size, state is not None, gate_per_channel)
        return self.add_node(op, [q, k, v, g, beta, *([] if state is None else [state])], name=name)

    def selective_scan(self, x: int, delta: int, a: int, b: int, c: int, state_size: int, *, name: str | None = None) -> int:
        return self.add_node(SelectiveScan(state_size), [x, delta, a, b, c], name=name)

    def mamba2(
        self, x: int, dt: int, a: int, b: int, c: int, head_dim: int, state_size: int, *, name: str | None = None
    ) -> int:
        return self.add_node(Mamba2(head_dim, state_size), [x, dt, a, b, c], name=name)

    def lstm(
        self, x: int, w_ih: int, w_hh: int, bias: int, hidden_size: int, num_layers: int = 1,
        bidirectional: bool = False, h0: int | None = None, c0: int | None = None, *, name: str | None = None,
    ) -> int:
        """PyTorch-style LSTM (batch first, packed weights, merged bias); h0/c0 set carry."""
        if (h0 is None) != (c0 is None):
            raise self._fail(AttributeValueError, "h0 and c0 must be given together", "Lstm", name)
        op = Lstm(hidden_size, num_layers, bidirectional, h0 is not None)
        states = [] if h0 is None else [h0, c0]
        return self.add_node(op, [x, w_ih, w_hh, bias, *states], name=name)  # type: ignore[list-item]

    def gru(
        self, x: int, w_ih: int, w_hh: int, b_ih: int, b_hh: int, hidden_size: int, num_layers: int = 1,
        bidirectional: bool = False, h0: int | None = None, *, name: str | None = None,
    ) -> int:
        """PyTorch-style GRU (batch first, packed weights); h0 sets carry."""
        op = Gru(hidden_size, num_layers, bidirectional, h0 is not None)
        return self.add_node(op, [x, w_ih, w_hh, b_ih, b_hh, *([] if h0 is None else [h0])], name=name)

    def rnn(
        self, x: int, w_ih: int, w_hh: int, bias: int, hidden_size: int, num_layers: int = 1,
        bidirectional: bool = False, h0: int | None = None, relu: bool = False, *, name: str | None = None,
    ) -> int:
        """PyTorch-style Elman RNN (tanh, or relu); h0 sets carry."""
        op = Rnn(hidden_size, num_layers, bidirectional, h0 is not None, relu)
        return self.add_node(op, [x, w_ih, w_hh, bias, *([] if h0 is None else [h0])], name=name)


#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    struct_form(GatedDeltaNet, ("state_size", USIZE), ("carry_state", BOOL), ("gate_per_channel", BOOL), newest_fields=(("gate_per_channel", False),)),
    struct_form(SelectiveScan, ("state_size", USIZE)),
    struct_form(Mamba2, ("head_dim", USIZE), ("state_size", USIZE), since=NEWEST),
    struct_form(Lstm, ("hidden_size", USIZE), ("num_layers", USIZE), ("bidirectional", BOOL), ("carry", BOOL), since=NEWEST),
    struct_form(Gru, ("hidden_size", USIZE), ("num_layers", USIZE), ("bidirectional", BOOL), ("carry", BOOL), since=NEWEST),
    struct_form(Rnn, ("hidden_size", USIZE), ("num_layers", USIZE), ("bidirectional", BOOL), ("carry", BOOL), ("relu", BOOL), since=NEWEST),
)
