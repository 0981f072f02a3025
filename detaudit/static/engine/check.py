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
  neither settles (``locate.py``).

Suppression comments are read in ``suppressions.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from detaudit.findings import Finding
from detaudit.static.context import FileContext, FileResult
from detaudit.static.engine.limits import DEFAULT_FILE_TIME_BUDGET, Deadline, OverBudget, TooComplex, without_complex_expressions
from detaudit.static.engine.locate import hit_spans
from detaudit.static.engine.notebooks import notebook_source
from detaudit.static.engine.sources import (
    MAX_FILE_BYTES,
    SourceUnit,
    UnreadableSource,
    decode_python,
    python_parse_error,
    split_lines,
)
from detaudit.static.engine.suppressions import suppression_for
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
#: The first name of each module an import statement names (``from options.train_options import X``: options).
_IMPORTED_TOP_NAMES = re.compile(r"^[ \t]*(?:from[ \t]+([A-Za-z_]\w*)|import[ \t]+([A-Za-z_]\w*))", re.MULTILINE)


def might_matter(text: str, path: Path | None = None, project_root: Path | None = None) -> bool:
    """Whether ``text`` needs a parse: it mentions a relevant name, or it imports
    a module of its project (a script without a ``__main__`` guard that trains
    through ``from trainers.pix2pix_trainer import Pix2PixTrainer`` never names
    torch itself)."""
    if any(s in text for s in RELEVANT_SUBSTRINGS):
        return True
    if path is None or "import" not in text:
        return False
    folders = [path.parent] + ([project_root] if project_root is not None and project_root != path.parent else [])
    for found in _IMPORTED_TOP_NAMES.finditer(text):
        name = found.group(1) or found.group(2)
        for folder in folders:
            if (folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file() or (folder / name).is_dir():
                return True
    return False


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
    shared = path.suffix == ".py" and budget == DEFAULT_FILE_TIME_BUDGET
    return _check_unit(unit, path, display_path, project_root, None, budget, disk_data=data if shared else None)[0]


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
    disk_data: bytes | None = None,
) -> tuple[FileResult, FileContext | None]:
    """Check one unit; a failure of detaudit's own code becomes an internal
    error of this file's result (or a parse error, for a tree too deep for
    libcst's recursive code, or an analysis over the time budget), never an
    exception that stops the other files."""
    if not might_matter(unit.text, path, project_root):
        return FileResult(display_path), None
    from detaudit.static.rules.parse_error import ParseError

    def not_analysed(reason: str) -> tuple[FileResult, None]:
        return FileResult(display_path, findings=[ParseError.finding(display_path, reason)], complete=False), None

    try:
        with file_scope():
            return _parse_and_analyse(unit, path, display_path, project_root, rules, budget, fix_style, disk_data)
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
    disk_data: bytes | None = None,
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
    # the project index parses the same text of a file on disk when another file imports it:
    # one parse serves both (the tree of an imported module, or this check's tree for a later import)
    index = digest = module = None
    if disk_data is not None and not skipped:
        from detaudit.static.analyses.project import content_hash, project_index

        index, digest = project_index(project_root), content_hash(disk_data)
        module = index.tree_of(path, digest)
    try:
        if module is None:
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
    if index is not None:
        index.adopt(path, digest, module, facts)
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


def _collect_findings(context: FileContext, result: FileResult, deadline: Deadline) -> None:
    spans = hit_spans(context, deadline)
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
