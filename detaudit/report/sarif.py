"""SARIF 2.1.0 output, written once for static and dynamic findings.

Columns are Unicode code points (``columnKind``), as detaudit counts them.  A
finding with a safe fix (``Finding.fix``) carries it in ``fixes``, for code
scanning and editors to offer: each replacement deletes a region of the file
as it is and inserts the new text there.
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence

from detaudit import __version__
from detaudit.findings import Finding, Severity

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVELS = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
INFORMATION_URI = "https://github.com/detaudit/detaudit"


class RuleMetadata(Protocol):
    code: str
    name: str
    severity: Severity
    summary: str
    fix_hint: str


def invocation(successful: bool, notifications: Sequence[tuple[str, str]] = ()) -> dict:
    """A SARIF invocation: whether the tool ran to its end, and what it says
    about the run itself rather than about the code, as (level, text) pairs
    with level "error", "warning" or "note"."""
    result: dict = {"executionSuccessful": successful}
    if notifications:
        result["toolExecutionNotifications"] = [
            {"level": level, "message": {"text": text}} for level, text in notifications
        ]
    return result


def to_sarif(findings: Sequence[Finding], rules: Iterable[RuleMetadata], *, run_invocation: dict | None = None) -> dict:
    """One SARIF run; every rule that appears in ``findings`` is described once
    (GitHub rejects uploads with duplicate rule ids).  ``run_invocation`` (see
    ``invocation``) says whether detaudit itself ran to its end."""
    used = {f.code for f in findings}
    descriptors = []
    index_of: dict[str, int] = {}
    for rule in sorted(rules, key=lambda r: r.code):
        if rule.code not in used or rule.code in index_of:
            continue
        index_of[rule.code] = len(descriptors)
        descriptors.append(
            {
                "id": rule.code,
                "name": rule.name,
                "shortDescription": {"text": rule.summary},
                "help": {"text": rule.fix_hint or rule.summary},
                "defaultConfiguration": {"level": _LEVELS[rule.severity]},
            }
        )
    results = []
    for finding in findings:
        region = {"startLine": max(finding.line, 1), "startColumn": max(finding.column, 1)}
        if finding.end_line:
            region["endLine"] = finding.end_line
            region["endColumn"] = max(finding.end_column, 1)
        result = {
            "ruleId": finding.code,
            "level": _LEVELS[finding.severity],
            "message": {"text": _message(finding)},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": _uri(finding.path)},
                        "region": region,
                    }
                }
            ],
        }
        if finding.code in index_of:
            result["ruleIndex"] = index_of[finding.code]
        if finding.cell is not None:
            result["properties"] = {"notebookCell": finding.cell}
        if finding.fix is not None:
            result["fixes"] = [_fix(finding)]
        results.append(result)
    run: dict = {
        "tool": {
            "driver": {
                "name": "detaudit",
                "version": __version__,
                "informationUri": INFORMATION_URI,
                "rules": descriptors,
            }
        },
        "results": results,
        "columnKind": "unicodeCodePoints",
    }
    if run_invocation is not None:
        run["invocations"] = [run_invocation]
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def _fix(finding: Finding) -> dict:
    replacements = [
        {
            "deletedRegion": {"startLine": e.line, "startColumn": e.column, "endLine": e.end_line, "endColumn": e.end_column},
            "insertedContent": {"text": e.text},
        }
        for e in finding.fix.edits
    ]
    return {
        "description": {"text": finding.fix.description},
        "artifactChanges": [{"artifactLocation": {"uri": _uri(finding.path)}, "replacements": replacements}],
    }


def _uri(path: str) -> str:
    return path.replace("\\", "/")


def _message(finding: Finding) -> str:
    prefix = f"cell {finding.cell}: " if finding.cell is not None else ""
    hint = f" Fix: {finding.fix_hint}" if finding.fix_hint else ""
    return f"{prefix}{finding.name}: {finding.message}{hint}"
