"""What keeps the check of one file bounded: expression complexity and a time budget.

libcst's native parser takes time quadratic in the length of a chain: an
operator chain ``a + b + ... `` or ``x.f().g()...``, nested brackets, a run of
unary operators (measured with ``bench/pathological_files.py``:
1,000 terms of ``torch.randn(1) + ...`` took seconds, 5,000 over a minute;
the time is spent inside the parser, and the GIL is held, so it cannot be
interrupted).  And libcst's recursive code (code generation, its visitors,
the PositionProvider) runs out of Python's recursion limit a few hundred
levels deep.  So, before libcst sees a file:

- Files whose text has no long logical line (nearly all) go straight on: no
  expression in them can be deep or costly enough to matter.
- The others are measured with Python's own parser (linear, in C): first
  each long logical line on its own, and the whole file only when one of them
  does not parse alone or is over a limit.  Each outermost expression gets a
  depth (as libcst will nest it) and a parse cost (the sum of its nodes'
  depths: a chain of n terms costs about n²/2).
- An expression over either limit is not parsed: its text becomes a
  placeholder of the same shape (``(_)`` padded with spaces, same lines, same
  columns around it), the rest of the file is checked as usual, and a
  parse-error finding at the expression says it was not analysed.  Such a
  file is never fixed (its text is not the file's).

The per-file time budget (CPU seconds) bounds the rest: an expression
predicted to take longer than the budget to parse is not parsed, and the
analysis after the parse (walk, rules, locations) stops once it has used the
budget; the file then gets a parse-error finding instead of its findings, and
the other files are checked as usual.
"""

from __future__ import annotations

import ast
import contextlib
import re
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Iterator

from detaudit.static.engine.sources import LINE_BREAK

#: Seconds per file, unless configured (``file-time-budget``, ``--file-time-budget``).
DEFAULT_FILE_TIME_BUDGET = 10.0

#: Deepest expression (as libcst nests it) that libcst's recursive code handles
#: under Python's default recursion limit, with room for the caller's frames.
MAX_EXPRESSION_DEPTH = 200

#: Parse CPU seconds per unit of cost (sum of node depths): the slowest shape
#: measured (nested calls ``f(f(f(...)))``, about 4e-6; operator and method
#: chains 0.7-1.8e-6).
SECONDS_PER_COST_UNIT = 4e-6

#: Recursion limit while Python's parser builds the ast of a measured file: a
#: chain of about 20,000 terms (measured on CPython 3.11; a longer one makes the
#: whole file "too deeply nested for Python's own parser").
AST_RECURSION_LIMIT = 10_000

#: Files with a logical line this long are measured (about 13% of torch's own
#: sources; Python's parser costs about a seventh of libcst's).  A shorter
#: expression parses in well under a second whatever its shape; one that is
#: still too deep for libcst's recursion (300 unary minus signs) is caught when
#: the recursion fails, and the file reported as too deeply nested.
LONG_LOGICAL_LINE = 1000

#: An expression shorter than this (in bytes) cannot be over the depth limit
#: (the most compact nesting, a run of unary minus signs, takes one byte per level).
MEASURED_EXPRESSION = MAX_EXPRESSION_DEPTH


class OverBudget(Exception):
    """The analysis of a file took longer than its time budget."""


class Deadline:
    """The moment a file's analysis has used ``seconds`` of this process's CPU
    time: ``check()`` raises from then on.  CPU time, not wall time, so that a
    machine busy with other work (a CI runner, the pool's other workers) does
    not cut a file's analysis short."""

    def __init__(self, seconds: float) -> None:
        self._at = time.process_time() + seconds

    def check(self) -> None:
        if time.process_time() > self._at:
            raise OverBudget


@dataclass(frozen=True)
class Skipped:
    """An expression that was not parsed, and why (one line)."""

    line: int  # 1-based, in the text
    column: int  # 1-based
    reason: str


class TooComplex(Exception):
    """The whole file is beyond what can be analysed; the message says why (one line)."""


