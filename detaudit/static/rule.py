"""The rule model, in the style of Fixit: one small class per rule.

A rule states its code, name, severity, a one-line summary, why the hazard hurts
reproducibility (``rationale``), how to fix it, and VALID/INVALID example
snippets that the test suite runs.  Rules share the engine's single tree walk:
a rule may define libcst ``visit_*``/``leave_*`` methods, and/or ``finish()``,
which runs after the walk with the file's complete facts (``self.facts``) and
the analyses several rules share (``self.analyses``).  A rule never imports
another rule: what rules of one family share lives in the family's
``_common.py``, what rules of several families need in
``detaudit.static.analyses``.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import libcst as cst

from detaudit.findings import Severity

if TYPE_CHECKING:
    from detaudit.static.analyses import FileAnalyses
    from detaudit.static.context import FileContext
    from detaudit.static.engine.facts import FileFacts


@dataclass(frozen=True)
class Invalid:
    """An example the rule must report: ``line`` is where the first finding goes;
    ``message`` a substring its message must contain; ``fixed`` the expected code
    after ``--fix`` when the rule offers a fix."""

    code: str
    line: int | None = None
    message: str | None = None
    fixed: str | None = None


@dataclass(frozen=True)
class RuleHit:
    """What a rule reports during a check; the engine turns it into a Finding."""

    rule: type["Rule"]
    node: cst.CSTNode
    message: str
    fix: Any = None  # a detaudit.static.fixes.apply edit, when the rule can fix this hit


RULES: dict[str, type["Rule"]] = {}


class Rule(cst.BatchableCSTVisitor):
    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity] = Severity.WARNING
    summary: ClassVar[str]
    rationale: ClassVar[str]
    fix_hint: ClassVar[str]
    #: Snippets that must not be reported / must be reported (run by the tests).
    VALID: ClassVar[tuple[str, ...]] = ()
    INVALID: ClassVar[tuple[Invalid, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:
            return  # an abstract helper base
        for clash in (cls.code, cls.name):
            if clash in RULES:
                raise TypeError(f"duplicate rule {clash!r}: {cls.__name__} and {RULES[clash].__name__}")
        RULES[cls.code] = cls
        RULES[cls.name] = cls

    def __init__(self, context: "FileContext") -> None:
        super().__init__()
        self.context = context

    @property
    def facts(self) -> "FileFacts":
        return self.context.facts

    @property
    def analyses(self) -> "FileAnalyses":
        """What several rules need to know about the file, computed once (``detaudit.static.analyses``)."""
        return self.context.analyses

    def report(self, node: cst.CSTNode, message: str | None = None, *, fix: Any = None) -> None:
        self.context.hits.append(RuleHit(type(self), node, message or self.summary, fix))

    def finish(self) -> None:
        """Called once after the walk; fact-based rules do their work here."""

    @classmethod
    def has_visitors(cls) -> bool:
        """Whether the rule joins the tree walk (else it only has ``finish``)."""
        for klass in cls.__mro__:
            if klass is Rule:
                return False
            if any(name.startswith(("visit_", "leave_")) for name in vars(klass)):
                return True
        return False

    @classmethod
    def documentation(cls) -> str:
        """The rule's documentation, ruff-style (What it does / Why is this bad? / Example / Use instead)."""
        parts = [
            f"# {cls.code} {cls.name} ({cls.severity.label})",
            "",
            "## What it does",
            cls.summary,
            "",
            "## Why is this bad?",
            textwrap.dedent(cls.rationale).strip(),
        ]
        if cls.INVALID:
            parts += ["", "## Example", "```python", textwrap.dedent(cls.INVALID[0].code).strip(), "```"]
        if cls.VALID:
            parts += ["", "## Use instead", "```python", textwrap.dedent(cls.VALID[0]).strip(), "```"]
        parts += ["", "## How to fix", cls.fix_hint]
        return "\n".join(parts) + "\n"


def all_rules() -> list[type[Rule]]:
    """Every registered rule, sorted by code."""
    import detaudit.static.rules  # noqa: F401  (importing registers the rules)

    return sorted({cls for cls in RULES.values()}, key=lambda cls: cls.code)


def find_rule(selector: str) -> type[Rule] | None:
    all_rules()
    return RULES.get(selector) or RULES.get(selector.upper())


def matches_selector(rule: type[Rule], selector: str) -> bool:
    """``select``/``ignore`` entries name a rule by code, name or code prefix."""
    selector = selector.strip()
    return selector == rule.name or rule.code.startswith(selector.upper()) or selector.upper() == "ALL"
