"""Human output (rich): colours only on a terminal, never wrapped into the pipe."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Callable, Sequence, TextIO

from rich.console import Console
from rich.markup import escape

from detaudit.findings import Finding, Severity

_STYLES = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def make_console(stream: TextIO | None = None) -> Console:
    return Console(file=stream or sys.stdout, highlight=False, soft_wrap=True)


def render_findings(
    console: Console,
    findings: Sequence[Finding],
    source_line: Callable[[Finding], str | None],
    *,
    show_reason: bool = False,
) -> None:
    """Each finding as ``path:line:col CODE name message``, its source line and a caret;
    findings of one file stay together, files are separated by a blank line."""
    previous_path = None
    for finding in findings:
        if previous_path is not None and finding.path != previous_path:
            console.print()
        previous_path = finding.path
        style = _STYLES[finding.severity]
        console.print(
            f"[bold]{escape(finding.location)}[/bold] [{style}]{finding.code}[/{style}] "
            f"[{style}]{finding.name}[/{style}] {escape(finding.message)}"
        )
        line = source_line(finding)
        if line is not None and finding.line:
            number = str(finding.line)
            console.print(f"[dim]{number} |[/dim] {escape(line.rstrip())}")
            caret_at = max(finding.column, 1) - 1
            console.print(f"[dim]{' ' * len(number)} |[/dim] {' ' * caret_at}[{style}]^[/{style}]")
        if finding.fix_hint:
            console.print(f"[dim]  fix: {escape(finding.fix_hint)}[/dim]")
        if show_reason and finding.suppressed_reason is not None:
            reason = finding.suppressed_reason or "(no reason given)"
            console.print(f"[dim]  suppressed: {escape(reason)}[/dim]")


def summary_line(files_checked: int, findings: Sequence[Finding], suppressed: int, elapsed: float, errors: int = 0) -> str:
    """``errors``: problems that made the check incomplete (listed on stderr), so that
    "no findings" is never read as a clean pass."""
    counts = Counter(f.name for f in findings)
    files = f"{files_checked} file{'s' if files_checked != 1 else ''}"
    if not findings:
        text = f"Checked {files} in {elapsed:.2f}s: no findings."
    else:
        by_rule = ", ".join(f"{n} {name}" for name, n in counts.most_common())
        total = len(findings)
        text = f"Checked {files} in {elapsed:.2f}s: {total} finding{'s' if total != 1 else ''} ({by_rule})."
    if suppressed:
        text += f" {suppressed} suppressed."
    if errors:
        text += f" Incomplete: {errors} error{'s' if errors != 1 else ''} (see above)."
    return text