def without_complex_expressions(text: str, budget: float) -> tuple[str, list[Skipped]]:
    """``text`` with every expression over the limits replaced by a placeholder
    of the same shape, and the expressions replaced (none: ``text`` itself).
    Raises TooComplex for a file Python's own parser cannot take apart."""
    if len(text) < LONG_LOGICAL_LINE:
        return text, []
    long_lines = _long_logical_lines(text)
    # Python's parser costs about a seventh of libcst's, on the whole file: the
    # long logical lines alone are parsed first (each one statement, nearly
    # always), and only a file where one of them fails to parse on its own or
    # holds an expression over a limit is parsed whole, which decides.
    if all(_within_limits(line, budget) for line in long_lines):
        return text, []
    tree = _python_tree(text)
    if tree is None:
        return text, []  # libcst reports it (its grammar differs in places, so it decides)
    skipped = []
    spans = []
    for node, reason in _over_limits(tree, text, budget):
        skipped.append(Skipped(node.lineno, node.col_offset + 1, f"expression not analysed: {reason}; the rest of the file was checked"))
        spans.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset))
    if not spans:
        return text, []
    blanked = _blank(text, spans)
    # the columns above are UTF-8 byte offsets (ast's); findings want characters
    lines = LINE_BREAK.split(text)
    return blanked, [
        Skipped(s.line, len(lines[s.line - 1].encode("utf-8")[: s.column - 1].decode("utf-8", "replace")) + 1, s.reason)
        for s in skipped
    ]


def _python_tree(text: str) -> ast.Module | None:
    """Python's own ast of ``text``; None for a syntax error libcst should report.
    Raises TooComplex for text Python's parser cannot take apart."""
    try:
        with warnings.catch_warnings(), _recursion_limit_at_least(AST_RECURSION_LIMIT):
            warnings.simplefilter("ignore")  # SyntaxWarnings about the user's code are not ours to print
            return ast.parse(text)
    except SyntaxError as error:
        if error.msg == "too many nested parentheses":  # libcst would take minutes to say so
            raise TooComplex(f"syntax error: {error.msg} (line {error.lineno})") from None
        return None
    except (RecursionError, MemoryError):
        raise TooComplex("too deeply nested for Python's own parser") from None
    except ValueError:
        return None


def _within_limits(logical_line: str, budget: float) -> bool:
    """Whether one logical line, parsed on its own, holds no expression over a
    limit.  False also when it does not parse on its own (a compound
    statement's header, a line that only looked joined): the whole file decides."""
    statement = logical_line.lstrip(" \t")  # its indentation, if it stood in a block
    if statement.rstrip().endswith(":"):
        statement += " pass"  # a long ``def``, ``if`` or ``with`` header gets a body
    try:
        tree = _python_tree(statement)
    except TooComplex:
        return False
    return tree is not None and next(_over_limits(tree, statement, budget), None) is None


def _over_limits(tree: ast.Module, text: str, budget: float) -> Iterator[tuple[ast.expr, str]]:
    """(expression, why) for each outermost expression of ``tree`` (parsed from
    ``text``) that is too deep or too costly for libcst."""
    line_offsets = [0, *(match.end() for match in re.finditer(rb"\r\n|\r|\n", text.encode("utf-8")))]
    for node, depth, cost in _outermost_expressions(tree, line_offsets):
        predicted = cost * SECONDS_PER_COST_UNIT
        if depth > MAX_EXPRESSION_DEPTH:
            yield node, f"nested {depth} levels deep (the limit is {MAX_EXPRESSION_DEPTH})"
        elif predicted > budget:
            yield node, f"parsing it would take about {predicted:.2g} s (the per-file time budget is {budget:g} s)"


@contextlib.contextmanager
def _recursion_limit_at_least(limit: int) -> Iterator[None]:
    """Python's parser builds the ast objects recursively, under the recursion
    limit (1,000 levels by default: a chain of about 2,500 terms).  A little C
    stack per level, so in the main thread (8 MiB) the limit is raised while
    parsing; other threads keep theirs."""
    before = sys.getrecursionlimit()
    raise_it = before < limit and threading.current_thread() is threading.main_thread()
    if raise_it:
        sys.setrecursionlimit(limit)
    try:
        yield
    finally:
        if raise_it:
            sys.setrecursionlimit(before)


