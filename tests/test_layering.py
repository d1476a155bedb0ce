"""The package's import structure: no cycles anywhere, each pipeline stage imports only the
stages below it, and every module stays small.

Imports are read from the source (function-level imports and imports under `TYPE_CHECKING`
count: a type-only edge still ties two stages together). `from a import b` is an edge to the
module `a.b` where there is one, else to `a` itself: taking a name from a parent package's
`__init__` (`from rlx_mil import convert` inside the package) is an edge like any other.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import rlx_mil

PACKAGE_ROOT = Path(rlx_mil.__file__).parent
MAX_LINES = 600

#: Shared modules with no rlx_mil imports beyond each other; any stage, the IR included, may use
#: them. They sit below the IR: one importing the IR would let an IR module reach back up
#: through it (what the IR needs of names and values lives in `rlx_mil.ir.naming` / `.values`).
SHARED = ("rlx_mil.errors", "rlx_mil.fileio", "rlx_mil.interrupts", "rlx_mil.progress", "rlx_mil.version", "rlx_mil.units",
          "rlx_mil.mil_walk")

#: stage -> the stages it must not import (besides `rlx_mil.cli`, which nothing imports).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "rlx_mil.ir": ("rlx_mil.reference", "rlx_mil.lowering", "rlx_mil.coreml", "rlx_mil.compress", "rlx_mil.milexec",
                   "rlx_mil.models", "rlx_mil.llm", "rlx_mil.speech", "rlx_mil.weights", "rlx_mil.api", "rlx_mil.testing", "rlx_mil.coreai"),
    "rlx_mil.reference": ("rlx_mil.lowering", "rlx_mil.coreml", "rlx_mil.compress", "rlx_mil.milexec",
                          "rlx_mil.models", "rlx_mil.llm", "rlx_mil.speech", "rlx_mil.weights", "rlx_mil.api", "rlx_mil.testing", "rlx_mil.coreai"),
    "rlx_mil.lowering": ("rlx_mil.coreml", "rlx_mil.compress", "rlx_mil.milexec", "rlx_mil.models", "rlx_mil.llm", "rlx_mil.speech",
                         "rlx_mil.api", "rlx_mil.testing", "rlx_mil.coreai"),
    "rlx_mil.coreml": ("rlx_mil.milexec", "rlx_mil.models", "rlx_mil.llm", "rlx_mil.speech", "rlx_mil.api",
                       "rlx_mil.testing", "rlx_mil.coreai"),
    "rlx_mil.compress": ("rlx_mil.coreml", "rlx_mil.models", "rlx_mil.llm", "rlx_mil.speech", "rlx_mil.api",
                         "rlx_mil.testing", "rlx_mil.coreai"),
    # The executor reads packages, so it may use coreml's package readers (coreml never imports it).
    "rlx_mil.milexec": ("rlx_mil.lowering", "rlx_mil.compress", "rlx_mil.models", "rlx_mil.llm", "rlx_mil.speech",
                        "rlx_mil.api", "rlx_mil.testing", "rlx_mil.coreai"),
    "rlx_mil.weights": ("rlx_mil.lowering", "rlx_mil.coreml", "rlx_mil.compress", "rlx_mil.milexec",
                        "rlx_mil.models", "rlx_mil.llm", "rlx_mil.speech", "rlx_mil.api", "rlx_mil.testing", "rlx_mil.coreai"),
    # Core AI, coreml's sibling, reads the final MIL program (with milexec's package readers) and
    # runs it on Apple's runtime; it never sees the IR's lowering or the model builders.
    "rlx_mil.coreai": ("rlx_mil.lowering", "rlx_mil.compress", "rlx_mil.models", "rlx_mil.llm", "rlx_mil.speech",
                       "rlx_mil.api", "rlx_mil.testing"),
    # rlx_mil.testing (the verification harness: tolerances, tie-aware greedy comparison) sits
    # above the conversion stages; the checkpoint verifiers of models/ and llm/ use it.
    "rlx_mil.models": ("rlx_mil.llm", "rlx_mil.speech"),
    # speech (transcription over Whisper packages) sits beside llm; llm never imports it.
    "rlx_mil.llm": ("rlx_mil.speech",),
}
#: What the IR may import of rlx_mil besides itself; the shared modules import only each other.
IR_MAY_IMPORT = SHARED


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, module: str, is_package: bool, modules: set[str]) -> Iterator[str]:
    """The modules `module` takes names from (function-level and TYPE_CHECKING imports too):
    `import a.b` and `from a import b` (b a module) take from `a.b`; `from a import name`
    takes from `a` itself, a parent package's `__init__` included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base


