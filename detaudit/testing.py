"""pytest helper: ``assert_deterministic(step)`` fails with the rendered report."""

from __future__ import annotations

from typing import Any, Callable


def assert_deterministic(
    step: Callable[[], Any],
    *,
    repeats: int = 3,
    seed: int | None = 0,
    deterministic: bool = False,
    setup: Callable[[], Any] | None = None,
):
    """Run ``step`` ``repeats`` times with ``detaudit.audit`` and raise
    ``AssertionError`` (with the report) unless every run is bitwise identical.
    Returns the report when it passes.  ``setup`` runs before each repeat,
    untraced (see ``audit``).  The pytest plugin (``detaudit.pytest_plugin``)
    builds ``@pytest.mark.deterministic`` and the ``deterministic`` fixture on it."""
    from detaudit.dynamic.audit import audit

    report = audit(step, repeats=repeats, seed=seed, deterministic=deterministic, setup=setup)
    if not report.deterministic:
        raise AssertionError(report.to_text())
    return report
