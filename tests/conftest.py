"""Shared test set-up: quiet coremltools, hypothesis profiles, the shared/ fixtures path.

No collector set-up: `rlx_mil.convert` keeps the objects alive before a conversion out of
coremltools' closing gc.collect() itself (`rlx_mil.api.objects_frozen`). Freezing the
heap around every test as well would make each conversion slower, not faster:
`gc.get_freeze_count()`, which that check calls, walks every frozen object (~45 ms a
conversion with the test session's heap frozen)."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

# Both must happen before coremltools is imported anywhere (its logger and tqdm bars).
os.environ.setdefault("TQDM_DISABLE", "1")
# Before NumPy loads: one OpenBLAS thread per test process. The suite runs one xdist worker per
# core, and OpenBLAS threads that find their cores busy spin against each other (a 16-layer
# decoder in the executor: 2.7 s alone, 30-45 s beside 5 busy processes, 8 s with one thread).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# Core AI programs checked in a child process are remembered for this run only, not in ~/.cache.
os.environ.setdefault("RLX_MIL_COREAI_CHECKED", "")
# Bytecode is written even where the environment says not to (PYTHONDONTWRITEBYTECODE, as on CI's
# machines): otherwise every process of the run compiles rlx_mil's and the tests' sources anew,
# the xdist workers each and every CLI or Core AI child process a test starts (about 0.5 s of
# CPU each). The files go to the ignored __pycache__ folders.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
logging.getLogger("coremltools").setLevel(logging.ERROR)
# Ctrl-C reaches the commands the tests start as it reaches a user's: a run started as a
# shell script's background job (`pytest ... &` without job control) has SIGINT ignored, every
# child inherits that, and rlx-mil rightly leaves an ignored SIGINT ignored
# (`rlx_mil/__init__.py`): the Ctrl-C tests' children then never saw their signal, finished
# their work and exited 0.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

if TYPE_CHECKING:
    from catalogue import CatalogueModels

settings.register_profile(
    "quick", max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
settings.register_profile(
    "thorough", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("RLX_MIL_HYPOTHESIS_PROFILE", "quick"))

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DIR = Path(os.environ.get("RLX_MIL_SHARED_DIR", REPO_ROOT.parent / "shared"))
UPSTREAM_JSON_DIR = SHARED_DIR / "fixtures" / "upstream-json"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Where RLX_MIL_REQUIRE_COREAI is set (`.ci/run` sets it: the README's test command
    installs the coreai extra), a missing Core AI ends the run as a failure instead of letting
    the Core AI tests skip themselves (`pytest.importorskip("coreai")`)."""
    if not os.environ.get("RLX_MIL_REQUIRE_COREAI"):
        return
    import importlib.util

    if sys.version_info < (3, 11) or importlib.util.find_spec("coreai") is None:
        pytest.exit("RLX_MIL_REQUIRE_COREAI is set but Apple's Core AI is not importable: install the coreai extra"
                    ' (pip install -e ".[coreai]", Python >= 3.11)', returncode=1)


def upstream_fixture_paths() -> list[Path]:
    if not UPSTREAM_JSON_DIR.is_dir():
        return []
    return sorted(UPSTREAM_JSON_DIR.glob("*.json"))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Free the session's models and remove the conversions' scratch folder while an xdist
    worker still counts as running (after the fixtures' teardown, before it reports that it has
    finished). Left to pytest's closing gc.collect() and to `atexit`, this ran after the report:
    the controller then shuts the worker down, and execnet sends a worker still busy after 5 s a
    SIGINT (a KeyboardInterrupt traceback from whatever it lands in, hypothesis' gc callback
    included) and ends it with os._exit 10 s later, no `atexit` run: coremltools' temporary
    packages stayed in the temporary folder (hundreds of MB on a loaded machine)."""
    import gc

    gc.collect()
    scratch = sys.modules.get("rlx_mil.coreml.scratch")
    if scratch is not None:
        scratch.remove_scratch_dir()


@pytest.fixture
def upstream_json_dir() -> Path:
    if not UPSTREAM_JSON_DIR.is_dir():
        pytest.skip(f"upstream JSON fixtures not found at {UPSTREAM_JSON_DIR} (../shared/ is absent)")
    return UPSTREAM_JSON_DIR


#: The `catalogue_models` of this test process while the session fixture lives.
_CATALOGUES: list[CatalogueModels] = []


@pytest.fixture(scope="session")
def catalogue_models() -> Iterator[CatalogueModels]:
    """The catalogue's conversions and lowerings, made once per test process (see
    `catalogue.CatalogueModels`); tests using it carry `pytest.mark.xdist_group(CATALOGUE_GROUP)`."""
    from catalogue import CatalogueModels

    models = CatalogueModels()
    _CATALOGUES.append(models)
    yield models
    _CATALOGUES.remove(models)
    models.close()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Under `--dist loadgroup` the tests sharing `catalogue_models` are one xdist group: one
    worker runs them one after the other. After the last of them that worker lets go of the
    models. Kept to the end of the run they were a large part of the worker's heap, which every
    full collection rescans: the gc.collect() after each failed conversion
    (`rlx_mil.coreml.scratch`), Python's own, the tests' (~1 s each with them, ~0.15 s
    without). A test that asks for them again still gets them: `CatalogueModels` converts on
    demand."""
    if not _CATALOGUES or not getattr(item.config.option, "loadgroup", False):  # loadgroup: set on xdist's workers
        return
    if "catalogue_models" in getattr(item, "fixturenames", ()) and (
            nextitem is None or "catalogue_models" not in getattr(nextitem, "fixturenames", ())):
        for models in _CATALOGUES:
            models.close()


#: Fixture scopes whose value one test process makes once and its tests then share.
_SHARED_SCOPES = frozenset({"class", "module", "package"})


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    """Under `--dist loadgroup` each ungrouped test is its own unit of work, so the tests of one
    module land on every worker, and every worker would make the module's shared fixtures (a
    converted package, a checkpoint) once more. A test using a module- or class-scoped fixture
    joins its module's xdist group instead: the module's tests that share one run on one worker,
    which makes the fixture once. Tests already in a group keep theirs.

    xdist (3.8) tells its scheduler a test's group by appending `@group` to the test's node id
    through `item._nodeid`, which pytest 9 no longer reads (pytest-dev/pytest-xdist#1386): every
    group was silently ignored, and each worker made the catalogue's conversions. After xdist's
    hook, a grouped test whose id still lacks the suffix gets it here."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        if any(defs and defs[-1].scope in _SHARED_SCOPES for defs in info.name2fixturedefs.values()):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    yield
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers under --dist loadgroup
        return
    try:
        from _pytest.nodeid import NodeId  # pytest 9's node ids; absent before and maybe after
    except ImportError:
        return  # groups then work as xdist itself sets them (or are ignored: slower, still correct)
    for item in items:
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
        suffix = "@" + "_".join(sorted(names))
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = NodeId.parse(item.nodeid + suffix)