@functools.cache  # parsed once per test process; the tests only read it
def import_graph() -> dict[str, set[str]]:
    """module -> the rlx_mil modules it takes names from."""
    paths = {_module_name(p): p for p in PACKAGE_ROOT.rglob("*.py")}
    modules = set(paths)
    edges: dict[str, set[str]] = {}
    for module, path in paths.items():
        named = _imports(ast.parse(path.read_text()), module, path.name == "__init__.py", modules)
        edges[module] = {t for t in named if t in modules and t != module}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[Sequence[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[Sequence[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _within(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


def layering_violations(edges: dict[str, set[str]]) -> list[str]:
    problems = []
    for module, targets in sorted(edges.items()):
        for target in sorted(targets):
            if _within(target, "rlx_mil.cli") and not _within(module, "rlx_mil.cli"):
                problems.append(f"{module} imports {target}: nothing imports the command line")
            for room, forbidden in FORBIDDEN.items():
                if _within(module, room) and any(_within(target, f) for f in forbidden):
                    problems.append(f"{module} imports {target}: {room} may not import it")
            if target == "rlx_mil" and module != "rlx_mil":
                problems.append(f"{module} takes names from the package root (import the module defining them)")
            elif module.startswith(target + "."):
                # A package's __init__ loads (or finds) its modules; one of them taking names back
                # from it closes a loop (the model families' registry has a module of its own).
                problems.append(f"{module} takes names from its own package {target} (import the module defining them)")
        if module in SHARED:
            bad = [t for t in targets if t not in SHARED]
            problems.extend(f"{module} imports {t}: the shared modules import only each other" for t in bad)
        elif _within(module, "rlx_mil.ir"):
            bad = [t for t in targets if t not in IR_MAY_IMPORT and not _within(t, "rlx_mil.ir")]
            problems.extend(f"{module} imports {t}: the IR imports only itself and the shared modules" for t in bad)
    return problems


def test_the_package_has_no_import_cycles() -> None:
    edges = import_graph()
    assert "rlx_mil.ir.json_io" in edges and "rlx_mil.lowering.program" in edges and "rlx_mil.cli.main" in edges
    found = cycles(edges)
    assert not found, f"import cycles: {found}"


def test_each_stage_imports_only_the_stages_below_it() -> None:
    problems = layering_violations(import_graph())
    assert not problems, "layering violations:\n" + "\n".join(problems)


def test_the_checks_find_what_they_look_for() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    edges = {
        "rlx_mil.lowering.program": {"rlx_mil.coreml.pipeline"},
        "rlx_mil.models.decoder": {"rlx_mil.cli.main"},
        "rlx_mil.compress.emit": {"rlx_mil.coreml.saving"},
        "rlx_mil.lowering.context": {"rlx_mil.compress.plan"},
        "rlx_mil.ir.graph": {"rlx_mil.reference.registry"},
        "rlx_mil.reference.norm": {"rlx_mil"},
        "rlx_mil.models.families.llama": {"rlx_mil.models.families"},
        "rlx_mil.fileio": {"rlx_mil.ir.graph"},
        "rlx_mil.ir.cut": {"rlx_mil.lowering.context"},
    }
    found = "\n".join(layering_violations(edges))
    for module in edges:
        assert module in found, module
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlx_mil.coreml import saving\n")
    assert "rlx_mil.coreml.saving" in set(_imports(tree, "rlx_mil.lowering.x", False, {"rlx_mil.coreml.saving"}))
    tree = ast.parse("from rlx_mil import convert, milexec\n")
    assert set(_imports(tree, "rlx_mil.models.x", False, {"rlx_mil", "rlx_mil.milexec"})) == {"rlx_mil", "rlx_mil.milexec"}


def test_the_ir_reaches_no_module_that_reaches_back_into_it() -> None:
    """Every module the IR imports, directly or through others, is an IR or shared module; so no
    path leaves the IR and comes back (as `ir.cut` -> `naming` -> `ir.graph` once did)."""
    edges = import_graph()
    seen: set[str] = set()
    todo = [m for m in edges if _within(m, "rlx_mil.ir")]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(edges.get(module, ()))
    outside = sorted(m for m in seen if not _within(m, "rlx_mil.ir") and m not in SHARED)
    assert not outside, f"the IR reaches {outside}"
    assert not [m for m in seen if m in SHARED and any(_within(t, "rlx_mil.ir") for t in edges[m])]


def test_model_families_register_through_a_module_of_their_own() -> None:
    edges = import_graph()
    families = [m for m in edges if m.startswith("rlx_mil.models.families.")]
    assert len(families) >= 10
    for module in families:
        assert "rlx_mil.models.families" not in edges[module], module
    assert not any(_within(t, "rlx_mil.models.families") for t in edges["rlx_mil.models.family_registry"])


def _all_modules() -> list[Path]:
    return sorted(PACKAGE_ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", _all_modules(), ids=lambda p: str(p.relative_to(PACKAGE_ROOT)))
def test_every_module_stays_small(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"rlx_mil/{path.relative_to(PACKAGE_ROOT)} has {lines} lines (at most {MAX_LINES})"