def _long_logical_lines(text: str) -> list[str]:
    """The text of each logical line (physical lines joined inside brackets or
    after a backslash) at least LONG_LOGICAL_LINE characters long.  Brackets in
    strings and comments are counted too: they can join lines (never hide a
    long one), and a text that only looks like one logical line does not parse
    on its own, so that the whole file is measured."""
    lines = text.split("\n")
    found = []
    length = depth = first = 0
    for index, line in enumerate(lines):
        if not length:
            first = index
        length += len(line) + 1
        depth += line.count("(") + line.count("[") + line.count("{")
        depth -= line.count(")") + line.count("]") + line.count("}")
        if depth <= 0 and not line.rstrip("\r").endswith("\\"):
            if length >= LONG_LOGICAL_LINE:
                found.append("\n".join(lines[first : index + 1]))
            depth = length = 0
    if length >= LONG_LOGICAL_LINE:  # still open at the end of the file
        found.append("\n".join(lines[first:]))
    return found


#: Fields of these nodes that libcst nests one (or two) levels deeper than ast:
#: Call args are Arg nodes, list elements Element nodes, a subscript's slice a
#: SubscriptElement holding an Index, a comparator a ComparisonTarget.
_EXTRA_LEVELS = {
    (ast.Call, "args"): 1,
    (ast.List, "elts"): 1,
    (ast.Tuple, "elts"): 1,
    (ast.Set, "elts"): 1,
    (ast.Dict, "keys"): 1,
    (ast.Dict, "values"): 1,
    (ast.Subscript, "slice"): 2,
    (ast.Compare, "comparators"): 1,
    (ast.JoinedStr, "values"): 1,
}


def _outermost_expressions(tree: ast.AST, line_offsets: list[int]):
    """(expression, depth, cost) for each expression not inside another that is
    long enough to be over a limit (match patterns excepted: a placeholder
    there would change the pattern).  ``line_offsets``: byte offset of each line.
    A statement shorter than that holds no such expression and is not entered
    (most of them: the walk was a third of this module's cost), unless it has
    decorators, which are written before the statement's own span."""
    stack = [tree]
    while stack:
        node = stack.pop()
        is_expression = isinstance(node, ast.expr)
        if is_expression or (isinstance(node, ast.stmt) and not getattr(node, "decorator_list", None)):
            start = line_offsets[node.lineno - 1] + node.col_offset
            end = line_offsets[node.end_lineno - 1] + node.end_col_offset
            if end - start < MEASURED_EXPRESSION:
                continue
            if is_expression:
                depth, cost = _measure(node)
                yield node, depth, cost
                continue
        if isinstance(node, ast.pattern):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _measure(root: ast.expr) -> tuple[int, int]:
    """(deepest level, sum of all levels) of the nodes under ``root``, counted as
    libcst nests them: ``a or b or c`` is one BoolOp in ast, two nested
    BooleanOperations in libcst."""
    deepest = total = 0
    stack = [(root, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        total += level
        if isinstance(node, ast.BoolOp):
            # libcst: ((v0 or v1) or v2) ...: v0 is len(values)-1 levels down, v1 the same, v2 one less
            count = len(node.values)
            for index, value in enumerate(node.values):
                stack.append((value, level + count - max(index, 1)))
            continue
        for field, value in ast.iter_fields(node):
            extra = _EXTRA_LEVELS.get((type(node), field), 0)
            if isinstance(value, list):
                stack.extend((child, level + 1 + extra) for child in value if isinstance(child, ast.AST))
            elif isinstance(value, ast.AST):
                stack.append((value, level + 1 + extra))
    return deepest, total


def _blank(text: str, spans: list[tuple[int, int, int, int]]) -> str:
    """Replace each (line, byte column, end line, end byte column) span of
    ``text`` by ``(_)`` padded with spaces, keeping every line break."""
    lines = LINE_BREAK.split(text)
    breaks = LINE_BREAK.findall(text)
    for start_line, start_byte, end_line, end_byte in sorted(spans, reverse=True):
        first, last = lines[start_line - 1], lines[end_line - 1]
        start = len(first.encode("utf-8")[:start_byte].decode("utf-8", "replace"))
        end = len(last.encode("utf-8")[:end_byte].decode("utf-8", "replace"))
        if start_line == end_line:
            width = end - start
            lines[start_line - 1] = first[:start] + ("(_)" + " " * (width - 3) if width >= 3 else "_" * width) + first[end:]
            continue
        lines[start_line - 1] = first[:start] + "(_" + " " * max(0, len(first) - start - 2)
        for index in range(start_line, end_line - 1):
            lines[index] = " " * len(lines[index])
        lines[end_line - 1] = " " * max(0, end - 1) + ")" + last[end:]
    return "".join(line + newline for line, newline in zip(lines, [*breaks, ""]))
