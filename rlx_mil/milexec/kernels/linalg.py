"""linear, matmul and einsum.

fp16 inputs reach these kernels upcast to float32, so every product goes through float32 BLAS
(numpy has no fp16 BLAS; fp16 matmul in numpy is ~4x slower) and accumulates in float32, as the
GPU and ANE do; the executor then rounds the result to fp16.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from rlx_mil.milexec.fp16 import widen_into
from rlx_mil.milexec.registry import OpContext, as_compute, kernel
from rlx_mil.milexec.streamed import StreamedWeight, product_rows

#: An fp16 weight of at least this many elements is widened a block of rows at a time into one
#: cache-sized buffer (`_blocked_linear`) instead of into a float32 copy of the whole weight.
BLOCKED_WEIGHT_MIN = 1 << 20


def _float_or_int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        return np.matmul(a.astype(np.float32, copy=False), b.astype(np.float32, copy=False))
    return np.matmul(a.astype(np.int64), b.astype(np.int64))


def _blocked_linear(flat: np.ndarray, weight: np.ndarray | StreamedWeight) -> np.ndarray:
    """`flat @ weight.T` for a 2-D fp16 `weight` widened (or a streamed compressed weight
    decoded) a block of `product_rows` rows at a time into one buffer, or a float32 weight
    multiplied in those same blocks: the same float32 products of the same weight values, each
    output column from one block. The rows are split between `row_threads()` threads (each
    with its own buffer; NumPy and BLAS release the GIL)."""
    rows, depth = weight.shape
    step = product_rows(depth)
    out = np.empty((flat.shape[0], rows), np.float32)
    lhs = flat.astype(np.float32, copy=False)
    _split_rows(rows, step, lambda start, stop: _blocked_rows(lhs, weight, out, start, stop, step))
    return out


def _blocked_rows(lhs: np.ndarray, weight: np.ndarray | StreamedWeight, out: np.ndarray, first: int, last: int,
                  step: int) -> None:
    depth = weight.shape[1]
    held = isinstance(weight, np.ndarray) and weight.dtype == np.float32
    block = np.empty((0 if held else min(step, last - first), depth), np.float32)
    scratch = weight.scratch() if isinstance(weight, StreamedWeight) else None
    for start in range(first, last, step):
        stop = min(last, start + step)
        part = block[: stop - start]
        if isinstance(weight, StreamedWeight):
            weight.rows_into(start, stop, part, scratch)
        elif held:
            part = weight[start:stop]
        else:
            widen_into(weight[start:stop], part)
        np.matmul(lhs, part.T, out=out[:, start:stop])


def _split_rows(rows: int, step: int, work: Callable[[int, int], None]) -> None:
    """Run `work(start, stop)` over `rows` split into `row_threads()` contiguous ranges (each
    a multiple of `step` long but the last), the first in this thread."""
    threads = min(row_threads(), -(-rows // step))
    if threads <= 1:
        work(0, rows)
        return
    per = -(-rows // (threads * step)) * step
    ranges = [(a, min(rows, a + per)) for a in range(0, rows, per)]
    pool = _pool(len(ranges) - 1)
    futures = [pool.submit(work, a, b) for a, b in ranges[1:]]
    try:
        work(*ranges[0])
    finally:
        for future in futures:
            future.result()


_THREADS: contextvars.ContextVar[int] = contextvars.ContextVar("rlx_mil_row_threads", default=1)
#: (workers, pool) of the threads `_split_rows` hands row ranges to.
_POOL: list[tuple[int, ThreadPoolExecutor]] = []


def row_threads() -> int:
    """Threads a large `linear` splits its weight's rows between (`rows_in_threads`)."""
    return _THREADS.get()


@contextlib.contextmanager
def rows_in_threads(threads: int) -> Iterator[None]:
    """Within the block, a `linear` that widens or decodes a weight of BLOCKED_WEIGHT_MIN
    elements or more a block at a time, or multiplies several rows by a float32 weight, splits
    its rows between `threads` threads (the same products, each output column from one). One
    row times a float32 weight is one BLAS call: a matrix-vector product bound by memory
    bandwidth gained nothing from a second thread here."""
    token = _THREADS.set(threads)
    try:
        yield
    finally:
        _THREADS.reset(token)


def _pool(workers: int) -> ThreadPoolExecutor:
    if not _POOL or _POOL[0][0] < workers:
        _POOL[:] = [(workers, ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlx_mil_linear"))]
    return _POOL[0][1]


@kernel("linear")
def linear(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    flat = x.reshape(-1, x.shape[-1]) if x.ndim != 2 else x
    streamed = ctx.streamed("weight")
    if streamed is not None and len(streamed.shape) == 2 and x.dtype.kind == "f":
        out = _blocked_linear(flat, streamed)
        rows = streamed.shape[0]
    else:
        stored = ctx.raw("weight")
        rows = stored.shape[0]
        if stored.dtype == np.float16 and stored.ndim == 2 and stored.size >= BLOCKED_WEIGHT_MIN and x.dtype.kind == "f":
            out = _blocked_linear(flat, stored)
        else:
            weight = as_compute(stored)
            if (weight.dtype == np.float32 and weight.ndim == 2 and flat.shape[0] > 1 and x.dtype.kind == "f"
                    and rows > product_rows(weight.shape[1])):
                # Several rows: the same row blocks as the blocked forms of the weight
                # (`product_rows`), split between the row threads.
                out = _blocked_linear(flat, np.ascontiguousarray(weight))
            else:  # one row times a float32 weight (held so by "fast"): one BLAS call
                out = _float_or_int_matmul(flat, weight.T)
    if ctx.has("bias"):
        out = out + ctx.val("bias")
    return out.reshape((*x.shape[:-1], rows))


@kernel("matmul")
def matmul(ctx: OpContext) -> np.ndarray:
    x, y = ctx.val("x"), ctx.val("y")
    if ctx.param("transpose_x", False) and x.ndim >= 2:
        x = np.swapaxes(x, -1, -2)
    if ctx.param("transpose_y", False) and y.ndim >= 2:
        y = np.swapaxes(y, -1, -2)
    return _float_or_int_matmul(x, y)


@kernel("einsum")
def einsum(ctx: OpContext) -> np.ndarray:
    equation = str(ctx.param("equation")).replace(" ", "")
    operands = [v.astype(np.float32, copy=False) for v in ctx.vals("values")]
    lhs, _, _ = equation.partition("->")
    specs = lhs.split(",")
    if len(specs) != len(operands) or "." in equation:
        raise ctx.error(f"unsupported einsum equation {equation!r} for {len(operands)} operands")
    # MIL broadcasts size-1 batch dims between operands; np.einsum does not.
    sizes: dict[str, int] = {}
    for spec, operand in zip(specs, operands, strict=True):
        if len(spec) != operand.ndim:
            raise ctx.error(f"einsum term {spec!r} does not match an operand of rank {operand.ndim}")
        for label, n in zip(spec, operand.shape, strict=True):
            sizes[label] = max(sizes.get(label, 1), n)
    expanded = [
        np.broadcast_to(operand, tuple(sizes[label] for label in spec))
        for spec, operand in zip(specs, operands, strict=True)
    ]
    return np.einsum(equation, *expanded, optimize=True)
