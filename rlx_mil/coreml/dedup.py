"""Core ML's `const_deduplication` pass (run in every conversion, and across the functions of
a multifunction package by `save_multifunction`) compares two consts whose first 100 values
hash alike with `np.allclose` over the whole arrays. For integer codes that makes float64
copies of both, several at once: 8 bytes and more per code, about 500 MB for the 28M-code
embedding of a 135M model compared across the two functions of a stateful package, while
everything else of that join held less.

`consts_compared_in_chunks` gives the pass an `allclose` with the same answer that allocates
one chunk at a time: equal chunks (`np.array_equal`) first, which is what deduplicated weights
are, and `np.allclose` chunk by chunk where the bytes differ. Arrays backed by rlx_mil's code
store drop the pages the comparison read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from rlx_mil.coreml import patches

#: Elements compared at a time.
CHUNK = 1 << 20
TARGET = "coremltools.converters.mil.mil.passes.defs.cleanup.const_deduplication:np"


def chunked_allclose(a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    """`np.allclose(a, b, rtol, atol, equal_nan)`, one chunk of `CHUNK` elements at a time for
    arrays of one shape (others: `np.allclose` itself)."""
    from rlx_mil.compress.code_store import release_pages

    x, y = np.asarray(a), np.asarray(b)
    if x.shape != y.shape:
        return bool(np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan))
    xf, yf = x.reshape(-1), y.reshape(-1)
    try:
        for start in range(0, xf.size, CHUNK):
            xs, ys = xf[start:start + CHUNK], yf[start:start + CHUNK]
            if not np.array_equal(xs, ys) and not np.allclose(xs, ys, rtol=rtol, atol=atol, equal_nan=equal_nan):
                return False
        return True
    finally:
        release_pages(a)
        release_pages(b)


class _NumpyWithChunkedAllclose:
    """numpy as the pass sees it: every name numpy's own but `allclose`."""

    allclose = staticmethod(chunked_allclose)

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)


@contextmanager
def consts_compared_in_chunks() -> Iterator[None]:
    """While active, `const_deduplication` compares consts with `chunked_allclose`."""
    if isinstance(patches.current(TARGET), _NumpyWithChunkedAllclose):  # already installed
        yield
        return
    with patches.replaced(TARGET, _NumpyWithChunkedAllclose()):
        yield
