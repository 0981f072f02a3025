"""The types the static pass shares: what a rule sees of its file, and what a check of a file produced.

They live apart from the pipeline that makes them (``engine/check.py``), so that
rules, analyses and the engine all import this module for their types instead
of importing each other (Fixit keeps its shared types in ``ftypes.py`` for the
same reason).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from detaudit.findings import Finding
from detaudit.static.engine.sources import SourceUnit
from detaudit.static.fixes.code import DEFAULT_FIX_STYLE

if TYPE_CHECKING:
    import libcst as cst

    from detaudit.static.analyses import FileAnalyses
    from detaudit.static.engine.facts import FileFacts
    from detaudit.static.rule import RuleHit


@dataclass
class FileResult:
    """Everything a check of one file produced; cached by content hash."""

    path: str  # display path
    findings: list[Finding] = field(default_factory=list)
    suppressed: list[Finding] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)  # one-line notes (unknown rule in a comment, ...)
    #: other files whose content the result depends on (project-local imports): path -> content hash
    dependencies: dict[str, str] = field(default_factory=dict)
    parsed: bool = False
    #: False when part of the file was not analysed (an expression over the
    #: limits, the time budget ran out): a parse-error finding says which; such a
    #: result is never cached (it depends on the budget) and never fixed
    complete: bool = True
    #: detaudit's own failures, one line each ("path: internal error in rule X: ..."): the
    #: check of this file is incomplete, so the run exits 2 and the result is never cached
    internal_errors: list[str] = field(default_factory=list)


@dataclass
class FileContext:
    """What a rule sees of the file it checks."""

    path: Path
    display_path: str
    source: SourceUnit
    module: "cst.Module"
    facts: "FileFacts"
    project_root: Path
    hits: list["RuleHit"] = field(default_factory=list)
    dependencies: dict[str, str] = field(default_factory=dict)
    #: what fixes write: plain torch/numpy/random code, or detaudit's helpers (``fixes.code.FIX_STYLES``)
    fix_style: str = DEFAULT_FIX_STYLE

    @cached_property
    def project(self):
        """The project index (what project-local helpers seed), shared per process."""
        from detaudit.static.analyses.project import project_index

        index = project_index(self.project_root)
        index.enter(self.path, self.facts)  # the search path a run of this file would have
        return index

    @cached_property
    def analyses(self) -> "FileAnalyses":
        """The analyses several rules read (script-ness, run order, seeding,
        determinism), each computed on first use."""
        from detaudit.static.analyses import FileAnalyses

        return FileAnalyses(self)
