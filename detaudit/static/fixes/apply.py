"""``detaudit check --fix`` / ``--diff``: apply the edits rules attach to findings.

The check that found the problems is not reused: its results may come from the
cache or a worker process, without syntax trees.  ``apply_fixes`` re-checks each
file that has findings (the check is cheap), which gives fresh rule hits whose
edits point into a tree it can transform, and then

- applies every applicable edit of the file in one libcst transform, so text
  outside the edited nodes stays byte-for-byte as it was;
- re-checks the new text and repeats (an edit inside a node that another edit
  replaces waits for the next round) until nothing fixable is left, so a
  second run changes nothing;
- writes the file atomically (temporary file in the same directory, then
  ``os.replace``, mode, owner and group kept) unless ``write=False``
  (``--diff``).  A file with other hard links, or whose owner the fixing
  user cannot give the new file, is rewritten in place instead: that is the
  only way to keep its links and its owner.

A file that does not parse is never touched; neither is one whose fixed text
would not compile, a read-only one, nor one that changed on disk while it
was being fixed.  The file is locked while it is compared and replaced, so
concurrent ``--fix`` runs fix each file once (the others find it changed) and
each reports only what it fixed.
Suppressed and ignored findings are not fixed.  Unsafe edits, and any edit
inside a ``try`` block or an ``if`` that tests a version or ``hasattr`` (code
there is often a compatibility branch), are applied only with ``unsafe=True``.
"""

from __future__ import annotations

import bisect
import contextlib
import difflib
import io
import os
import stat
import tempfile
import tokenize
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Iterable, Iterator, Mapping

import libcst as cst

from detaudit.findings import Finding, SuggestedFix, TextEdit
from detaudit.static.context import FileContext, FileResult
from detaudit.static.engine.check import analyse_source
from detaudit.static.engine.sources import UnreadableSource, decode_python, python_parse_error, split_lines
from detaudit.static.fixes.code import DEFAULT_FIX_STYLE
from detaudit.static.fixes.edits import Edit, InsertStatement, Replace, comment_words, edits_of, is_import_line
from detaudit.static.rule import Rule, RuleHit

if TYPE_CHECKING:
    from detaudit.static.run.config import Config

#: Rounds of fix-and-recheck per file; real files settle in one or two.
MAX_ROUNDS = 8


@dataclass
class FixOutcome:
    diff: str = ""  # unified diff of every change (printed by --diff)
    fixed: int = 0  # findings the fixes removed
    remaining: int = 0  # findings of the selected rules left in the given files
    errors: list[str] = field(default_factory=list)  # one line each, "path: what went wrong"
    changed: list[str] = field(default_factory=list)  # display paths rewritten (with write=False: that would be)


@dataclass(frozen=True)
class FixedSource:
    text: str  # the fixed code (the original when nothing was fixed or on error)
    fixed: int  # findings the fixes removed
    error: str | None  # one line, when the fixes stopped


def fix_source(
    text: str,
    path: Path | str = "<snippet>.py",
    *,
    rules: Iterable[type[Rule]] | None = None,
    unsafe: bool = False,
    fix_style: str = DEFAULT_FIX_STYLE,
) -> FixedSource:
    """Fix Python ``text`` as ``--fix`` would fix the file ``path``, without
    touching any file (used by tests and the fuzzer)."""
    from detaudit.static.rule import all_rules

    selected = list(rules) if rules is not None else all_rules()
    reported = _Reported({rule.code for rule in selected}, None)
    fixer = _FileFixer(Path(path), str(path), selected, reported, unsafe, fix_style)
    fixed_text = fixer.fixed_text(text)
    return FixedSource(fixed_text, fixer.fixed if fixer.error is None else 0, fixer.error)


