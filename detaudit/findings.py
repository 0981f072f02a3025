"""The one result model shared by the static and the dynamic pass.

Every output format (text, JSON, SARIF, GitHub annotations) is written from
``Finding`` objects, so a static rule hit and a dynamic root cause are reported
the same way wherever they land.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class Severity(enum.IntEnum):
    """Ordered so that ``finding.severity >= fail_on`` decides the exit code."""

    INFO = 10
    WARNING = 20
    ERROR = 30

    @classmethod
    def parse(cls, text: str) -> "Severity":
        try:
            return cls[text.strip().upper()]
        except KeyError:
            choices = ", ".join(s.label for s in cls)
            raise ValueError(f"unknown severity {text!r} (choose from {choices})") from None

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class TextEdit:
    """Replace the text from (``line``, ``column``) up to (``end_line``,
    ``end_column``), end excluded, by ``text``; 1-based, columns in code points.
    An empty range inserts ``text`` there."""

    line: int
    column: int
    end_line: int
    end_column: int
    text: str


@dataclass(frozen=True)
class SuggestedFix:
    """A safe fix of one finding as edits of its file's text, each made against
    the file as it is (what ``--fix`` would change for this finding alone)."""

    description: str
    edits: tuple[TextEdit, ...]


@dataclass(frozen=True)
class Finding:
    """One reported problem, located in a source file.

    Lines and columns are 1-based (0 when unknown, e.g. a whole-run finding).
    ``cell`` is the 1-based notebook cell when ``path`` is an ``.ipynb``;
    ``line`` is then relative to that cell.  ``details`` carries pass-specific
    facts (the dynamic pass puts kind/op/module/phase/seen/max_abs_diff there).
    ``fix``: a safe fix an editor or code scanning can offer, when the report
    asked for one (SARIF).
    """

    code: str
    name: str
    severity: Severity
    message: str
    path: str
    line: int = 0
    column: int = 0
    end_line: int = 0
    end_column: int = 0
    fix_hint: str = ""
    cell: int | None = None
    details: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    suppressed_reason: str | None = field(default=None, compare=False, hash=False)
    fix: SuggestedFix | None = field(default=None, compare=False, hash=False)

    @property
    def location(self) -> str:
        """``path:line:col`` (``path:cell N:line:col`` for notebooks)."""
        where = self.path if self.cell is None else f"{self.path}:cell {self.cell}"
        if self.line:
            return f"{where}:{self.line}:{self.column or 1}"
        return where

    def sort_key(self) -> tuple:
        return (self.path, self.cell or 0, self.line, self.column, self.code)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["severity"] = self.severity.label
        data.pop("suppressed_reason")
        if self.fix is None:
            data.pop("fix")
        if self.cell is None:
            data.pop("cell")
        if not self.details:
            data.pop("details")
        return data
