"""pytest helpers: ``assert_deterministic(step)`` and
``assert_matches_reference(step, folder)`` fail with the rendered report."""

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


def assert_matches_reference(
    step: Callable[[], Any],
    folder,
    *,
    tolerance: str | None = None,
    save: bool = False,
    seed: int | None = 0,
    deterministic: bool = False,
    setup: Callable[[], Any] | None = None,
    strict: bool = False,
):
    """A numerics regression test: run ``step`` once, traced, and raise
    ``AssertionError`` (with the report: the drift roots, their lines and
    modules, the environment differences) unless it gives bitwise the results
    of the reference in ``folder`` (``detaudit.audit(reference=...)``), or
    results within ``tolerance`` (``"4ulp"``, ``"1e-6"``).  ``save=True``
    writes the reference instead (two runs, which must agree): the way to
    make it the first time and to refresh it deliberately.  A missing
    reference fails, saying how to write it.  Returns the report."""
    from pathlib import Path

    from detaudit.dynamic.audit import audit

    if save:
        report = audit(step, repeats=2, seed=seed, deterministic=deterministic, setup=setup, save_reference=str(folder))
        if not report.deterministic:
            raise AssertionError(f"the reference was not saved as written: the step is not reproducible here\n{report.to_text()}")
        return report
    if not (Path(folder) / "manifest.json").is_file():
        raise AssertionError(
            f"no reference in {folder}: write it with assert_matches_reference(..., save=True) "
            "(in pytest: --detaudit-save-references)"
        )
    report = audit(step, repeats=1, seed=seed, deterministic=deterministic, setup=setup, strict=strict,
                   reference=str(folder), tolerance=tolerance)
    if not report.passed:
        raise AssertionError(report.to_text())
    return report
