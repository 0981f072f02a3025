"""pytest helper: ``assert_deterministic(step)`` fails with the rendered report."""

from __future__ import annotations

import warnings
from typing import Any, Callable


def assert_deterministic(
    step: Callable[[], Any],
    *,
    repeats: int = 3,
    seed: int | None = 0,
    deterministic: bool = False,
    setup: Callable[[], Any] | None = None,
    strict: bool = False,
):
    """Run ``step`` ``repeats`` times with ``detaudit.audit`` and raise
    ``AssertionError`` (with the report) when the runs fail the gate of
    ``detaudit run``: a difference reached the final state, or, with
    ``strict``, a latent difference (read, then vanished before the final
    state), which otherwise only warns.  Returns the report when it passes.  ``setup`` runs before each repeat,
    untraced (see ``audit``).  The pytest plugin (``detaudit.pytest_plugin``)
    builds ``@pytest.mark.deterministic`` and the ``deterministic`` fixture on it."""
    from detaudit.dynamic.audit import audit

    report = audit(step, repeats=repeats, seed=seed, deterministic=deterministic, setup=setup, strict=strict)
    if not report.passed:
        raise AssertionError(report.to_text())
    if not report.deterministic:
        warnings.warn(f"detaudit: {report.verdict_line()}", stacklevel=2)
    return report
