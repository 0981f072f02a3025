"""Checking one file: pre-filter, parse, one shared walk, positions, suppressions.

Speed matters (a pre-commit hook runs this on every commit), so the engine
- skips files whose text cannot matter before importing or running libcst,
- walks each tree once: the fact collector and every rule with visitor methods
  share a batched walk, and most rules only read the collected facts,
- resolves names with its own import table (``names.py``), and
- locates reported nodes by their own text, falling back to libcst's
  PositionProvider (about twice the parse) only for ambiguous nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from detaudit.findings import Finding
from detaudit.static.sources import SourceUnit, UnreadableSource, read_source

if TYPE_CHECKING:
    import libcst as cst

    from detaudit.static.facts import FileFacts
    from detaudit.static.rule import Rule, RuleHit

#: A file that mentions none of these cannot hold a finding of any rule
#: (framework names count: ``import lightning as L; L.Trainer(benchmark=True)``).
RELEVANT_SUBSTRINGS = ("torch", "numpy", "random", "tensorflow", "keras", "jax", "lightning", "transformers", "accelerate")

PARSE_ERROR_CODE = "DET000"

_SUPPRESSION = re.compile(
    r"#\s*detaudit:\s*ignore(?:\[(?P<rules>[^\]]*)\])?(?:\s*--\s*(?P<reason>.*))?", re.IGNORECASE
)
_NOQA = re.compile(r"#\s*noqa:\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)", re.IGNORECASE)


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

    @property
    def project(self):
        """The project index (what project-local helpers seed), shared per process."""
        from detaudit.static.project import project_index

        return project_index(self.project_root)


def might_matter(text: str) -> bool:
    return any(s in text for s in RELEVANT_SUBSTRINGS)


def check_source(
    text: str,
    path: Path | str = "<snippet>.py",
    *,
    rules: Iterable[type["Rule"]] | None = None,
    project_root: Path | None = None,
) -> FileResult:
    """Check Python ``text`` as if it were the file ``path`` (used by tests and examples)."""
    return analyse_source(text, path, rules=rules, project_root=project_root)[0]


def analyse_source(
    text: str,
    path: Path | str,
    *,
    rules: Iterable[type["Rule"]] | None = None,
    project_root: Path | None = None,
) -> tuple[FileResult, FileContext | None]:
    """Check ``text`` and keep what the check saw: the tree, its facts and the
    rule hits with their edits (``--fix`` needs them; a FileResult drops them).
    The context is None when the file was not parsed."""
    path = Path(path)
    return _check_unit(SourceUnit(text), path, str(path), project_root or path.parent, rules)


def check_file(path: Path, display_path: str, project_root: Path, data: bytes | None = None) -> FileResult:
    """Check one file on disk; never raises for a bad file."""
    try:
        if data is None:
            data = path.read_bytes()
        unit = read_source(path, data)
    except OSError as error:
        return _unreadable(display_path, f"cannot read: {error.strerror or error}")
    except UnreadableSource as error:
        return _unreadable(display_path, str(error))
    return _check_unit(unit, path, display_path, project_root, None)[0]


def _unreadable(display_path: str, reason: str) -> FileResult:
    from detaudit.static.rules.parse_error import ParseError

    return FileResult(display_path, findings=[ParseError.finding(display_path, reason)])


def _check_unit(
    unit: SourceUnit,
    path: Path,
    display_path: str,
    project_root: Path,
    rules: Iterable[type["Rule"]] | None,
) -> tuple[FileResult, FileContext | None]:
    result = FileResult(display_path)
    if not might_matter(unit.text):
        return result, None

    import libcst as cst

    from detaudit.static.facts import FactCollector, FileFacts
    from detaudit.static.walk import walk
    from detaudit.static.rule import all_rules
    from detaudit.static.rules.parse_error import ParseError

    try:
        module = cst.parse_module(unit.text)
    except cst.ParserSyntaxError as error:
        message, line, column = _syntax_error_location(unit.text, error)
        cell, line = unit.locate(line)
        result.findings.append(ParseError.finding(display_path, message, line, column, cell))
        return result, None
    except (RecursionError, MemoryError, ValueError) as error:
        result.findings.append(ParseError.finding(display_path, f"cannot parse: {type(error).__name__}"))
        return result, None
    result.parsed = True

    facts = FileFacts()
    context = FileContext(path, display_path, unit, module, facts, project_root)
    instances = [rule(context) for rule in (rules if rules is not None else all_rules())]
    walkers = [FactCollector(facts, module), *(r for r in instances if r.has_visitors())]
    try:
        walk(module, walkers)
    except RecursionError:
        result.messages.append(f"{display_path}: too deeply nested to analyse; skipped")
        return result, None
    for rule in instances:
        try:
            rule.finish()
        except Exception as error:  # a rule bug must not stop the other rules or files
            result.messages.append(f"{display_path}: internal error in rule {rule.name}: {error!r} (please report)")
    result.dependencies = context.dependencies
    if context.hits:
        _collect_findings(context, result)
    return result, context


def _syntax_error_location(text: str, error: "cst.ParserSyntaxError") -> tuple[str, int, int]:
    """Python's own compiler names the line of a syntax error more precisely than
    libcst's parser; it runs only on files that already failed to parse."""
    try:
        compile(text, "<checked file>", "exec", dont_inherit=True, flags=0x400)  # ast.PyCF_ONLY_AST
    except SyntaxError as python_error:
        return f"syntax error: {python_error.msg}", python_error.lineno or 1, python_error.offset or 1
    except (ValueError, RecursionError, MemoryError):
        pass
    return f"syntax error: {error.message}", error.raw_line, error.raw_column + 1


