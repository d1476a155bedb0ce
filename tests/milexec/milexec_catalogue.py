"""Small MIL programs, one or more per op type, for checking milexec kernels against coremltools'
value_inference in fp32 and fp16.

Each case is a function of a :class:`Floats` (the float dtype under test plus a seeded RNG) that
returns the feeds and a builder turning the placeholder vars into output vars.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Builder = Callable[[dict[str, Any]], list[Any]]


@dataclass
class Floats:
    dtype: np.dtype
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    def __call__(self, value: Any) -> np.ndarray:
        return np.asarray(value, dtype=self.dtype)

    def scalar(self, value: float) -> np.generic:
        return self.dtype.type(value)

    def uniform(self, shape: tuple[int, ...], low: float = -2.0, high: float = 2.0) -> np.ndarray:
        return self.rng.uniform(low, high, size=shape).astype(self.dtype)

    def ints(self, shape: tuple[int, ...], low: int, high: int) -> np.ndarray:
        return self.rng.integers(low, high, size=shape).astype(np.int32)

    def bools(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.rng.random(shape) < 0.5


@dataclass(frozen=True)
class Case:
    op_type: str
    opset: str  # attribute of ct.target
    make: Callable[[Floats], tuple[dict[str, np.ndarray], Builder]]
    label: str = ""


CASES: list[Case] = []

#: Op types with value_inference that the catalogue deliberately leaves out, and why.
EXCLUDED: dict[str, str] = {
    "const": "not executed as an op: the executor reads const values directly",
    "_const_symbolic": "internal to coremltools' symbolic shape inference, never in a saved program",
    "list_length": "list ops (make_list / list_*) are not supported by the executor",
    "reverse_sequence": "its value_inference raises NotImplementedError('TODO'); tested against NumPy instead",
}


def case(op_type: str, opset: str = "iOS18", label: str = "") -> Callable[[Any], Any]:
    def register(make: Callable[[Floats], tuple[dict[str, np.ndarray], Builder]]) -> Any:
        CASES.append(Case(op_type, opset, make, label or op_type))
        return make

    return register


def _mb() -> Any:
    from coremltools.converters.mil import Builder as mb

    return mb


# -- elementwise unary -----------------------------------------------------------------------

_UNARY_DOMAINS: dict[str, tuple[float, float]] = {
    "abs": (-3, 3),
    "acos": (-0.9, 0.9),
    "asin": (-0.9, 0.9),
    "atan": (-3, 3),
    "atanh": (-0.9, 0.9),
    "ceil": (-3, 3),
    "cos": (-3, 3),
    "cosh": (-3, 3),
    "erf": (-3, 3),
    "exp": (-3, 3),
    "exp2": (-3, 3),
    "floor": (-3, 3),
    "inverse": (0.5, 3),
    "log": (0.1, 3),
    "round": (-3, 3),
    "rsqrt": (0.1, 3),
    "sign": (-3, 3),
    "sin": (-3, 3),
    "sinh": (-3, 3),
    "sqrt": (0.0, 3),
    "square": (-3, 3),
    "tan": (-1.2, 1.2),
    "tanh": (-3, 3),
    "relu": (-3, 3),
    "relu6": (-3, 9),
    "sigmoid": (-6, 6),
    "softplus": (-6, 6),
    "softsign": (-6, 6),
}


def _unary_case(op_type: str, low: float, high: float) -> None:
    @case(op_type)
    def make(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
        x = f.uniform((2, 3, 4), low, high)
        if op_type == "round":
            x.reshape(-1)[:6] = f([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5])
        if op_type == "sign":
            x.reshape(-1)[0] = 0
        return {"x": x}, lambda v: [getattr(_mb(), op_type)(x=v["x"])]


for _op, (_low, _high) in _UNARY_DOMAINS.items():
    _unary_case(_op, _low, _high)


@case("abs", label="abs_int32")
def _abs_int(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.ints((3, 4), -9, 9)}, lambda v: [_mb().abs(x=v["x"])]


@case("logical_not")
def _logical_not(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.bools((3, 4))}, lambda v: [_mb().logical_not(x=v["x"])]


@case("clip")
def _clip(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((3, 5))}, lambda v: [
        _mb().clip(x=v["x"], alpha=f.scalar(-0.5), beta=f.scalar(1.0))
    ]


@case("threshold")
def _threshold(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((3, 5))}, lambda v: [_mb().threshold(x=v["x"], alpha=f.scalar(0.25))]


@case("inverse", label="inverse_epsilon")
def _inverse_eps(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((3, 5), 0.5, 2)}, lambda v: [_mb().inverse(x=v["x"], epsilon=f.scalar(0.125))]


# -- activations -----------------------------------------------------------------------------


def _alpha_beta_case(op_type: str, alpha: float | None, beta: float | None) -> None:
    @case(op_type)
    def make(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
        params = {}
        if alpha is not None:
            params["alpha"] = f.scalar(alpha)
        if beta is not None:
            params["beta"] = f.scalar(beta)
        return {"x": f.uniform((2, 3, 4), -3, 3)}, lambda v: [getattr(_mb(), op_type)(x=v["x"], **params)]


for _op, _alpha, _beta in (
    ("clamped_relu", 0.2, 1.5),
    ("elu", 0.7, None),
    ("leaky_relu", 0.1, None),
    ("linear_activation", 1.5, -0.25),
    ("scaled_tanh", 1.7, 0.6),
    ("sigmoid_hard", 0.2, 0.5),
    ("thresholded_relu", 0.3, None),
):
    _alpha_beta_case(_op, _alpha, _beta)


@case("prelu")
def _prelu(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 3, 4, 5))}, lambda v: [_mb().prelu(x=v["x"], alpha=f([0.1, 0.2, 0.3]))]


@case("softplus_parametric")
def _softplus_parametric(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 3, 4, 5))}, lambda v: [
        _mb().softplus_parametric(x=v["x"], alpha=f([0.5, 1.0, 2.0]), beta=f([1.0, 0.5, 2.0]))
    ]


@case("gelu")
def _gelu(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((3, 8), -4, 4)}, lambda v: [
        _mb().gelu(x=v["x"], mode=mode) for mode in ("EXACT", "TANH_APPROXIMATION", "SIGMOID_APPROXIMATION")
    ]


@case("softmax")
def _softmax(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 3, 6), -5, 5)}, lambda v: [
        _mb().softmax(x=v["x"], axis=-1),
        _mb().softmax(x=v["x"], axis=1),
    ]


# -- elementwise binary ----------------------------------------------------------------------

_BINARY_FLOAT = (
    "add",
    "sub",
    "mul",
    "real_div",
    "floor_div",
    "mod",
    "pow",
    "maximum",
    "minimum",
    "equal",
    "not_equal",
    "less",
    "less_equal",
    "greater",
    "greater_equal",
)


def _binary_case(op_type: str) -> None:
    @case(op_type)
    def make(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
        x = f.uniform((2, 3, 4), 0.5, 3) if op_type == "pow" else f.uniform((2, 3, 4), -3, 3)
        y = (
            f.uniform((3, 1), 0.5, 2)
            if op_type in ("real_div", "floor_div", "mod", "pow")
            else f.uniform((3, 1))
        )
        if op_type in ("equal", "not_equal", "less_equal", "greater_equal"):
            x[0, :, 0] = y[:, 0]
        return {"x": x, "y": y}, lambda v: [getattr(_mb(), op_type)(x=v["x"], y=v["y"])]

    @case(op_type, label=f"{op_type}_int32")
    def make_int(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
        x = f.ints((3, 4), -9, 9)
        y = f.ints((4,), 1, 4) if op_type in ("real_div", "floor_div", "mod") else f.ints((4,), -3, 3)
        if op_type == "pow":
            x, y = f.ints((3, 4), 0, 5), f.ints((4,), 0, 3)
        return {"x": x, "y": y}, lambda v: [getattr(_mb(), op_type)(x=v["x"], y=v["y"])]


for _op in _BINARY_FLOAT:
    _binary_case(_op)


def _logical_case(op_type: str) -> None:
    @case(op_type)
    def make(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
        return {"x": f.bools((3, 4)), "y": f.bools((3, 4))}, lambda v: [
            getattr(_mb(), op_type)(x=v["x"], y=v["y"])
        ]


for _op in ("logical_and", "logical_or", "logical_xor"):
    _logical_case(_op)


@case("select")
def _select(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"c": f.bools((3, 4)), "a": f.uniform((3, 4)), "b": f.uniform((1, 4))}, lambda v: [
        _mb().select(cond=v["c"], a=v["a"], b=v["b"])
    ]


@case("cast")
def _cast(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    x = f.uniform((3, 4), -5, 5)
    return {"x": x}, lambda v: [
        _mb().cast(x=v["x"], dtype=dtype) for dtype in ("fp16", "fp32", "int32", "bool", "int8", "uint8")
    ]


# -- linear algebra --------------------------------------------------------------------------


@case("linear")
def _linear(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    w, b = f.uniform((5, 8), -0.5, 0.5), f.uniform((5,))
    return {"x": f.uniform((2, 3, 8))}, lambda v: [
        _mb().linear(x=v["x"], weight=w, bias=b),
        _mb().linear(x=v["x"], weight=w),
    ]


@case("matmul")
def _matmul(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    w = f.uniform((4, 5))
    return {"x": f.uniform((2, 3, 4)), "y": f.uniform((2, 5, 4)), "v": f.uniform((4,))}, lambda v: [
        _mb().matmul(x=v["x"], y=v["y"], transpose_y=True),
        _mb().matmul(x=v["y"], y=v["x"], transpose_y=True),
        _mb().matmul(x=v["v"], y=w),
        _mb().matmul(x=v["x"], y=v["x"], transpose_x=True),
    ]


@case("einsum")
def _einsum(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {
        "a": f.uniform((2, 3, 4, 5)),
        "b": f.uniform((2, 5, 4, 6)),
        "c": f.uniform((3, 1, 5)),
        "d": f.uniform((5, 4, 2)),
    }, lambda v: [
        _mb().einsum(values=(v["a"], v["b"]), equation="nchw,nwhu->nchu"),
        _mb().einsum(values=(v["c"], v["d"]), equation="chw,whr->chr"),
    ]


@case("scaled_dot_product_attention")
def _sdpa(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    causal = np.tril(np.ones((4, 6), dtype=bool), k=2)
    additive = f(np.where(causal, 0.0, -1e4))
    return {
        "q": f.uniform((1, 2, 4, 8)),
        "k": f.uniform((1, 2, 6, 8)),
        "v": f.uniform((1, 2, 6, 3)),
    }, lambda v: [
        _mb().scaled_dot_product_attention(query=v["q"], key=v["k"], value=v["v"]),
        _mb().scaled_dot_product_attention(query=v["q"], key=v["k"], value=v["v"], attn_mask=causal),
        _mb().scaled_dot_product_attention(query=v["q"], key=v["k"], value=v["v"], attn_mask=additive),
    ]


# -- normalisation and reductions ------------------------------------------------------------


@case("layer_norm")
def _layer_norm(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 3, 8), -2, 3)}, lambda v: [
        _mb().layer_norm(
            x=v["x"], axes=[-1], gamma=f.uniform((8,)), beta=f.uniform((8,)), epsilon=f.scalar(1e-5)
        ),
        _mb().layer_norm(x=v["x"], axes=[1, 2]),
    ]


@case("l2_norm")
def _l2_norm(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 3, 4, 5))}, lambda v: [_mb().l2_norm(x=v["x"], epsilon=f.scalar(1e-6))]


_REDUCE = (
    "reduce_l1_norm",
    "reduce_l2_norm",
    "reduce_log_sum",
    "reduce_log_sum_exp",
    "reduce_max",
    "reduce_mean",
    "reduce_min",
    "reduce_prod",
    "reduce_sum",
    "reduce_sum_square",
)


def _reduce_case(op_type: str) -> None:
    @case(op_type)
    def make(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
        low = 0.5 if op_type in ("reduce_log_sum", "reduce_prod") else -2.0
        return {"x": f.uniform((2, 3, 4), low, 1.5)}, lambda v: [
            getattr(_mb(), op_type)(x=v["x"], axes=[-1], keep_dims=True),
            getattr(_mb(), op_type)(x=v["x"], axes=[0, 2], keep_dims=False),
            getattr(_mb(), op_type)(x=v["x"]),
        ]


for _op in _REDUCE:
    _reduce_case(_op)


def _reduce_arg_case(op_type: str) -> None:
    @case(op_type)
    def make(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
        x = f(np.random.default_rng(1).permutation(24).reshape(2, 3, 4) / 4)
        return {"x": x}, lambda v: [
            getattr(_mb(), op_type)(x=v["x"], axis=1, keep_dims=True),
            getattr(_mb(), op_type)(x=v["x"]),
        ]


for _op in ("reduce_argmax", "reduce_argmin"):
    _reduce_arg_case(_op)


# -- tensor construction and layout ----------------------------------------------------------


@case("band_part")
def _band_part(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 4, 5))}, lambda v: [
        _mb().band_part(x=v["x"], lower=1, upper=0),
        _mb().band_part(x=v["x"], lower=-1, upper=2),
    ]


@case("cumsum")
def _cumsum(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((3, 4))}, lambda v: [
        _mb().cumsum(x=v["x"], axis=1),
        _mb().cumsum(x=v["x"], axis=0, reverse=True),
    ]


@case("fill")
def _fill(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"s": np.array([2, 3], dtype=np.int32)}, lambda v: [
        _mb().fill(shape=v["s"], value=f.scalar(1.5)),
        _mb().fill(shape=np.array([2, 2], dtype=np.int32), value=np.int32(7)),
    ]


@case("fill_like")
def _fill_like(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 3))}, lambda v: [_mb().fill_like(ref_tensor=v["x"], value=f.scalar(0.5))]


@case("flatten2d")
def _flatten2d(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 3, 4))}, lambda v: [
        _mb().flatten2d(x=v["x"], axis=1),
        _mb().flatten2d(x=v["x"], axis=-1),
    ]


@case("range_1d")
def _range_1d(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"e": np.array([7], dtype=np.int32)}, lambda v: [
        _mb().range_1d(start=np.int32(1), end=_mb().squeeze(x=v["e"]), step=np.int32(2)),
        _mb().range_1d(start=f.scalar(0.0), end=f.scalar(2.0), step=f.scalar(0.5)),
    ]


@case("shape")
def _shape(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 3, 4))}, lambda v: [_mb().shape(x=v["x"])]


@case("non_zero")
def _non_zero(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    x = f.uniform((3, 4))
    x[x < 0] = 0
    return {}, lambda v: [_mb().non_zero(x=x)]


@case("argsort")
def _argsort(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    x = f(np.random.default_rng(2).permutation(24).reshape(2, 3, 4) / 8)
    return {"x": x}, lambda v: [
        _mb().argsort(x=v["x"], axis=-1),
        _mb().argsort(x=v["x"], axis=1, ascending=True),
    ]


@case("topk")
def _topk(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    x = f(np.random.default_rng(3).permutation(24).reshape(2, 3, 4) / 8)
    return {"x": x}, lambda v: [
        *_mb().topk(x=v["x"], k=2, axis=-1),
        *_mb().topk(x=v["x"], k=2, axis=1, ascending=True),
    ]


@case("tile")
def _tile(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 3))}, lambda v: [_mb().tile(x=v["x"], reps=[2, 3])]


@case("pad")
def _pad(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 3, 4))}, lambda v: [
        _mb().pad(x=v["x"], pad=[1, 2, 0, 1], mode="constant", constant_val=f.scalar(0.5)),
        _mb().pad(x=v["x"], pad=[1, 2, 2, 1], mode="reflect"),
        _mb().pad(x=v["x"], pad=[0, 0, 1, 1, 3, 0], mode="replicate"),
    ]


@case("concat")
def _concat(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"a": f.uniform((2, 3)), "b": f.uniform((2, 3))}, lambda v: [
        _mb().concat(values=[v["a"], v["b"]], axis=1),
        _mb().concat(values=[v["a"], v["b"], v["a"]], axis=0),
    ]


@case("split")
def _split(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((4, 6))}, lambda v: [
        *_mb().split(x=v["x"], num_splits=2, axis=0),
        *_mb().split(x=v["x"], split_sizes=[1, 2, 3], axis=1),
    ]


@case("stack")
def _stack(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"a": f.uniform((2, 3)), "b": f.uniform((2, 3))}, lambda v: [
        _mb().stack(values=[v["a"], v["b"]], axis=1)
    ]


@case("identity")
def _identity(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 3))}, lambda v: [_mb().identity(x=v["x"])]


@case("expand_dims")
def _expand_dims(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 3))}, lambda v: [
        _mb().expand_dims(x=v["x"], axes=[0, -1]),
        _mb().expand_dims(x=v["x"], axes=[1]),
    ]


@case("squeeze")
def _squeeze(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((1, 3, 1, 2))}, lambda v: [
        _mb().squeeze(x=v["x"], axes=[0]),
        _mb().squeeze(x=v["x"]),
    ]


@case("reshape")
def _reshape(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 3, 4))}, lambda v: [
        _mb().reshape(x=v["x"], shape=[6, -1]),
        _mb().reshape(x=v["x"], shape=[0, -1]),
        _mb().reshape(x=v["x"], shape=[1, 0, -1, 0]),
    ]


@case("reshape", opset="iOS15", label="reshape_ios15")
def _reshape15(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 3, 4))}, lambda v: [_mb().reshape(x=v["x"], shape=[0, -1, 2])]


@case("reverse")
def _reverse(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 3, 4))}, lambda v: [
        _mb().reverse(x=v["x"], axes=[-1]),
        _mb().reverse(x=v["x"]),
    ]


def _reverse_sequence(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((3, 5, 2)), "n": np.array([2, 5, 0], dtype=np.int32)}, lambda v: [
        _mb().reverse_sequence(x=v["x"], lengths=v["n"], seq_axis=1, batch_axis=0)
    ]


@case("slice_by_index")
def _slice_by_index(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((4, 5, 6))}, lambda v: [
        _mb().slice_by_index(x=v["x"], begin=[1, 0, 5], end=[3, 5, 0], stride=[1, 2, -2]),
        _mb().slice_by_index(
            x=v["x"],
            begin=[0, 1, 2],
            end=[0, 4, 6],
            begin_mask=[True, False, False],
            end_mask=[True, False, False],
            squeeze_mask=[False, False, True],
        ),
        _mb().slice_by_index(x=v["x"], begin=[-1, 0, 0], end=[0, -1, 6], squeeze_mask=[True, False, False]),
    ]


@case("slice_by_size")
def _slice_by_size(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((4, 5))}, lambda v: [
        _mb().slice_by_size(x=v["x"], begin=[1, -3], size=[2, 2]),
        _mb().slice_by_size(x=v["x"], begin=[0, 1], size=[-1, -1]),
    ]


@case("slice_update")
def _slice_update(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((4, 5)), "u": f.uniform((2, 2))}, lambda v: [
        _mb().slice_update(x=v["x"], update=v["u"], begin=[1, 0], end=[3, 4], stride=[1, 2])
    ]


@case("transpose")
def _transpose(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((2, 3, 4))}, lambda v: [_mb().transpose(x=v["x"], perm=[2, 0, 1])]


# -- gather / scatter ------------------------------------------------------------------------


@case("gather")
def _gather(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((4, 5, 3)), "i": np.array([[3, 0], [1, 1]], dtype=np.int32)}, lambda v: [
        _mb().gather(x=v["x"], indices=v["i"], axis=0),
        _mb().gather(x=v["x"], indices=v["i"], axis=1),
        _mb().gather(
            x=v["x"],
            indices=np.array([[2, 0, 1], [1, 1, 0], [0, 2, 2], [1, 0, 0]], dtype=np.int32),
            axis=2,
            batch_dims=1,
        ),
    ]


@case("gather", opset="iOS15", label="gather_ios15_negative")
def _gather15(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((4, 5))}, lambda v: [
        _mb().gather(x=v["x"], indices=np.array([-1, 0, -4], dtype=np.int32), axis=0)
    ]


@case("gather_along_axis")
def _gather_along_axis(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"x": f.uniform((3, 4)), "i": np.array([[0, 3], [2, 2], [1, 0]], dtype=np.int32)}, lambda v: [
        _mb().gather_along_axis(x=v["x"], indices=v["i"], axis=1)
    ]


@case("scatter_along_axis")
def _scatter_along_axis(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {
        "d": f.uniform((3, 4)),
        "i": np.array([[0, 3], [2, 1], [1, 0]], dtype=np.int32),
        "u": f.uniform((3, 2)),
    }, lambda v: [
        _mb().scatter_along_axis(data=v["d"], indices=v["i"], updates=v["u"], axis=1, mode="update")
    ]


# -- compression and quantization ------------------------------------------------------------


@case("constexpr_affine_dequantize", opset="iOS16")
def _affine_dequantize(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    q = f.ints((3, 4), -128, 127).astype(np.int8)
    return {}, lambda v: [
        _mb().constexpr_affine_dequantize(
            quantized_data=q, zero_point=np.int8(3), scale=f.scalar(0.05), axis=0
        ),
        _mb().constexpr_affine_dequantize(
            quantized_data=q, zero_point=np.array([1, -2, 0], dtype=np.int8), scale=f([0.1, 0.2, 0.3]), axis=0
        ),
    ]


@case("constexpr_blockwise_shift_scale")
def _blockwise(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    from coremltools.converters.mil.mil import types

    data4 = f.ints((4, 8), -8, 8).astype(types.np_int4_dtype)
    data8 = f.ints((4, 8), 0, 255).astype(np.uint8)
    return {}, lambda v: [
        _mb().constexpr_blockwise_shift_scale(data=data4, scale=f.uniform((4, 2), 0.01, 0.1)),
        _mb().constexpr_blockwise_shift_scale(
            data=data8, scale=f.uniform((2, 4), 0.01, 0.1), offset=f.ints((2, 4), 100, 150).astype(np.uint8)
        ),
    ]


@case("constexpr_cast", opset="iOS16")
def _constexpr_cast(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    source = f.uniform((3, 4)).astype(np.float16)
    return {}, lambda v: [_mb().constexpr_cast(source_val=source, output_dtype="fp32")]


@case("constexpr_lut_to_dense", opset="iOS16", label="constexpr_lut_to_dense_ios16")
def _lut16(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    lut = f.uniform((4,))
    packed = np.random.default_rng(4).integers(0, 256, size=3).astype(np.uint8)  # 12 x 2-bit
    return {}, lambda v: [
        _mb().constexpr_lut_to_dense(indices=packed, lut=lut, shape=np.array([3, 4], dtype=np.uint32))
    ]


@case("constexpr_lut_to_dense")
def _lut18(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    from coremltools.converters.mil.mil import types

    indices = f.ints((4, 6), 0, 4).astype(types.np_uint2_dtype)
    return {}, lambda v: [
        _mb().constexpr_lut_to_dense(indices=indices, lut=f.uniform((2, 1, 4, 1))),
        _mb().constexpr_lut_to_dense(indices=indices, lut=f.uniform((1, 3, 4, 2)), vector_axis=0),
    ]


@case("constexpr_sparse_to_dense", opset="iOS16", label="constexpr_sparse_to_dense_ios16")
def _sparse16(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    mask = np.array([0b10110010, 0b00000101], dtype=np.uint8)  # 12 bits used, 6 set
    return {}, lambda v: [
        _mb().constexpr_sparse_to_dense(
            nonzero_data=f.uniform((6,)), mask=mask, shape=np.array([3, 4], dtype=np.uint32)
        )
    ]


@case("constexpr_sparse_to_dense")
def _sparse18(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    from coremltools.converters.mil.mil import types

    mask = (np.random.default_rng(5).random((3, 4)) < 0.5).astype(types.np_uint1_dtype)
    return {}, lambda v: [
        _mb().constexpr_sparse_to_dense(nonzero_data=f.uniform((int(mask.sum()),)), mask=mask)
    ]


@case("constexpr_lut_to_sparse")
def _lut_to_sparse(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    from coremltools.converters.mil.mil import types

    mask = (np.random.default_rng(6).random((4, 6)) < 0.5).astype(types.np_uint1_dtype)
    nonzero = f.ints((int(mask.sum()),), 0, 4).astype(types.np_uint2_dtype)
    return {}, lambda v: list(
        _mb().constexpr_lut_to_sparse(
            indices_mask=mask, indices_nonzero_data=nonzero, lut=f.uniform((1, 2, 4, 1))
        )
    )


@case("constexpr_sparse_blockwise_shift_scale")
def _sparse_shift_scale(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    from coremltools.converters.mil.mil import types

    mask = (np.random.default_rng(7).random((4, 6)) < 0.5).astype(types.np_uint1_dtype)
    nonzero = f.ints((int(mask.sum()),), -100, 100).astype(np.int8)
    return {}, lambda v: list(
        _mb().constexpr_sparse_blockwise_shift_scale(
            data_mask=mask,
            nonzero_data=nonzero,
            scale=f.uniform((2, 3), 0.01, 0.1),
            offset=np.full((2, 3), 3, dtype=np.int8),
        )
    )


@case("quantize", opset="iOS17")
def _quantize(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    x = f(np.linspace(-2.03, 2.11, 24).reshape(2, 3, 4))
    return {"x": x}, lambda v: [
        _mb().quantize(input=v["x"], scale=f.scalar(0.04), zero_point=np.int8(2), output_dtype="int8"),
        _mb().quantize(
            input=v["x"],
            scale=f([0.03, 0.05, 0.07]),
            zero_point=np.array([128, 120, 130], dtype=np.uint8),
            axis=1,
            output_dtype="uint8",
        ),
    ]


@case("dequantize", opset="iOS17")
def _dequantize(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    return {"q": f.ints((2, 3, 4), -100, 100).astype(np.int8)}, lambda v: [
        _mb().dequantize(input=v["q"], scale=f.scalar(0.05), zero_point=np.int8(-3)),
        _mb().dequantize(
            input=v["q"], scale=f([0.1, 0.2, 0.3]), zero_point=np.array([0, 1, 2], dtype=np.int8), axis=1
        ),
    ]


# -- control flow ----------------------------------------------------------------------------


@case("cond")
def _cond(f: Floats) -> tuple[dict[str, np.ndarray], Builder]:
    def build(v: dict[str, Any]) -> list[Any]:
        mb = _mb()
        pred = mb.greater(x=mb.reduce_sum(x=v["x"]), y=f.scalar(0.0))
        out = mb.cond(
            pred=pred,
            _true_fn=lambda: mb.mul(x=v["x"], y=f.scalar(2.0)),
            _false_fn=lambda: mb.sub(x=v["x"], y=f.scalar(1.0)),
        )
        return [out]

    return {"x": f.uniform((3,), 0.1, 1)}, build