def apply_fixes(
    results: Iterable[FileResult],
    *,
    unsafe: bool = False,
    write: bool = True,
    rules: Iterable[type[Rule]] | None = None,
    paths: Mapping[str, Path] | None = None,
    config: "Config | None" = None,
) -> FixOutcome:
    """Fix the findings of a finished check.

    ``paths`` maps the results' display paths to their files (default: the
    display path is the file); ``rules`` are the selected rules (default: all);
    with ``config`` its per-file ignores are honoured as the check honoured them,
    and its fix style used.
    """
    from detaudit.static.rule import all_rules

    selected = list(rules) if rules is not None else all_rules()
    reported = _Reported({rule.code for rule in selected}, config)
    fix_style = config.fix_style if config is not None else DEFAULT_FIX_STYLE
    outcome = FixOutcome()
    for result in results:
        current = reported(result.findings)
        if not result.parsed or not current:
            outcome.remaining += len(current)
            continue
        path = Path(paths[result.path]) if paths is not None and result.path in paths else Path(result.path)
        fixer = _FileFixer(path, result.path, selected, reported, unsafe, fix_style)
        fixer.run(write=write)
        if fixer.error is not None:
            outcome.errors.append(f"{result.path}: {fixer.error}")
            outcome.remaining += len(current)
            continue
        outcome.fixed += fixer.fixed
        outcome.remaining += fixer.remaining
        if fixer.diff:
            outcome.diff += fixer.diff
            outcome.changed.append(result.path)
    return outcome


@dataclass(frozen=True)
class _Reported:
    """Which findings the check reports: those of enabled rules that no per-file ignore removes."""

    enabled: frozenset[str] | set[str]
    config: "Config | None"

    def __call__(self, findings: list[Finding]) -> list[Finding]:
        if self.config is None:
            return [f for f in findings if f.code in self.enabled]
        from detaudit.static.run.config import filter_findings

        return filter_findings(findings, set(self.enabled), self.config)


