"""Checking one file: pre-filter, parse, one shared walk, positions, suppressions.

Speed matters (a pre-commit hook runs this on every commit), so the engine
- skips files whose text cannot matter before importing or running libcst,
- leaves out expressions libcst would take too long to parse, or could not
  hold (``limits.py``), and stops a file's analysis at its time budget,
- keeps the cyclic GC from scanning the tree over and over (``trees.py``),
- walks each tree once: the fact collector and every rule with visitor methods
  share a batched walk, and most rules only read the collected facts,
- resolves names with its own import table (``names.py``), and
- locates reported nodes by their own text, else by their rank among the
  nodes of their type in Python's own ``ast`` (a tenth of the parse), falling
  back to libcst's PositionProvider (about twice the parse) only for what
  neither settles.
"""

from __future__ import annotations

import ast
import bisect
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from detaudit.findings import Finding
from detaudit.static.context import FileContext, FileResult
from detaudit.static.engine.limits import DEFAULT_FILE_TIME_BUDGET, Deadline, OverBudget, TooComplex, without_complex_expressions
from detaudit.static.engine.notebooks import notebook_source
from detaudit.static.engine.sources import (
    LINE_BREAK,
    MAX_FILE_BYTES,
    SourceUnit,
    UnreadableSource,
    decode_python,
    python_parse_error,
    split_lines,
)
from detaudit.static.engine.trees import file_scope, parse_module
from detaudit.static.fixes.code import DEFAULT_FIX_STYLE

if TYPE_CHECKING:
    import libcst as cst

    from detaudit.static.rule import Rule

#: A file that mentions none of these cannot hold a finding of any rule
#: (framework names count: ``import lightning as L; L.Trainer(benchmark=True)``),
#: unless it is an entry script: one with a ``__main__`` guard may reach torch
#: only through project modules (``from improved_diffusion import ...``), whose
#: draws and training are its findings.
RELEVANT_SUBSTRINGS = (
    "torch", "numpy", "random", "tensorflow", "keras", "jax", "lightning", "transformers", "accelerate", "__main__",
)

PARSE_ERROR_CODE = "DET000"

_SUPPRESSION = re.compile(
    r"#\s*detaudit:\s*ignore(?:\[(?P<rules>[^\]]*)\])?(?:\s*--\s*(?P<reason>.*))?", re.IGNORECASE
)
_NOQA = re.compile(r"#\s*noqa:\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)", re.IGNORECASE)


def might_matter(text: str) -> bool:
    return any(s in text for s in RELEVANT_SUBSTRINGS)


def check_source(
    text: str,
    path: Path | str = "<snippet>.py",
    *,
    rules: Iterable[type["Rule"]] | None = None,
    project_root: Path | None = None,
    budget: float = DEFAULT_FILE_TIME_BUDGET,
) -> FileResult:
    """Check Python ``text`` as if it were the file ``path`` (used by tests and examples)."""
    return analyse_source(text, path, rules=rules, project_root=project_root, budget=budget)[0]


def analyse_source(
    text: str,
    path: Path | str,
    *,
    rules: Iterable[type["Rule"]] | None = None,
    project_root: Path | None = None,
    budget: float = DEFAULT_FILE_TIME_BUDGET,
    fix_style: str = DEFAULT_FIX_STYLE,
) -> tuple[FileResult, FileContext | None]:
    """Check ``text`` and keep what the check saw: the tree, its facts and the
    rule hits with their edits, written in ``fix_style`` (``--fix`` needs them;
    a FileResult drops them).  The context is None when the file was not parsed."""
    path = Path(path)
    return _check_unit(SourceUnit(text), path, str(path), project_root or path.parent, rules, budget, fix_style)


def check_file(
    path: Path,
    display_path: str,
    project_root: Path,
    data: bytes | None = None,
    *,
    budget: float = DEFAULT_FILE_TIME_BUDGET,
) -> FileResult:
    """Check one file on disk; never raises for a bad file.  ``budget``: the
    per-file time budget in seconds (see ``limits.py``)."""
    try:
        if data is None:
            data = path.read_bytes()
        unit = read_source(path, data)
    except OSError as error:
        return _unreadable(display_path, f"cannot read: {error.strerror or error}")
    except UnreadableSource as error:
        return _unreadable(display_path, str(error))
    return _check_unit(unit, path, display_path, project_root, None, budget)[0]


