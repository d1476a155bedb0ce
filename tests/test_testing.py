"""The verification harness itself: comparisons, and that a wrong conversion fails it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlx_mil.ir import ops
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Target
from rlx_mil.testing import ConversionMismatch, Tolerance, check_conversion, compare, supported_targets

TOL = Tolerance(1e-3, 1e-3)


def test_compare_accepts_close_values_and_matching_non_finites() -> None:
    want = np.float32([1.0, np.nan, np.inf, -np.inf, 100.0])
    ok, err, _ = compare(want + np.float32([5e-4, 0, 0, 0, 0.05]), want, TOL)
    assert ok and err == pytest.approx(0.05, rel=1e-3)


@pytest.mark.parametrize(
    "got, message",
    [
        (np.float32([1.0, 2.1]), "worst at (1,)"),
        (np.float32([1.0, np.nan]), "non-finite"),
        (np.float32([1.0, np.inf]), "non-finite"),
        (np.float32([1.0, 2.0, 3.0]), "shape"),
    ],
)
def test_compare_rejects(got: np.ndarray, message: str) -> None:
    ok, _, detail = compare(got, np.float32([1.0, 2.0]), TOL)
    assert not ok and message in detail


def test_compare_requires_nan_where_the_reference_has_nan() -> None:
    ok, _, detail = compare(np.float32([0.0]), np.float32([np.nan]), TOL)
    assert not ok and "reference nan" in detail


def _graph() -> Graph:
    g = Graph("relu")
    x = g.input("x", [6])
    g.set_outputs([g.relu(x, name="y")])
    return g


def test_harness_passes_a_correct_conversion_on_every_target() -> None:
    x = np.float32([-2.0, -0.5, 0.0, 0.5, 2.0, 3.0])
    report = check_conversion(_graph(), {}, {"x": x})
    engines = {c.engine for c in report.checks}
    assert {"milexec", "milexec(saved)"} <= engines
    assert {c.target for c in report.checks} == set(supported_targets(_graph())) == set(Target)
    assert len(report.checks) == len(Target) * 2 * 2


def test_harness_fails_a_wrong_lowering(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_mil.lowering import registry

    rules = registry.registered_rules()
    original = rules[ops.Activation]

    def wrong(op: ops.Activation, ctx: Any) -> Any:
        from coremltools.converters.mil import Builder as mb

        return mb.abs(x=ctx.var(0), name=ctx.name())  # |x| is not relu(x)

    monkeypatch.setitem(registry._RULES, ops.Activation, registry.RuleInfo(
        ops.Activation, wrong, original.family, original.min_target, original.notes))
    with pytest.raises(ConversionMismatch, match="y: max \\|error\\| 2"):
        check_conversion(_graph(), {}, {"x": np.float32([-2.0, -0.5, 0.0, 0.5, 2.0, 3.0])},
                         targets=["iOS17"], precisions=["fp32"])
