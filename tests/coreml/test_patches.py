"""rlx_mil's changes to coremltools internals: all in rlx_mil/coreml/patches.py, each target
present in the installed coremltools, and refused on an untested coremltools."""

from __future__ import annotations

import ast
from pathlib import Path

import coremltools as ct
import pytest

import rlx_mil
from rlx_mil.coreml import patches

PACKAGE_ROOT = Path(rlx_mil.__file__).parent


@pytest.mark.parametrize("target", sorted(patches.PATCHES))
def test_every_patched_attribute_exists(target: str) -> None:
    owner, attribute = patches.resolve(target)
    assert hasattr(owner, attribute)


def test_the_installed_coremltools_is_a_tested_one() -> None:
    assert patches.coremltools_version() in patches.TESTED_COREMLTOOLS
    pyproject = (PACKAGE_ROOT.parent / "pyproject.toml").read_text()
    newest = max(patches.TESTED_COREMLTOOLS)
    assert f"coremltools>=9.0,<{newest[0]}.{newest[1] + 1}" in pyproject, "the dependency bound follows TESTED_COREMLTOOLS"


def test_an_untested_coremltools_is_refused_before_anything_is_patched(monkeypatch: pytest.MonkeyPatch) -> None:
    from coremltools.models import model as ct_model

    real = ct_model._shutil
    monkeypatch.setattr(ct, "__version__", "10.2")
    monkeypatch.delenv(patches.ALLOW_UNTESTED_ENV, raising=False)
    with pytest.raises(patches.UntestedCoremltoolsError, match=r"coremltools 10.2 is installed.*tested with 9.0.x"):
        with patches.replaced("coremltools.models.model:_shutil", object()):
            pass
    assert ct_model._shutil is real
    monkeypatch.setenv(patches.ALLOW_UNTESTED_ENV, "1")
    marker = object()
    with pytest.warns(RuntimeWarning, match="coremltools 10.2"), patches.replaced("coremltools.models.model:_shutil", marker):
        assert ct_model._shutil is marker
    assert ct_model._shutil is real


def test_an_unlisted_target_is_refused() -> None:
    with pytest.raises(KeyError, match="not listed"), patches.replaced("coremltools.models.model:MLModel", None):
        pass


def _coremltools_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("coremltools")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("coremltools"):
            names |= {a.asname or a.name for a in node.names}
    return names


def _assigned_attributes(tree: ast.AST, names: set[str]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        for target in targets:
            base = target
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(target, ast.Attribute) and isinstance(base, ast.Name) and base.id in names:
                found.append(f"line {target.lineno if hasattr(target, 'lineno') else node.lineno}: {ast.unparse(target)}")
    return found


def test_no_other_module_assigns_to_coremltools() -> None:
    offenders = {}
    for path in PACKAGE_ROOT.rglob("*.py"):
        if path == PACKAGE_ROOT / "coreml" / "patches.py":
            continue
        text = path.read_text()
        if "coremltools" not in text:  # nothing of coremltools imported: nothing to assign to
            continue
        tree = ast.parse(text)
        found = _assigned_attributes(tree, _coremltools_names(tree))
        if found:
            offenders[str(path.relative_to(PACKAGE_ROOT))] = found
    assert not offenders, f"coremltools attributes assigned outside coreml/patches.py: {offenders}"


def test_the_assignment_check_finds_one() -> None:
    tree = ast.parse("from coremltools.models import model as m\nm._shutil = 1\nimport coremltools as ct\nsetattr(ct, 'x', 2)\n")
    assert len(_assigned_attributes(tree, _coremltools_names(tree))) == 2
