"""Machine-readable output of ``detaudit check --format json``."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from detaudit import __version__
from detaudit.findings import Finding


def check_report(
    findings: Sequence[Finding],
    *,
    files_checked: int,
    suppressed: Sequence[Finding],
    messages: Sequence[str],
    elapsed: float,
    errors: Sequence[str] = (),
    project_roots: Sequence[dict] = (),
) -> dict:
    """``summary.errors`` lists what made the check incomplete (a path that does
    not exist, an internal error): the command exits 2 when it is not empty.
    ``project_roots``: where the files' project modules were resolved from, and
    what gave each root away (``{"path", "found_by"}``)."""
    return {
        "version": __version__,
        "files_checked": files_checked,
        "project_roots": list(project_roots),
        "findings": [f.to_dict() for f in findings],
        "summary": {
            "findings": len(findings),
            "by_rule": dict(Counter(f.name for f in findings).most_common()),
            "by_severity": dict(Counter(f.severity.label for f in findings).most_common()),
            "suppressed": len(suppressed),
            "messages": list(messages),
            "errors": list(errors),
            "elapsed_s": round(elapsed, 4),
        },
    }