def read_source(path: Path, data: bytes) -> SourceUnit:
    """Decode ``data`` (the bytes of ``path``) into the text the engine parses."""
    if len(data) > MAX_FILE_BYTES:
        raise UnreadableSource(
            f"skipped: {len(data) / 1024 / 1024:.1f} MiB is larger than the {MAX_FILE_BYTES // 1024 // 1024} MiB limit "
            "for checked files (generated code?)"
        )
    if path.suffix == ".ipynb":
        return notebook_source(data)
    return SourceUnit(decode_python(data))


def _unreadable(display_path: str, reason: str) -> FileResult:
    from detaudit.static.rules.parse_error import ParseError

    return FileResult(display_path, findings=[ParseError.finding(display_path, reason)])


def _check_unit(
    unit: SourceUnit,
    path: Path,
    display_path: str,
    project_root: Path,
    rules: Iterable[type["Rule"]] | None,
    budget: float,
    fix_style: str = DEFAULT_FIX_STYLE,
) -> tuple[FileResult, FileContext | None]:
    """Check one unit; a failure of detaudit's own code becomes an internal
    error of this file's result (or a parse error, for a tree too deep for
    libcst's recursive code, or an analysis over the time budget), never an
    exception that stops the other files."""
    if not might_matter(unit.text):
        return FileResult(display_path), None
    from detaudit.static.rules.parse_error import ParseError

    def not_analysed(reason: str) -> tuple[FileResult, None]:
        return FileResult(display_path, findings=[ParseError.finding(display_path, reason)], complete=False), None

    try:
        with file_scope():
            return _parse_and_analyse(unit, path, display_path, project_root, rules, budget, fix_style)
    except TooComplex as error:
        return not_analysed(f"not analysed: {error}")
    except OverBudget:
        return not_analysed(f"analysis stopped: it took longer than the per-file time budget ({budget:g} s)")
    except RecursionError:
        return not_analysed("too deeply nested to analyse (libcst's recursion limit)")
    except MemoryError:
        return not_analysed("out of memory while analysing")
    except Exception as error:  # a detaudit bug: this file is reported as not checked, the others go on
        return FileResult(display_path, internal_errors=[internal_error(display_path, "while checking", error)]), None


def internal_error(display_path: str, where: str, error: BaseException) -> str:
    """One line naming the file, the part of detaudit that failed, the error and
    the line of detaudit's code that raised it."""
    text = " ".join(str(error).split())
    origin = _origin(error)
    return (
        f"{display_path}: internal error {where}: {type(error).__name__}{': ' + text if text else ''}"
        f"{f' (at {origin})' if origin else ''} (a detaudit bug: please report it)"
    )


def _origin(error: BaseException) -> str | None:
    """``detaudit/static/rules/seeding/conditional_seed.py:123``: the innermost frame in detaudit's code."""
    package = Path(__file__).resolve().parents[2]
    origin = None
    traceback = error.__traceback__
    while traceback is not None:
        filename = Path(traceback.tb_frame.f_code.co_filename)
        if package in filename.parents:
            origin = f"{filename.relative_to(package.parent).as_posix()}:{traceback.tb_lineno}"
        traceback = traceback.tb_next
    return origin


def _parse_and_analyse(
    unit: SourceUnit,
    path: Path,
    display_path: str,
    project_root: Path,
    rules: Iterable[type["Rule"]] | None,
    budget: float,
    fix_style: str = DEFAULT_FIX_STYLE,
) -> tuple[FileResult, FileContext | None]:
    import libcst as cst

    from detaudit.static.engine.facts import FactCollector, FileFacts
    from detaudit.static.engine.walk import walk
    from detaudit.static.rule import all_rules
    from detaudit.static.rules.parse_error import ParseError

    result = FileResult(display_path)
    text, skipped = without_complex_expressions(unit.text, budget)
    if skipped:  # the blanked text has the same lines, and the same columns around what was blanked
        original_lines = split_lines(unit.text)
        unit = SourceUnit(text, unit.cell_lines)
        result.complete = False
        for expression in skipped:
            cell, line = unit.locate(expression.line)
            finding = ParseError.finding(display_path, expression.reason, line, expression.column, cell)
            suppression = suppression_for(finding, original_lines[expression.line - 1], result.messages)
            if suppression is None:
                result.findings.append(finding)
            else:
                result.suppressed.append(_with_reason(finding, suppression))
    try:
        module = parse_module(unit.text)
    except cst.ParserSyntaxError as error:
        message, line, column = _syntax_error_location(unit.text, error)
        cell, line = unit.locate(line)
        result.findings.append(ParseError.finding(display_path, message, line, column, cell))
        return result, None
    except (RecursionError, MemoryError, ValueError) as error:
        result.findings.append(ParseError.finding(display_path, f"cannot parse: {type(error).__name__}"))
        return result, None
    result.parsed = True
    deadline = Deadline(budget)  # from here on, the work is ours and can be stopped

    facts = FileFacts()
    context = FileContext(path, display_path, unit, module, facts, project_root, fix_style=fix_style)
    collector = FactCollector(facts, module)
    instances = [rule(context) for rule in (rules if rules is not None else all_rules())]
    failed: set[int] = set()

    def stopped(visitor: object, error: Exception) -> None:
        failed.add(id(visitor))
        where = "in the fact collector" if visitor is collector else f"in rule {visitor.name} ({visitor.code})"
        result.internal_errors.append(internal_error(display_path, where, error))

    walk(module, [collector, *(r for r in instances if r.has_visitors())], on_error=stopped, tick=deadline.check)
    if id(collector) in failed:
        return result, None  # every rule reads the facts: none of them can be trusted
    for rule in instances:
        deadline.check()
        if id(rule) in failed:
            continue
        try:
            rule.finish()
        except Exception as error:  # a rule bug must not stop the other rules or files
            result.internal_errors.append(internal_error(display_path, f"in rule {rule.name} ({rule.code})", error))
    result.dependencies = context.dependencies
    if context.hits:
        _collect_findings(context, result, deadline)
    return result, context


