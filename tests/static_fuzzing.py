"""What the static pass must do on any input, for the fuzz test and ``bench/fuzz_static.py``.

``problems(text)`` checks one program the way ``detaudit check`` and
``detaudit check --fix --unsafe-fixes`` would, in-process, and lists what went
wrong (empty: nothing): an internal error or exception, a report that is not
valid JSON, a finding outside the file, a fix whose output does not parse or
changes again when fixed a second time.

Generated programs rarely mention torch, so ``torch_flavoured`` mixes them with
the rules' own VALID/INVALID examples (real hazards, real near-misses), put
before top-level statements and at the end, so the rules have something to do.
"""

from __future__ import annotations

import ast
import json
import random
import tempfile
import textwrap
import warnings
from functools import lru_cache
from pathlib import Path

from detaudit.report.jsonout import check_report
from detaudit.static.engine.check import check_source
from detaudit.static.engine.sources import python_parse_error, split_lines
from detaudit.static.fixes.apply import fix_source

#: ``--fix`` may decline a file for these reasons (one-line errors starting so)
EXPECTED_FIX_REFUSALS = (
    "does not parse; not fixed",
    "not fixed: part of it was not analysed",
    "libcst does not reproduce this file exactly",
)

#: An empty project for the checked programs: their imports must not find the
#: modules of whatever directory the fuzzer runs in.
_PROJECT = tempfile.TemporaryDirectory(prefix="detaudit-fuzz-")


@lru_cache(maxsize=None)
def hazard_snippets() -> tuple[str, ...]:
    """Every rule's VALID and INVALID example, dedented, ending with a newline."""
    from detaudit.static.rule import all_rules

    snippets = []
    for rule in all_rules():
        for code in (*rule.VALID, *(example.code for example in rule.INVALID)):
            snippet = textwrap.dedent(code).strip("\n") + "\n"
            if python_parse_error(snippet) is None:
                snippets.append(snippet)
    return tuple(snippets)


def top_level_boundaries(program: str) -> list[int]:
    """Line indexes (0-based) before which a top-level statement starts on its
    own line: a snippet inserted there is still a top-level statement."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    boundaries = []
    previous_end = 0
    for statement in tree.body:
        if statement.col_offset == 0 and statement.lineno > previous_end:
            first = statement.decorator_list[0].lineno if getattr(statement, "decorator_list", None) else statement.lineno
            boundaries.append(first - 1)
        previous_end = statement.end_lineno
    return boundaries


def torch_flavoured(program: str, rng: random.Random, count: int = 3) -> str:
    """``program`` with ``count`` hazard snippets inserted before top-level
    statements or appended (a program that does not parse gets them on top)."""
    snippets = hazard_snippets()
    lines = split_lines(program, keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += "\n"
    boundaries = top_level_boundaries(program) if lines else []
    where = [*boundaries, len(lines)] if boundaries or not lines else [0]
    inserts: dict[int, list[str]] = {}
    for _ in range(count):
        inserts.setdefault(rng.choice(where), []).append(rng.choice(snippets))
    out = []
    for index in range(len(lines) + 1):
        out.extend(inserts.get(index, ()))
        if index < len(lines):
            out.append(lines[index])
    return "".join(out)


def problems(text: str, name: str = "fuzzed.py", *, fix: bool = True) -> list[str]:
    """What went wrong checking (and fixing) ``text`` as the file ``name`` of an
    empty project; empty when nothing did."""
    try:
        return _problems(text, Path(_PROJECT.name) / name, fix)
    except Exception as error:  # check_source and fix_source must never raise
        return [f"exception: {type(error).__name__}: {error}"]


def _problems(text: str, path: Path, fix: bool) -> list[str]:
    found = []
    result = check_source(text, path, project_root=path.parent)
    found += [f"internal error: {error}" for error in result.internal_errors]
    report = check_report(result.findings, files_checked=1, suppressed=result.suppressed, messages=result.messages,
                          errors=result.internal_errors, elapsed=0.0)
    try:
        if json.loads(json.dumps(report)) != report:
            found.append("report not JSON: it changes through a JSON round trip")
    except (TypeError, ValueError) as error:
        found.append(f"report not JSON: {error}")
    lines = split_lines(text)
    for finding in [*result.findings, *result.suppressed]:
        problem = _outside(finding, lines)
        if problem:
            found.append(f"position outside the file: {finding.code} {finding.name} at {finding.line}:{finding.column}-"
                         f"{finding.end_line}:{finding.end_column}: {problem}")
    if fix and not found:
        found += _fix_problems(text, path)
    return found


def _outside(finding, lines: list[str]) -> str | None:
    """Why the finding's position is not inside the file (None when it is).
    Line 0 is a whole-file finding; end 0 means "no end"."""
    if finding.line == 0:
        return None if finding.column == 0 and finding.end_line == 0 else "whole-file finding with a position"
    count = max(len(lines), 1)
    if not 1 <= finding.line <= count:
        return f"line outside 1..{count}"
    width = len(lines[finding.line - 1]) if lines else 0
    if not 1 <= finding.column <= width + 1:
        return f"column outside 1..{width + 1}"
    if finding.end_line == 0:
        return None
    if not finding.line <= finding.end_line <= count:
        return f"end line outside {finding.line}..{count}"
    end_width = len(lines[finding.end_line - 1])
    if not 1 <= finding.end_column <= end_width + 1:
        return f"end column outside 1..{end_width + 1}"
    if finding.end_line == finding.line and finding.end_column < finding.column:
        return "ends before it starts"
    return None


def _fix_problems(text: str, path: Path) -> list[str]:
    import libcst as cst

    first = fix_source(text, path, unsafe=True)
    if first.error is not None and not first.error.startswith(EXPECTED_FIX_REFUSALS):
        return [f"--fix error: {first.error}"]
    if first.error is not None:
        return []
    if first.text == text:
        return []
    try:
        cst.parse_module(first.text)
    except cst.ParserSyntaxError as error:
        return [f"--fix output does not parse: {' '.join(str(error).split())[:200]}"]
    if python_parse_error(text) is None and python_parse_error(first.text) is not None:
        return ["--fix output does not compile: Python's parser rejects it"]
    second = fix_source(first.text, path, unsafe=True)
    if second.text != first.text or second.fixed or second.error:
        return [f"--fix is not idempotent: second run fixed {second.fixed}, error {second.error!r}"]
    return []
