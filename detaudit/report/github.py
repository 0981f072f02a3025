"""GitHub Actions workflow-command annotations (``::warning file=...::msg``)."""

from __future__ import annotations

from typing import Sequence

from detaudit.findings import Finding, Severity

_COMMANDS = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotations(findings: Sequence[Finding], *, errors: Sequence[str] = ()) -> str:
    """One annotation per finding, and one ``::error::`` per problem that made the run incomplete."""
    lines = [f"::error title=detaudit::{_escape_data(error)}" for error in errors]
    for finding in findings:
        props = [f"file={_escape_property(finding.path)}"]
        if finding.line and finding.cell is None:
            props.append(f"line={finding.line}")
            if finding.column:
                props.append(f"col={finding.column}")
            if finding.end_line:
                props.append(f"endLine={finding.end_line}")
        props.append(f"title={_escape_property(f'{finding.code} {finding.name}')}")
        where = f"cell {finding.cell}, line {finding.line}: " if finding.cell is not None else ""
        message = f"{where}{finding.message}"
        if finding.fix_hint:
            message += f" Fix: {finding.fix_hint}"
        lines.append(f"::{_COMMANDS[finding.severity]} {','.join(props)}::{_escape_data(message)}")
    return "\n".join(lines) + ("\n" if lines else "")


def github_message(level: str, message: str, *, path: str | None = None, title: str | None = None) -> str:
    """One annotation that is not a finding (a run that failed, a warning
    about the run); ``level`` is "error", "warning" or "notice"."""
    props = [f"file={_escape_property(path)}"] if path else []
    if title:
        props.append(f"title={_escape_property(title)}")
    return f"::{level}{' ' + ','.join(props) if props else ''}::{_escape_data(message)}\n"