def _syntax_error_location(text: str, error: "cst.ParserSyntaxError") -> tuple[str, int, int]:
    """Python's own compiler names the line of a syntax error more precisely than
    libcst's parser; it runs only on files that already failed to parse."""
    python_error = python_parse_error(text)
    if isinstance(python_error, SyntaxError):
        return f"syntax error: {python_error.msg}", python_error.lineno or 1, python_error.offset or 1
    return f"syntax error: {error.message}", error.raw_line, error.raw_column + 1


@dataclass(frozen=True)
class _Span:
    start_line: int
    start_column: int  # 0-based, like libcst's
    end_line: int
    end_column: int


class _Lines:
    """Line starts of a text whose lines end in LF, CRLF or a lone CR (libcst
    takes all three as line breaks), for offset -> (line, column) lookups."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0, *(match.end() for match in LINE_BREAK.finditer(text))]

    def line_of(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset)

    def span(self, start: int, end: int) -> _Span:
        start_line, end_line = self.line_of(start), self.line_of(end)
        return _Span(start_line, start - self.starts[start_line - 1], end_line, end - self.starts[end_line - 1])

    def find_unique(self, snippet: str) -> tuple[int, int] | None:
        """(start, end) offsets of the only occurrence of a node's code.

        A multi-line node inside an indented block is printed by libcst without
        the block's indentation on its continuation lines, so such a node is
        found by its first line (which is exact) and ends on the line its last
        line ends, where that line's text first ends (``).transpose(...)``: at
        the first parenthesis)."""
        haystack = self.text
        offset = haystack.find(snippet)
        if offset >= 0:
            return (offset, offset + len(snippet)) if haystack.find(snippet, offset + 1) < 0 else None
        lines = split_lines(snippet)
        if len(lines) < 2:
            return None
        offset = haystack.find(lines[0])
        if offset < 0 or haystack.find(lines[0], offset + 1) >= 0:
            return None
        last_line = self.line_of(offset) + len(lines) - 1
        if last_line > len(self.starts):
            return None
        line_start = self.starts[last_line - 1]
        line_end = self.starts[last_line] if last_line < len(self.starts) else len(haystack)
        # the node's last line starts its line (after the indentation): the
        # node ends where that text first ends there, whatever follows it
        last = lines[-1].strip()
        end = haystack.find(last, line_start, line_end)
        return (offset, end + len(last)) if last and end >= 0 else None


#: libcst node types whose nodes are Python's ``ast`` nodes of one type, one to one
#: and in the same source order: the k-th of them in the tree spans what the k-th
#: ``ast`` node of that type spans (without the parentheses libcst counts in).
_AST_TWINS: dict[type, type] = {}


def _ast_twins() -> dict[type, type]:
    if not _AST_TWINS:
        import libcst as cst

        _AST_TWINS.update({
            cst.Call: ast.Call, cst.Subscript: ast.Subscript,
            cst.Assign: ast.Assign, cst.AugAssign: ast.AugAssign, cst.AnnAssign: ast.AnnAssign,
        })
    return _AST_TWINS


class _Locator:
    """Positions of reported nodes: by their unique text in the file, else by
    their rank among the nodes of their type in Python's ``ast`` of the file
    (a tenth of libcst's parse; the text there must be the node's), else by
    their unique text within their top-level statement (libcst's code for that
    statement: dearer than the ``ast`` for a large class), else by libcst's
    PositionProvider (about twice the parse), for what is still ambiguous.

    Each piece is computed once per file: the line starts, each statement's
    code and offset, the node -> statement map.  (Per node, a statement's code
    and the code before it made a file with many repeated hits quadratic.)

    The last two ways count positions in libcst's code for the tree, which is
    the file's text except where libcst loses some (a line holding only a
    backslash, before a statement): then the statement offsets are not used,
    and PositionProvider's lines are mapped to the file's by a line diff."""

    def __init__(self, module: "cst.Module", text: str, deadline: Deadline | None = None) -> None:
        self.module = module
        self.deadline = deadline
        self.lines = _Lines(text)
        self._statement_of: dict[int, int] | None = None
        self._rank_of: dict[int, int] = {}  # node -> its rank among the tree's nodes of its type (``ast`` twins)
        self._ast_places: dict[type, list[tuple[int, int, int, int]]] | None = None
        self._offsets: list[int] = []  # of each top-level statement
        self._codes: list[str] = []
        self._statement_lines: dict[int, _Lines] = {}
        self._located: dict[int, tuple[int, _Lines] | None] = {}  # statement index -> its place in the file
        self._generated: str | None = None  # libcst's code for the whole tree

    def spans(self, nodes: Iterable["cst.CSTNode"]) -> dict[int, _Span]:
        spans: dict[int, _Span] = {}
        unresolved = []
        for node in nodes:
            if self.deadline is not None:
                self.deadline.check()
            if id(node) in spans:
                continue
            snippet = self.module.code_for_node(node).strip()
            span = self._by_text(snippet) if snippet else None
            if span is None:
                span = self._by_rank(node, snippet)
            if span is None and snippet:
                span = self._in_statement(node, snippet)
            if span is None:
                unresolved.append(node)
            else:
                spans[id(node)] = span
        if unresolved:
            from libcst.metadata import MetadataWrapper, PositionProvider

            positions = MetadataWrapper(self.module, unsafe_skip_copy=True).resolve(PositionProvider)
            to_file = self._line_map() if not self._round_trips() else None
            for node in unresolved:
                p = positions[node]
                span = _Span(p.start.line, p.start.column, p.end.line, p.end.column)
                spans[id(node)] = span if to_file is None else self._mapped(span, to_file)
        return spans

    def _by_text(self, snippet: str) -> _Span | None:
        """Where a node's code occurs, when it occurs once in the file."""
        found = self.lines.find_unique(snippet)
        return None if found is None else self.lines.span(*found)

    def _in_statement(self, node: "cst.CSTNode", snippet: str) -> _Span | None:
        """For a node whose text repeats in the file: find it within its top-level
        statement, located by its own code when that occurs once in the file."""
        index = self._statements().get(id(node))
        if index is None:
            return None
        located = self._statement_in_text(index)
        if located is None:
            return None
        offset, statement = located
        found = statement.find_unique(snippet)
        if found is None:
            return None
        start, end = offset + found[0], offset + found[1]
        if not self.lines.text.startswith(split_lines(snippet)[0], start):
            return None
        return self.lines.span(start, end)

    def _statements(self) -> dict[int, int]:
        """node -> index of its top-level statement (and the ranks of ``ast`` twins), in one pass."""
        if self._statement_of is None:
            from detaudit.static.engine.walk import iter_nodes

            twins, ranks = _ast_twins(), self._rank_of
            counts = dict.fromkeys(twins, 0)
            statement_of = self._statement_of = {}
            for i, statement in enumerate(self.module.body):
                for n in iter_nodes(statement):
                    statement_of[id(n)] = i
                    kind = type(n)
                    if kind in counts:
                        ranks[id(n)] = counts[kind]
                        counts[kind] += 1
        return self._statement_of

    def _by_rank(self, node: "cst.CSTNode", snippet: str) -> _Span | None:
        """The k-th node of its type is where Python's ``ast`` puts the k-th node of
        the twin type; taken only when the text there is the node's code
        (``snippet``).  Positions in the file's own text: the tree need not
        round-trip."""
        twin = _ast_twins().get(type(node))
        if twin is None:
            return None
        if id(node) not in self._statements():  # (which ranks the twins too)
            return None
        rank = self._rank_of.get(id(node))
        places = self._places().get(twin, [])
        if rank is None or rank >= len(places):
            return None
        line, column, end_line, end_column = places[rank]
        start, end = self._offset(line, column), self._offset(end_line, end_column)
        found = split_lines(self.lines.text[start:end])
        expected = split_lines(snippet)
        if [text.strip() for text in found] != [text.strip() for text in expected]:
            return None
        return self.lines.span(start, end)

    def _places(self) -> dict[type, list[tuple[int, int, int, int]]]:
        """(line, byte column, end line, end byte column) of the file's ``ast`` nodes
        of each twin type, in the tree's order (an outer node before what it starts with)."""
        if self._ast_places is None:
            self._ast_places = {}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # SyntaxWarnings about the user's code are not ours to print
                    tree = ast.parse(self.lines.text)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                return self._ast_places
            wanted = tuple(_ast_twins().values())
            for n in ast.walk(tree):
                if isinstance(n, wanted):
                    self._ast_places.setdefault(type(n), []).append((n.lineno, n.col_offset, n.end_lineno, n.end_col_offset))
            for places in self._ast_places.values():
                places.sort(key=lambda p: (p[0], p[1], -p[2], -p[3]))
        return self._ast_places

    def _offset(self, line: int, byte_column: int) -> int:
        """The text offset of ``ast``'s (line, UTF-8 byte column)."""
        starts = self.lines.starts
        start = starts[line - 1]
        end = starts[line] if line < len(starts) else len(self.lines.text)
        text = self.lines.text[start:end]
        if text.isascii():
            return start + byte_column
        return start + len(text.encode("utf-8")[:byte_column].decode("utf-8", "replace"))

    def _statement_in_text(self, index: int) -> tuple[int, _Lines] | None:
        """The offset of top-level statement ``index`` in the file and its code's
        lines: where its code occurs, when it occurs once (libcst's code for one
        statement, not for the whole tree: that was most of the cost of locating
        a file's findings), else the length of the code before it, when the tree
        round-trips."""
        if index not in self._located:
            code = self.module.code_for_node(self.module.body[index])
            text = self.lines.text
            offset = text.find(code) if code else -1
            if offset >= 0 and text.find(code, offset + 1) < 0:
                self._located[index] = (offset, _Lines(code))
            else:
                self._located[index] = self._statement(index) if self._round_trips() else None
        return self._located[index]

    def _statement(self, index: int) -> tuple[int, _Lines]:
        """The offset of top-level statement ``index`` and its code's lines."""
        if not self._offsets:
            offset = sum(len(self.module.code_for_node(line)) for line in self.module.header)
            for statement in self.module.body:
                code = self.module.code_for_node(statement)
                self._offsets.append(offset)
                self._codes.append(code)
                offset += len(code)
        lines = self._statement_lines.get(index)
        if lines is None:
            lines = self._statement_lines[index] = _Lines(self._codes[index])
        return self._offsets[index], lines

    def _round_trips(self) -> bool:
        """Whether libcst's code for the tree is exactly the file's text."""
        if self._generated is None:
            if self.module.body:
                self._statement(0)  # every statement's code
            header = "".join(self.module.code_for_node(line) for line in self.module.header)
            footer = "".join(self.module.code_for_node(line) for line in self.module.footer)
            self._generated = header + "".join(self._codes) + footer
        return self._generated == self.lines.text

    def _line_map(self) -> list[int]:
        """For each line of libcst's code (0-based), the line of the file it is."""
        import difflib

        generated, actual = split_lines(self._generated or ""), split_lines(self.lines.text)
        mapping = [0] * len(generated)
        matcher = difflib.SequenceMatcher(None, generated, actual, autojunk=False)
        for _, g1, g2, a1, a2 in matcher.get_opcodes():
            for k in range(g1, g2):
                mapping[k] = min(a1 + (k - g1), max(a2 - 1, a1))
        return [min(line, max(len(actual) - 1, 0)) for line in mapping]

    def _mapped(self, span: _Span, to_file: list[int]) -> _Span:
        def line(number: int) -> int:
            return to_file[min(number, len(to_file)) - 1] + 1 if to_file else number

        def column(number: int, column: int) -> int:
            starts = self.lines.starts
            end = starts[number] if number < len(starts) else len(self.lines.text)
            width = len(self.lines.text[starts[number - 1] : end].rstrip("\r\n"))
            return min(column, width)

        start_line, end_line = line(span.start_line), line(span.end_line)
        return _Span(start_line, column(start_line, span.start_column), end_line, column(end_line, span.end_column))


def _spans(context: FileContext, deadline: Deadline | None = None) -> dict[int, _Span]:
    """Positions of every reported node, by id."""
    locator = _Locator(context.module, context.source.text, deadline)
    return locator.spans(hit.node for hit in context.hits)


def _collect_findings(context: FileContext, result: FileResult, deadline: Deadline) -> None:
    spans = _spans(context, deadline)
    lines = split_lines(context.source.text)
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
