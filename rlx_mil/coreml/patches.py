"""Every change rlx_mil makes to coremltools' private internals, in one place, behind one
version check.

rlx_mil replaces a handful of private coremltools functions while it converts or saves (each
listed in `PATCHES` with the module that supplies the replacement and why). Private names move
between releases without notice, so every patch is installed through `replaced`, which first
checks that the installed coremltools is one the suite passed with (`TESTED_COREMLTOOLS`) and
that the attribute exists; on any other version it raises `UntestedCoremltoolsError` before
touching anything (`RLX_MIL_UNTESTED_COREMLTOOLS=1` turns that into a warning, at the user's
risk). `tests/coreml/test_patches.py` checks that every listed attribute exists and that no
other module assigns to a coremltools attribute.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rlx_mil.errors import RlxMilError
from rlx_mil.progress import detail
from rlx_mil.units import counted

#: coremltools releases the suite passed with: (major, minor) pairs. `pyproject.toml` bounds the
#: dependency to the same range.
TESTED_COREMLTOOLS = ((9, 0),)
ALLOW_UNTESTED_ENV = "RLX_MIL_UNTESTED_COREMLTOOLS"

#: "module:attribute path" -> why rlx_mil replaces it (and which module supplies the replacement).
PATCHES: dict[str, str] = {
    "coremltools.models.utils:_ModelPackage":
        "read a package's Manifest.json without rewriting it while rlx_mil opens a package (coreml/manifest.py)",
    "coremltools.models.model:_ModelPackage":
        "read a package's Manifest.json without rewriting it while rlx_mil opens a package (coreml/manifest.py)",
    "coremltools.converters.mil.mil.passes.pass_pipeline:PassPipelineManager.apply_pipeline":
        "validate the program once per pass pipeline instead of after each pass, and not at all when"
        " its passes are all skipped (coreml/pipeline.py)",
    "coremltools.converters.mil.mil.block:Block._propagate_nonreplaceable_vars":
        "skip recomputing non-replaceable marks until some var is marked (coreml/pipeline.py)",
    "coremltools.converters.mil.mil.var:Var.nonreplaceable_vars_upstream":
        "note whether any var gets a non-replaceable mark, i.e. depends on a constexpr op (coreml/pipeline.py)",
    "coremltools.converters.mil.backend.mil.helper:_get_offset_by_writing_data":
        "write fp16/fp32 consts from flat views of their arrays (coreml/weight_writes.py)",
    "coremltools.models.model:_create_mlpackage":
        "build the package around an empty weights folder and rename the weight file in (coreml/weight_writes.py)",
    "coremltools.converters.mil.backend.mil.load:BlobWriter":
        "record the weight file's path to hand written weights over to it (coreml/weight_writes.py)",
    "coremltools.models.model:_shutil":
        "hard-link weight files while saving a package instead of copying them (coreml/saving.py)",
    "coremltools.converters.mil.mil.passes.defs.optimize_activation:fuse_gelu_tanh_approximation.get_gelu_pattern1":
        "build the activation fusions' pattern programs once per process, not on every run (coreml/pipeline.py)",
    "coremltools.converters.mil.mil.passes.defs.optimize_activation:fuse_gelu_tanh_approximation.get_gelu_pattern2":
        "build the activation fusions' pattern programs once per process, not on every run (coreml/pipeline.py)",
    "coremltools.converters.mil.mil.passes.defs.optimize_activation:FusePreluPattern1.get_prelu_pattern":
        "build the activation fusions' pattern programs once per process, not on every run (coreml/pipeline.py)",
    "coremltools.converters.mil.mil.passes.defs.optimize_activation:FusePreluPattern2.get_prelu_pattern":
        "build the activation fusions' pattern programs once per process, not on every run (coreml/pipeline.py)",
    "coremltools.converters.mil.frontend.milproto.load:_load_value":
        "map weight-file blobs instead of copying them, once for all functions (milexec/loader.py)",
    "coremltools.converters.mil.mil.program:Program.__str__":
        "skip printing the program for the pass pipeline's debug log while that log is off (coreml/pipeline.py)",
    "coremltools.converters.mil.mil.block:Function.__str__":
        "skip printing the function for two passes' debug logs while that log is off (coreml/pipeline.py)",
    "coremltools.converters.mil.mil.passes.defs.cleanup.const_deduplication:np":
        "compare deduplication candidates a chunk at a time instead of allclose on float copies of"
        " whole code tensors (coreml/dedup.py)",
    "coremltools.converters.mil.mil.passes.pass_pipeline:tqdm":
        "show each pass pipeline as a progress stage, or no bar at all during library conversions"
        " (coreml/patches.py: passes_shown_on, pass_bars_hidden)",
}


class UntestedCoremltoolsError(RlxMilError):
    """The installed coremltools is not a version rlx_mil was tested with."""


def coremltools_version() -> tuple[int, int]:
    import coremltools as ct

    parts = str(ct.__version__).split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        raise UntestedCoremltoolsError(f"cannot read the coremltools version {ct.__version__!r}") from None


def require_tested_coremltools() -> None:
    """Raise (or, with RLX_MIL_UNTESTED_COREMLTOOLS=1, warn) unless the installed coremltools is
    a tested release."""
    version = coremltools_version()
    if version in TESTED_COREMLTOOLS:
        return
    tested = ", ".join(f"{a}.{b}.x" for a, b in TESTED_COREMLTOOLS)
    message = (
        f"coremltools {version[0]}.{version[1]} is installed; rlx_mil patches private coremltools internals and"
        f" was tested with {tested} only (install one of those, or set {ALLOW_UNTESTED_ENV}=1 to try anyway)"
    )
    if os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        return
    raise UntestedCoremltoolsError(message)


def resolve(target: str) -> tuple[Any, str]:
    """The object holding a `PATCHES` target's attribute, and the attribute's name."""
    import importlib

    module_name, _, path = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *parents, attribute = path.split(".")
    for name in parents:
        owner = getattr(owner, name)
    if not hasattr(owner, attribute):
        raise UntestedCoremltoolsError(f"coremltools has no {module_name}.{path} (rlx_mil replaces it: {PATCHES[target]})")
    return owner, attribute


def current(target: str) -> Any:
    """What a `PATCHES` target holds now (an installed replacement while one is active)."""
    owner, attribute = resolve(target)
    return owner.__dict__[attribute] if isinstance(owner, type) else getattr(owner, attribute)


@contextmanager
def replaced(target: str, replacement: Any) -> Iterator[None]:
    """While active, the `PATCHES` target holds `replacement`; the original comes back on exit."""
    if target not in PATCHES:
        raise KeyError(f"{target} is not listed in PATCHES")
    require_tested_coremltools()
    owner, attribute = resolve(target)
    original = owner.__dict__[attribute] if isinstance(owner, type) else getattr(owner, attribute)
    setattr(owner, attribute, replacement)
    try:
        yield
    finally:
        setattr(owner, attribute, original)


@contextmanager
def passes_shown_on(progress: Any, after: str = "Core ML conversion") -> Iterator[None]:
    """While active, each coremltools pass pipeline shows on `progress` (an
    `rlx_mil.progress.Progress`) as a stage with a bar per pass; the work between and after the
    pipelines (serialising the program) is the stage `after`, shown when it takes a noticeable
    time."""
    if not progress.enabled:
        yield
        return

    def passes(iterable: Any, desc: str = "", unit: str = "", **_: Any) -> Iterator[Any]:
        items = list(iterable)
        if not items:
            yield from items
            return
        name = desc.replace("Running MIL ", "").replace(" pipeline", "") or "passes"
        progress.begin(f"Core ML passes ({name})", total=len(items), unit=" passes")
        for item in items:
            detail(str(item).rsplit("::", 1)[-1])  # the pass running now
            yield item
            progress.advance()
        progress.end(counted(len(items), "pass", "passes"))
        progress.begin(after, min_seconds=0.1)

    with replaced(_PASS_BARS, passes):
        yield


_PASS_BARS = "coremltools.converters.mil.mil.passes.pass_pipeline:tqdm"


def _no_bar(iterable: Any, *_: Any, **__: Any) -> Iterator[Any]:
    # No bar of its own; the pass running shows beside the running stage's bar, if any.
    for item in iterable:
        detail(f"Core ML pass {str(item).rsplit('::', 1)[-1]}")
        yield item


@contextmanager
def pass_bars_hidden() -> Iterator[None]:
    """While active, coremltools' pass pipelines show no tqdm bar, unless `passes_shown_on`
    shows them as progress stages. (rlx_mil used to set TQDM_DISABLE in the environment for
    this, which silenced every bar of the host application.)"""
    from tqdm import tqdm

    if current(_PASS_BARS) is not tqdm:  # passes_shown_on (or the host) replaced it
        yield
        return
    with replaced(_PASS_BARS, _no_bar):
        yield
