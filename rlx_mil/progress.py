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
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from rlx_mil import interrupts

if TYPE_CHECKING:
    import numpy as np

_CI_VARIABLES = ("CI", "GITHUB_ACTIONS", "BUILDKITE", "GITLAB_CI", "TF_BUILD")


def running_under_ci() -> bool:
    return any(os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no") for name in _CI_VARIABLES)


#: The bar of a stage while it counts nothing: its name and clock (and what it does now).
CLOCK_ONLY = "{desc}: {elapsed}{postfix}"


def _counting(bar: Any) -> None:
    """The bar counts from now on: tqdm's count, rate (and ETA, given a total) after the clock."""
    if bar.bar_format == CLOCK_ONLY:
        bar.bar_format = None


#: The Progress whose stage is running (deep code reports to it through `tick` / `detail`).
_ACTIVE: Progress | None = None
#: Seconds between redraws of a running bar: its clock moves even while its count does not.
REFRESH_SECONDS = 0.5


def tick(unit: str, n: int = 1) -> None:
    """Count `n` items of `unit` (" ops", " weights", ...) on the running stage, if it counts those."""
    interrupts.check()
    active = _ACTIVE
    if active is not None and active._unit == unit:
        active.advance(n)


#: The unit of a stage that writes or copies bytes (`count_bytes`): its bar shows sizes and a rate.
BYTES = " bytes"


def counting(unit: str) -> bool:
    """Whether a stage is running and counts `unit` (deep code skips the work of counting else)."""
    active = _ACTIVE
    return active is not None and active._unit == unit


def stage_running() -> bool:
    return _ACTIVE is not None


def count_bytes(total: int) -> None:
    """The running stage writes (or copies) about `total` bytes from now on: its bar counts them
    (`121M/269M [00:01<00:01, 110MB/s]`), whatever it counted before; deep code reports them with
    `tick(BYTES, n)`. Nothing when no stage runs or it counts bytes already."""
    active = _ACTIVE
    if active is None or total <= 0 or active._unit == BYTES:
        return
    active._unit = BYTES
    bar = active._bar
    if bar is not None:
        _counting(bar)
        bar.unit, bar.unit_scale, bar.unit_divisor = "B", True, 1024
        bar.reset(total=total)


def expect(unit: str, total: int) -> None:
    """Set the total of the running stage counting `unit`, when it has none yet (its ETA)."""
    active = _ACTIVE
    if total > 0 and active is not None and active._unit == unit and active._bar is not None and active._bar.total is None:
        _counting(active._bar)
        active._bar.total = total
        active._bar.refresh()


def complete(unit: str) -> None:
    """The running stage counting `unit` has counted everything (its total was an estimate)."""
    active = _ACTIVE
    if active is not None and active._unit == unit and active._bar is not None and active._bar.total:
        active._bar.n = active._bar.total
        active._bar.refresh()


def detail(text: str) -> None:
    """Show `text` (what the running stage does now: a pass name) beside its bar."""
    interrupts.check()
    active = _ACTIVE
    if active is not None and active._bar is not None:
        now = time.perf_counter()
        shown = now - active._detail_shown >= 0.05  # redraw now, at most 20 times a second
        active._bar.set_postfix_str(text, refresh=shown)
        if shown:
            active._detail_shown = now


def abandon() -> None:
    """Stop the running stage, if any: its bar cleared and no longer redrawn, no stage line (the
    command failed or was interrupted, and says so on the line the bar held)."""
    global _ACTIVE
    active = _ACTIVE
    if active is None:
        return
    _ACTIVE = None
    if active._stop is not None:
        active._stop.set()
        active._stop = None
    bar, active._bar, active._stage = active._bar, None, None
    if bar is not None:
        try:
            bar.close()
        except Exception:  # a terminal gone away: nothing to clear
            pass


class ItemCount:
    """A count of items inside the running stage, shown beside its bar (the stage counts
    something else: the weights a conversion compresses while its ops are counted):
    `compressing weights 12/196, 3.1/s, ETA 1:02: NAME` before each item starts (a slow one
    shows its name while it runs). Nothing when no stage is running."""

    def __init__(self, what: str, total: int) -> None:
        self.what, self.total, self.done = what, total, 0
        self._started = time.perf_counter()

    def starting(self, name: str) -> None:
        """Item `name` starts (the items before it are done)."""
        if _ACTIVE is None or _ACTIVE._bar is None:
            self.done += 1
            return
        elapsed = time.perf_counter() - self._started
        text = f"{self.what} {self.done + 1}/{self.total}"
        if self.done and elapsed > 0:
            rate = self.done / elapsed
            left = max(self.total - self.done, 0) / rate
            text += f", {rate:.3g}/s, ETA {int(left) // 60}:{int(left) % 60:02d}"
        self.done += 1
        detail(f"{text}: {name}")


class Progress:
    """Stage lines and bars on `stream`; a no-op when disabled."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self._bar: Any = None
        self._stage: str | None = None
        self._unit = ""
        self._started = 0.0
        self._min_seconds = 0.0
        self._stop: threading.Event | None = None
        self._detail_shown = 0.0

    @property
    def interactive(self) -> bool:
        return self.enabled and bool(getattr(self.stream, "isatty", lambda: False)())

    def begin(self, stage: str, total: int | None = None, unit: str = "it", min_seconds: float = 0.0) -> None:
        """Start `stage` (ending the previous one with its line). A stage shorter than
        `min_seconds` ends without a line. On a terminal its bar shows the count of `unit`
        (with a rate, and an ETA once the total is known) and a clock redrawn every
        `REFRESH_SECONDS`."""
        global _ACTIVE
        self.end()
        interrupts.check()
        if not self.enabled:
            return
        self._stage = stage
        self._unit = unit
        self._started = time.perf_counter()
        self._min_seconds = min_seconds
        _ACTIVE = self
        if self.interactive:
            from tqdm import tqdm

            # disable=False explicitly: this bar is rlx_mil's own progress, which -q turns off.
            # A stage that counts nothing (yet) shows its clock alone, not "0it [00:03, ?it/s]".
            clock_only = {"bar_format": CLOCK_ONLY} if total is None else {}
            self._bar = tqdm(total=total, desc=f"  {stage}", unit=unit, leave=False, file=self.stream,
                             disable=False, dynamic_ncols=True, mininterval=0.1, **clock_only)
            self._stop = threading.Event()
            threading.Thread(target=self._redraw, args=(self._bar, self._stop), daemon=True).start()

    @staticmethod
    def _redraw(bar: Any, stop: threading.Event) -> None:
        while not stop.wait(REFRESH_SECONDS):
            try:
                bar.refresh()
            except Exception:  # the bar closed between the wait and the redraw
                return

    def advance(self, n: int = 1) -> None:
        interrupts.check()
        if self._bar is not None:
            _counting(self._bar)
            self._bar.update(n)

    def end(self, detail: str = "") -> None:
        """Finish the current stage: `  <stage>: <detail> (<seconds> s)`."""
        global _ACTIVE
        if self._stage is None:
            return
        if self._stop is not None:
            self._stop.set()
            self._stop = None
        if self._bar is not None:
            self._bar.refresh()  # the final count is drawn even when the stage beat the redraw clock
            self._bar.close()
            self._bar = None
        if _ACTIVE is self:
            _ACTIVE = None
        took = time.perf_counter() - self._started
        if took >= self._min_seconds:
            text = f"  {self._stage}: {detail} ({took:.1f} s)" if detail else f"  {self._stage} ({took:.1f} s)"
            print(text, file=self.stream, flush=True)
        self._stage = None
        self._unit = ""

    def note(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.stream, flush=True)


_DESCRIBING = frozenset({"shape_of", "dtype_of", "source_type"})


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

    def __getattr__(self, attr: str) -> Any:
        # What a lazy mapping tells without reading a tensor (`shape_of`, `dtype_of`; a GGUF
        # file's `source_type`), when the wrapped mapping tells it.
        if attr in _DESCRIBING:
            return getattr(self._params, attr)
        raise AttributeError(attr)

    def prequantized_weights(self) -> Mapping[str, Any]:
        """The wrapped mapping's already quantized weights (see `rlx_mil.compress.prequantized`)."""
        get = getattr(self._params, "prequantized_weights", None)
        return get() if callable(get) else {}