@dataclass(frozen=True)
class _Span:
    start_line: int
    start_column: int  # 0-based, like libcst's
    end_line: int
    end_column: int


def _find_unique(haystack: str, snippet: str) -> tuple[int, int] | None:
    """(start, end) offsets of the only occurrence of a node's code in ``haystack``.

    A multi-line node inside an indented block is printed by libcst without the
    block's indentation on its continuation lines, so such a node is found by
    its first line (which is exact) and ends on the line its last line ends."""
    offset = haystack.find(snippet)
    if offset >= 0:
        return (offset, offset + len(snippet)) if haystack.find(snippet, offset + 1) < 0 else None
    if "\n" not in snippet:
        return None
    lines = snippet.split("\n")
    offset = haystack.find(lines[0])
    if offset < 0 or haystack.find(lines[0], offset + 1) >= 0:
        return None
    last_line_start = offset
    for _ in range(len(lines) - 1):
        last_line_start = haystack.find("\n", last_line_start) + 1
        if last_line_start == 0:
            return None
    last_line_end = haystack.find("\n", last_line_start)
    last = lines[-1].strip()
    end = haystack.rfind(last, last_line_start, len(haystack) if last_line_end < 0 else last_line_end)
    return (offset, end + len(last)) if last and end >= 0 else None


def _span_at(text: str, start: int, end: int) -> _Span:
    start_line = text.count("\n", 0, start) + 1
    return _Span(
        start_line,
        start - (text.rfind("\n", 0, start) + 1),
        start_line + text.count("\n", start, end),
        end - (text.rfind("\n", 0, end) + 1),
    )


def _span_from_text(module: "cst.Module", text: str, node: "cst.CSTNode") -> _Span | None:
    """Locate ``node`` by its own source text, which libcst reproduces exactly.

    When that text occurs exactly once in the file, its offset is the node's
    position.  This costs a small codegen and a string search, against a full
    position-tracking codegen of the module (about twice the parse) for
    libcst's PositionProvider, which stays the fallback for ambiguous nodes.
    """
    snippet = module.code_for_node(node).strip()
    found = _find_unique(text, snippet) if snippet else None
    return _span_at(text, *found) if found else None


