"""Where a reported node is in the file's text.

libcst's PositionProvider knows every node's position but costs about twice
the parse, so a node is found, in order of cost, by its own text where that
occurs once in the file, by its rank among the nodes of its type in Python's
``ast`` of the file (a tenth of the parse), by its text within its top-level
statement, and only what none of these settles by PositionProvider
(``Locator``).
"""

from __future__ import annotations

import ast
import bisect
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from detaudit.static.engine.limits import Deadline
from detaudit.static.engine.sources import LINE_BREAK, split_lines

if TYPE_CHECKING:
    import libcst as cst

    from detaudit.static.context import FileContext


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


class Locator:
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


def hit_spans(context: FileContext, deadline: Deadline | None = None) -> dict[int, _Span]:
    """Positions of every reported node, by id."""
    locator = Locator(context.module, context.source.text, deadline)
    return locator.spans(hit.node for hit in context.hits)
