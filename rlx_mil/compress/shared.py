"""One compression for every function of a multifunction conversion.

`rlx_mil.convert_functions` converts each function (prefill buckets, decode) separately, each
with its own `WeightCompressor`, against the same weights. Inside `shared_compression()` the
compressors share what does not depend on the function's graph: the autoN plan (the schemes
chosen per weight), the codes of each weight (encoded once; every function's program then
holds the very same arrays, so the join writes them once without comparing them), and the
quality check (measured once, by the first function).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SharedCompression:
    #: plan key -> (schemes, notes, AutoPlan, the weights it measured better plainly encoded) of
    #: the first compressor that planned.
    plans: dict[Hashable, tuple[dict[str, Any], dict[str, str], Any, dict[str, Any]]] = field(default_factory=dict)
    #: codes key -> (codes, WeightReport) of the first compressor that encoded the weight.
    codes: dict[Hashable, tuple[Any, Any]] = field(default_factory=dict)
    #: compression key -> the `rlx_mil.compress.sequential.SequentialCodes` of the first
    #: compressor whose codes were fitted in order (one pass over the calibration graph).
    sequential: dict[Hashable, Any] = field(default_factory=dict)
    #: check key -> the report fields the first function's check filled.
    checks: dict[Hashable, dict[str, Any]] = field(default_factory=dict)
    #: Keep what the keys name by identity alive while the session lasts.
    held: list[Any] = field(default_factory=list)

    def codes_by_name(self) -> dict[str, Any]:
        """Weight name -> its codes (the arrays the programs hold), for
        `rlx_mil.compress.dequantized_params(..., codes=...)`."""
        return {key[1]: codes for key, (codes, _) in self.codes.items()}  # type: ignore[index]


_SESSION: ContextVar[SharedCompression | None] = ContextVar("rlx_mil_shared_compression", default=None)


def current() -> SharedCompression | None:
    """The active shared session, None outside `shared_compression()`."""
    return _SESSION.get()


@contextmanager
def shared_compression() -> Iterator[SharedCompression]:
    """Compressors created inside share their plan, codes and check (see the module)."""
    outer = _SESSION.get()
    if outer is not None:  # nested: the outer session already shares
        yield outer
        return
    token = _SESSION.set(SharedCompression())
    try:
        session = _SESSION.get()
        assert session is not None
        yield session
    finally:
        _SESSION.reset(token)
