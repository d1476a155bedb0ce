"""Progress of a conversion on the command line: weights read, program built, Core ML's
passes, package written.

Each stage ends with one line on stderr (what it did, how long it took). On a terminal a tqdm
bar shows the stage while it runs; coremltools' own pass-pipeline bar (switched off when
rlx_mil is imported) is replaced by one that fits between those lines (`rlx_mil.coreml.patches.passes_shown_on`). `enabled=False`
(`--quiet`, or a CI environment) prints nothing.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    import numpy as np

_CI_VARIABLES = ("CI", "GITHUB_ACTIONS", "BUILDKITE", "GITLAB_CI", "TF_BUILD")


def running_under_ci() -> bool:
    return any(os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no") for name in _CI_VARIABLES)


class Progress:
    """Stage lines and bars on `stream`; a no-op when disabled."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self._bar: Any = None
        self._stage: str | None = None
        self._started = 0.0
        self._min_seconds = 0.0

    @property
    def interactive(self) -> bool:
        return self.enabled and bool(getattr(self.stream, "isatty", lambda: False)())

    def begin(self, stage: str, total: int | None = None, unit: str = "it", min_seconds: float = 0.0) -> None:
        """Start `stage` (ending the previous one with its line). A stage shorter than
        `min_seconds` ends without a line."""
        self.end()
        if not self.enabled:
            return
        self._stage = stage
        self._started = time.perf_counter()
        self._min_seconds = min_seconds
        if self.interactive:
            from tqdm import tqdm

            # disable=False explicitly: this bar is rlx_mil's own progress, which -q turns off.
            self._bar = tqdm(total=total, desc=f"  {stage}", unit=unit, leave=False, file=self.stream,
                             disable=False, dynamic_ncols=True)

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def end(self, detail: str = "") -> None:
        """Finish the current stage: `  <stage>: <detail> (<seconds> s)`."""
        if self._stage is None:
            return
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        took = time.perf_counter() - self._started
        if took >= self._min_seconds:
            text = f"  {self._stage}: {detail} ({took:.1f} s)" if detail else f"  {self._stage} ({took:.1f} s)"
            print(text, file=self.stream, flush=True)
        self._stage = None

    def note(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.stream, flush=True)


class CountingParams(Mapping[str, "np.ndarray"]):
    """A params mapping that reports each tensor read (the conversion reads each once)."""

    def __init__(self, params: Mapping[str, np.ndarray], on_read: Callable[[str, np.ndarray], None]) -> None:
        self._params = params
        self._on_read = on_read

    def __getitem__(self, name: str) -> np.ndarray:
        value = self._params[name]
        self._on_read(name, value)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def __contains__(self, name: object) -> bool:
        return name in self._params

    def prequantized_weights(self) -> Mapping[str, Any]:
        """The wrapped mapping's already quantized weights (see `rlx_mil.compress.prequantized`)."""
        get = getattr(self._params, "prequantized_weights", None)
        return get() if callable(get) else {}