def _span_in_statement(module: "cst.Module", text: str, node: "cst.CSTNode", statement_of: dict[int, int]) -> _Span | None:
    """For a node whose text repeats in the file: find it within its top-level
    statement, whose offset is the length of the code before it."""
    index = statement_of.get(id(node))
    snippet = module.code_for_node(node).strip()
    if index is None or not snippet:
        return None
    found = _find_unique(module.code_for_node(module.body[index]), snippet)
    if found is None:
        return None
    before = "".join(module.code_for_node(line) for line in module.header)
    before += "".join(module.code_for_node(statement) for statement in module.body[:index])
    start, end = len(before) + found[0], len(before) + found[1]
    if not text.startswith(snippet.split("\n", 1)[0], start):
        return None
    return _span_at(text, start, end)


def _spans(context: FileContext) -> dict[int, _Span]:
    """Positions of every reported node, by id: by unique text, else by unique
    text within the node's top-level statement, else libcst's PositionProvider."""
    from detaudit.static.walk import iter_nodes

    module, text = context.module, context.source.text
    spans: dict[int, _Span] = {}
    statement_of: dict[int, int] | None = None
    unresolved = []
    for hit in context.hits:
        if id(hit.node) in spans:
            continue
        span = _span_from_text(module, text, hit.node)
        if span is None:
            if statement_of is None:
                statement_of = {id(n): i for i, statement in enumerate(module.body) for n in iter_nodes(statement)}
            span = _span_in_statement(module, text, hit.node, statement_of)
        if span is None:
            unresolved.append(hit.node)
        else:
            spans[id(hit.node)] = span
    if unresolved:
        from libcst.metadata import MetadataWrapper, PositionProvider

        positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        for node in unresolved:
            p = positions[node]
            spans[id(node)] = _Span(p.start.line, p.start.column, p.end.line, p.end.column)
    return spans


def _collect_findings(context: FileContext, result: FileResult) -> None:
    spans = _spans(context)
    lines = context.source.text.splitlines()
    seen: set[tuple] = set()
    for hit in context.hits:
        span = spans[id(hit.node)]
        cell, line = context.source.locate(span.start_line)
        _, end_line = context.source.locate(span.end_line)
        finding = Finding(
            code=hit.rule.code,
            name=hit.rule.name,
            severity=hit.rule.severity,
            message=hit.message,
            path=context.display_path,
            line=line,
            column=span.start_column + 1,
            end_line=end_line,
            end_column=span.end_column + 1,
            fix_hint=hit.rule.fix_hint,
            cell=cell,
        )
        if finding in seen:
            continue
        seen.add(finding)
        source_line = lines[span.start_line - 1] if span.start_line <= len(lines) else ""
        suppression = suppression_for(finding, source_line, result.messages)
        if suppression is None:
            result.findings.append(finding)
        else:
            result.suppressed.append(_with_reason(finding, suppression))
    result.findings.sort(key=Finding.sort_key)


def _with_reason(finding: Finding, reason: str) -> Finding:
    from dataclasses import replace

    return replace(finding, suppressed_reason=reason)


def suppression_for(finding: Finding, source_line: str, messages: list[str]) -> str | None:
    """The suppression reason ("" when none given) if ``source_line`` suppresses
    ``finding``, else None.  Unknown rule names become a message, not an error."""
    from detaudit.static.rule import find_rule

    if "#" not in source_line:
        return None
    match = _SUPPRESSION.search(source_line)
    if match is not None:
        reason = (match.group("reason") or "").strip()
        if match.group("rules") is None:
            return reason
        for selector in filter(None, (s.strip() for s in match.group("rules").split(","))):
            rule = find_rule(selector)
            if rule is None:
                messages.append(f"{finding.location}: unknown rule {selector!r} in a detaudit: ignore comment")
            elif rule.code == finding.code:
                return reason
    match = _NOQA.search(source_line)
    if match is not None:
        codes = {c.upper() for c in re.split(r"[\s,]+", match.group("codes"))}
        if finding.code in codes:
            return ""
    return None