class _FileFixer:
    """Fixes one file: read, rounds of check-and-fix, diff, atomic write."""

    def __init__(
        self, path: Path, display_path: str, rules: list, reported: _Reported, unsafe: bool, fix_style: str = DEFAULT_FIX_STYLE
    ) -> None:
        self.path = path
        self.fix_style = fix_style
        self.display_path = display_path
        self.rules = rules
        self.reported = reported
        self.unsafe = unsafe
        self.error: str | None = None
        self.fixed = 0
        self.remaining = 0
        self.diff = ""

    def run(self, *, write: bool) -> None:
        if self.path.suffix == ".ipynb":
            self.error = "notebooks are not fixed automatically; fix the cells by hand"
            return
        try:
            data = self.path.read_bytes()
            original = decode_python(data)
        except OSError as error:
            self.error = f"cannot read: {error.strerror or error}"
            return
        except UnreadableSource as error:
            self.error = str(error)
            return
        fixed_text = self.fixed_text(original)
        if fixed_text == original:
            return
        self.diff = unified_diff(original, fixed_text, self.display_path)
        if write:
            self._write(data, fixed_text.encode(_encoding_of(data)))

    def fixed_text(self, original: str) -> str:
        """``original`` with every applicable fix applied; ``original`` itself when
        there is none, or when something went wrong (``self.error`` says what)."""
        fixed_text = _with_final_newline_of(original, self._fix(original))
        if self.error is not None:
            return original
        if fixed_text != original and _compiles(original) and not _compiles(fixed_text):
            self.error = "the fixed code would not compile (a detaudit bug: please report it); file left unchanged"
            return original
        return fixed_text

    def _fix(self, text: str) -> str:
        """Rounds of check-and-fix until no applicable edit is left."""
        before: int | None = None
        for round_number in range(MAX_ROUNDS + 1):
            result, context = self._check(text)
            if result.internal_errors:
                self.error = f"not fixed: {result.internal_errors[0].split(': ', 1)[1]}"
                return text
            if not result.complete:
                self.error = "not fixed: part of it was not analysed (see its parse-error finding)"
                return text
            if not result.parsed or context is None:
                self.error = (
                    "does not parse; not fixed"
                    if before is None
                    else "a fix produced code that does not parse (a detaudit bug: please report it); file left unchanged"
                )
                return text
            if before is None and _with_final_newline_of(text, context.module.code) != text:
                # every fix is written as libcst's code for the file: it must be the file
                # (but for the final CR libcst drops, which the result gets back)
                self.error = "libcst does not reproduce this file exactly (a libcst limitation); not fixed"
                return text
            # per-file ignores match the display path, as in the check
            findings = self.reported([replace(f, path=self.display_path) for f in result.findings])
            if before is None:
                before = len(findings)
            self.remaining = len(findings)
            hits = self._fixable_hits(result, findings, context)
            new_text = apply_edits(context.module, hits, context.facts.names.bindings(), unsafe=self.unsafe) if hits else text
            if new_text == text:
                break
            if round_number == MAX_ROUNDS:
                self.error = f"fixes did not settle in {MAX_ROUNDS} rounds (a detaudit bug: please report it); file left unchanged"
                return text
            text = new_text
        self.fixed = max(0, before - self.remaining)
        return text

    def suggested_fixes(self) -> dict[tuple[str, int, int], SuggestedFix]:
        """(code, line, column) of each reported finding that has a safe fix ->
        that fix alone, as edits of the file's text."""
        try:
            original = decode_python(self.path.read_bytes())
        except (OSError, UnreadableSource):
            return {}
        result, context = self._check(original)
        if result.internal_errors or not result.complete or context is None or context.module.code != original:
            return {}
        findings = self.reported([replace(f, path=self.display_path) for f in result.findings])
        bindings = context.facts.names.bindings()
        positions = cst.MetadataWrapper(context.module, unsafe_skip_copy=True).resolve(cst.metadata.PositionProvider)
        fixes = {}
        for hit in self._fixable_hits(result, findings, context):
            fixed = apply_edits(context.module, [hit], bindings)
            if fixed == original or not _compiles(fixed):
                continue
            start = positions[hit.node].start
            description = f"{hit.rule.code} {hit.rule.name}: the fix `detaudit check --fix` applies"
            fixes[(hit.rule.code, start.line, start.column + 1)] = SuggestedFix(description, text_edits(original, fixed))
        return fixes

    def _check(self, text: str) -> tuple[FileResult, FileContext | None]:
        from detaudit.static.run.discovery import project_root_of

        return analyse_source(
            text, self.path, rules=self.rules, project_root=project_root_of(self.path), fix_style=self.fix_style
        )

    @staticmethod
    def _fixable_hits(result: FileResult, findings: list[Finding], context: FileContext) -> list[RuleHit]:
        """Hits with edits whose findings are reported (not suppressed, not ignored).

        Suppression comments cover a line and per-file ignores a file, so a
        hit's rule and line decide whether its finding is reported."""
        hits = [hit for hit in context.hits if edits_of(hit.fix)]
        if hits and (result.suppressed or len(findings) != len(result.findings)):
            reported = {(f.code, f.line) for f in findings}
            positions = cst.MetadataWrapper(context.module, unsafe_skip_copy=True).resolve(cst.metadata.PositionProvider)
            hits = [hit for hit in hits if (hit.rule.code, positions[hit.node].start.line) in reported]
        return hits

    def _write(self, original_data: bytes, new_data: bytes) -> None:
        target = Path(os.path.realpath(self.path))  # through a symlink: the link stays a link
        try:
            with _locked(target) as (current, status):
                if current.read() != original_data:
                    self.error = "changed on disk while being fixed; left alone"
                elif not status.st_mode & 0o222 or not os.access(target, os.W_OK):
                    self.error = "read-only; not fixed (make it writable to fix it)"
                elif status.st_nlink > 1 or not _replace(target, new_data, status):
                    _rewrite_in_place(target, new_data)
        except OSError as error:
            self.error = f"cannot write the fix: {error.strerror or error}; file left unchanged"
        if self.error is not None:
            self.diff = ""


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[tuple[BinaryIO, os.stat_result]]:
    """``path`` opened for reading and locked against other detaudit runs, with its
    status.  A run that waited for the lock while another replaced the file
    opens the new file (the lock it got was the old file's)."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; the content comparison still guards
        fcntl = None
    while True:
        with open(path, "rb") as stream:
            if fcntl is not None:
                fcntl.flock(stream.fileno(), fcntl.LOCK_EX)
            status = os.fstat(stream.fileno())
            now = os.stat(path)
            if (now.st_dev, now.st_ino) == (status.st_dev, status.st_ino):
                yield stream, status
                return


def _replace(target: Path, data: bytes, status: os.stat_result) -> bool:
    """Atomically replace ``target`` by a new file with ``data`` and its mode,
    owner and group; False (and nothing changed) when the new file cannot be
    given that owner and group."""
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".detaudit-fix")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, stat.S_IMODE(status.st_mode))
        created = os.stat(temporary)
        if hasattr(os, "chown") and (created.st_uid, created.st_gid) != (status.st_uid, status.st_gid):
            try:
                os.chown(temporary, status.st_uid, status.st_gid)
            except PermissionError:
                os.unlink(temporary)
                return False
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return True


def _rewrite_in_place(target: Path, data: bytes) -> None:
    """Write ``data`` over ``target``'s own content: its inode, links, owner and
    mode stay.  Not atomic; used only where a replacement would lose them."""
    with open(target, "r+b") as stream:
        stream.write(data)
        stream.truncate()
        stream.flush()
        os.fsync(stream.fileno())


def _with_final_newline_of(original: str, fixed: str) -> str:
    """libcst drops the final newline of a file whose newlines are lone CRs
    (old Mac line endings): give it back."""
    if original.endswith("\r") and not fixed.endswith(("\r", "\n")):
        return fixed + "\r"
    return fixed


# -- suggested fixes (SARIF) -----------------------------------------------------


def with_suggested_fixes(
    findings: list[Finding],
    results: Iterable[FileResult],
    *,
    rules: Iterable[type[Rule]] | None = None,
    paths: Mapping[str, Path] | None = None,
    config: "Config | None" = None,
) -> list[Finding]:
    """``findings`` (of a finished check with ``results``), each that has a safe
    fix carrying it as a ``SuggestedFix``: the edits ``--fix`` would make for
    that finding alone, against the file as it is.  Files are re-checked as
    ``--fix`` re-checks them; a file that cannot be fixed gives no fixes."""
    from detaudit.static.rule import all_rules

    selected = list(rules) if rules is not None else all_rules()
    reported = _Reported({rule.code for rule in selected}, config)
    fix_style = config.fix_style if config is not None else DEFAULT_FIX_STYLE
    fixes: dict[tuple[str, str, int, int], SuggestedFix] = {}
    for result in results:
        if not result.parsed or not reported(result.findings) or result.path.endswith(".ipynb"):
            continue
        path = Path(paths[result.path]) if paths is not None and result.path in paths else Path(result.path)
        fixer = _FileFixer(path, result.path, selected, reported, False, fix_style)
        for (code, line, column), fix in fixer.suggested_fixes().items():
            fixes[(result.path, code, line, column)] = fix
    return [replace(f, fix=fixes.get((f.path, f.code, f.line, f.column), f.fix)) for f in findings]


def text_edits(old: str, new: str) -> tuple[TextEdit, ...]:
    """The edits that turn ``old`` into ``new``: one per changed run of lines,
    trimmed to the changed words."""
    old_lines, new_lines = split_lines(old, keepends=True), split_lines(new, keepends=True)
    starts = [0]
    for line in old_lines:
        starts.append(starts[-1] + len(line))

    def position(offset: int) -> tuple[int, int]:
        index = bisect.bisect_right(starts, offset) - 1
        return index + 1, offset - starts[index] + 1

    edits = []
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        start, end = starts[i1], starts[i2]
        deleted, inserted = old[start:end], "".join(new_lines[j1:j2])
        prefix = len(_common_prefix(deleted, inserted))
        while prefix and _in_word(deleted[prefix - 1]):
            prefix -= 1
        suffix = len(_common_prefix(deleted[prefix:][::-1], inserted[prefix:][::-1]))
        while suffix and _in_word(deleted[len(deleted) - suffix]):
            suffix -= 1
        (line, column), (end_line, end_column) = position(start + prefix), position(end - suffix)
        edits.append(TextEdit(line, column, end_line, end_column, inserted[prefix : len(inserted) - suffix]))
    return tuple(edits)


def _common_prefix(a: str, b: str) -> str:
    return os.path.commonprefix([a, b])


def _in_word(character: str) -> bool:
    return character.isalnum() or character == "_"


# -- applying edits -------------------------------------------------------------


def apply_edits(module: cst.Module, hits: list[RuleHit], bindings: Mapping[str, str], *, unsafe: bool = False) -> str:
    """The code of ``module`` with the edits of ``hits`` applied in one transform.

    A hit's edits stand or fall together.  Those not allowed (unsafe, or in a
    guarded block, without ``unsafe``) are skipped; those inside a node that
    another edit replaces wait for the next round.  ``bindings`` (local name ->
    qualified name) tells which imports the edits need that the file lacks.
    """
    layout = _Layout.of(module, {id(_target(e)) for hit in hits for e in edits_of(hit.fix)})
    allowed = [
        edits_of(hit.fix)
        for hit in hits
        if unsafe or all(edit.safe and not layout.guarded(_target(edit)) for edit in edits_of(hit.fix))
    ]
    replaced = {id(edit.old) for edits in allowed for edit in edits if isinstance(edit, Replace)}
    chosen = [
        edit
        for edits in allowed
        if not any(layout.inside_any(_target(edit), replaced, itself=isinstance(edit, InsertStatement)) for edit in edits)
        for edit in edits
    ]
    if not chosen:
        return module.code
    return module.visit(_EditApplier(chosen, bindings, layout)).code


def _target(edit: Edit) -> cst.CSTNode:
    return edit.old if isinstance(edit, Replace) else edit.anchor


class _Layout(cst.CSTVisitor):
    """Where each edit target sits: its module-level statement, whether it is
    in a guarded block, and which other targets enclose it."""

    def __init__(self, module: cst.Module, targets: set[int]) -> None:
        super().__init__()
        self.targets = targets
        self._top = {id(statement): index for index, statement in enumerate(module.body)}
        self._top_index = 0
        self._guards = 0
        self._enclosing: list[int] = []  # targets on the current path
        self.top_index: dict[int, int] = {}
        self._guarded: set[int] = set()
        self._ancestors: dict[int, tuple[int, ...]] = {}

    @classmethod
    def of(cls, module: cst.Module, targets: set[int]) -> "_Layout":
        layout = cls(module, targets)
        module.visit(layout)
        return layout

    def guarded(self, node: cst.CSTNode) -> bool:
        return id(node) in self._guarded

    def inside_any(self, node: cst.CSTNode, targets: set[int], *, itself: bool = False) -> bool:
        """Whether a node of ``targets`` encloses ``node`` (or is ``node``, with ``itself``)."""
        return any(t in targets for t in self._ancestors.get(id(node), ())) or (itself and id(node) in targets)

    def on_visit(self, node: cst.CSTNode) -> bool:
        self._top_index = self._top.get(id(node), self._top_index)
        if id(node) in self.targets:
            self.top_index[id(node)] = self._top_index
            self._ancestors[id(node)] = tuple(self._enclosing)
            if self._guards:
                self._guarded.add(id(node))
            self._enclosing.append(id(node))
        if _is_guard(node):
            self._guards += 1
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if _is_guard(original_node):
            self._guards -= 1
        if id(original_node) in self.targets:
            self._enclosing.pop()


def _is_guard(node: cst.CSTNode) -> bool:
    if isinstance(node, (cst.Try, cst.TryStar)):
        return True
    if isinstance(node, cst.If):
        test = cst.Module([]).code_for_node(node.test)
        return "version" in test.lower() or "hasattr(" in test
    return False


class _EditApplier(cst.CSTTransformer):
    def __init__(self, edits: list[Edit], bindings: Mapping[str, str], layout: _Layout) -> None:
        super().__init__()
        self.replacements: dict[int, cst.CSTNode] = {}
        self.stale_comments: dict[int, frozenset[str]] = {}  # id(replaced node) -> Replace.stale_comment
        self._stale_in_statement: set[str] = set()  # of the replacements in the statement being left
        self.insertions: dict[tuple[int, bool], list[str]] = {}  # (id(anchor), before) -> statement codes
        self.imports: list[str] = []
        self.first_edited_top: int | None = None
        for edit in edits:
            if isinstance(edit, Replace):
                self.replacements.setdefault(id(edit.old), edit.new)
                if edit.stale_comment:
                    self.stale_comments[id(edit.old)] = edit.stale_comment
            else:
                codes = self.insertions.setdefault((id(edit.anchor), edit.before), [])
                if edit.code not in codes:
                    codes.append(edit.code)
            needed = [m for m in edit.imports if bindings.get(m) != m and m not in self.imports]
            if needed:
                self.imports.extend(needed)
                top = layout.top_index[id(_target(edit))] + (0 if isinstance(edit, Replace) or edit.before else 1)
                self.first_edited_top = top if self.first_edited_top is None else min(top, self.first_edited_top)

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        updated = super().on_leave(original_node, updated_node)
        self._stale_in_statement |= self.stale_comments.get(id(original_node), frozenset())
        if isinstance(original_node, cst.BaseStatement):
            stale, self._stale_in_statement = self._stale_in_statement, set()
            if stale and isinstance(updated, cst.SimpleStatementLine):
                updated = _without_stale_comment(updated, stale)
        return self.replacements.get(id(original_node), updated)

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self._with_insertions(original_node.body, updated_node.body))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._with_insertions(original_node.body, updated_node.body, self._import_position(original_node))
        return updated_node.with_changes(body=body)

    def _import_position(self, module: cst.Module) -> int | None:
        """Where missing imports go: after the last module-level import above
        the first statement that needs them, else right before that statement."""
        if not self.imports or self.first_edited_top is None:
            return None
        for index in range(self.first_edited_top - 1, -1, -1):
            if is_import_line(module.body[index]):
                return index + 1
        return self.first_edited_top

    def _with_insertions(self, originals, updated, import_position: int | None = None) -> list:
        """The block's statements with insertions: between statement i-1 and i come
        the missing imports (when they go there), what goes after i-1, what goes before i."""
        new_body: list[cst.BaseStatement] = []
        previous = None
        for index, (original, statement) in enumerate([*zip(originals, updated), (None, None)]):
            if index == import_position:
                new_body.extend(cst.parse_statement(f"import {module}") for module in self.imports)
            after = self._parsed(self.insertions.get((id(previous), False), ())) if previous is not None else []
            if after and is_import_line(previous):
                # setup code after the imports: set off by one blank line
                after[0] = after[0].with_changes(leading_lines=[cst.EmptyLine()])
            elif after and isinstance(previous, (cst.FunctionDef, cst.ClassDef)):
                after[0] = after[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
            new_body.extend(after)
            if statement is None:
                break
            new_body.extend(self._parsed(self.insertions.get((id(original), True), ())))
            new_body.append(statement)
            previous = original
        return new_body

    @staticmethod
    def _parsed(codes) -> list[cst.BaseStatement]:
        return [cst.parse_statement(code) for code in codes]


def _without_stale_comment(statement: cst.SimpleStatementLine, stale: set[str]) -> cst.SimpleStatementLine:
    """The statement without the comment ending its line when that comment names
    one of the ``stale`` words (it describes what the fix undid)."""
    trailing = statement.trailing_whitespace
    if trailing.comment is None or not comment_words(trailing.comment.value) & stale:
        return statement
    return statement.with_changes(trailing_whitespace=trailing.with_changes(whitespace=cst.SimpleWhitespace(""), comment=None))


def _compiles(text: str) -> bool:
    return python_parse_error(text) is None


def _encoding_of(data: bytes) -> str:
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return encoding


def unified_diff(old: str, new: str, display_path: str) -> str:
    """A unified diff that ``git apply`` and ``patch -p1`` accept."""
    lines = difflib.unified_diff(
        split_lines(old, keepends=True), split_lines(new, keepends=True), f"a/{display_path}", f"b/{display_path}"
    )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
