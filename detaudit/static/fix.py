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
  ``os.replace``, file mode kept) unless ``write=False`` (``--diff``).

A file that does not parse is never touched; neither is one whose fixed text
would not compile, nor one that changed on disk while it was being fixed.
Suppressed and ignored findings are not fixed.  Unsafe edits, and any edit
inside a ``try`` block or an ``if`` that tests a version or ``hasattr`` (code
there is often a compatibility branch), are applied only with ``unsafe=True``.
"""

from __future__ import annotations

import difflib
import io
import os
import stat
import tempfile
import tokenize
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping

import libcst as cst

from detaudit.findings import Finding
from detaudit.static.edits import Edit, InsertStatement, Replace, edits_of, is_import_line
from detaudit.static.engine import FileResult, analyse_source
from detaudit.static.rule import Rule, RuleHit
from detaudit.static.sources import UnreadableSource, decode_python

if TYPE_CHECKING:
    from detaudit.static.config import Config
    from detaudit.static.engine import FileContext

#: Rounds of fix-and-recheck per file; real files settle in one or two.
MAX_ROUNDS = 8


@dataclass
class FixOutcome:
    diff: str = ""  # unified diff of every change (printed by --diff)
    fixed: int = 0  # findings the fixes removed
    remaining: int = 0  # findings of the selected rules left in the given files
    errors: list[str] = field(default_factory=list)  # one line each, "path: what went wrong"
    changed: list[str] = field(default_factory=list)  # display paths rewritten (with write=False: that would be)


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
    with ``config`` its per-file ignores are honoured as the check honoured them.
    """
    from detaudit.static.rule import all_rules

    selected = list(rules) if rules is not None else all_rules()
    reported = _Reported({rule.code for rule in selected}, config)
    outcome = FixOutcome()
    for result in results:
        current = reported(result.findings)
        if not result.parsed or not current:
            outcome.remaining += len(current)
            continue
        path = Path(paths[result.path]) if paths is not None and result.path in paths else Path(result.path)
        fixer = _FileFixer(path, result.path, selected, reported, unsafe)
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
        from detaudit.static.config import filter_findings

        return filter_findings(findings, set(self.enabled), self.config)


class _FileFixer:
    """Fixes one file: read, rounds of check-and-fix, diff, atomic write."""

    def __init__(self, path: Path, display_path: str, rules: list, reported: _Reported, unsafe: bool) -> None:
        self.path = path
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
        fixed_text = self._fix(original)
        if self.error is not None or fixed_text == original:
            return
        if _compiles(original) and not _compiles(fixed_text):
            self.error = "the fixed code would not compile (a detaudit bug: please report it); file left unchanged"
            return
        self.diff = unified_diff(original, fixed_text, self.display_path)
        if write:
            self._write(data, fixed_text.encode(_encoding_of(data)))

    def _fix(self, text: str) -> str:
        """Rounds of check-and-fix until no applicable edit is left."""
        before: int | None = None
        for round_number in range(MAX_ROUNDS + 1):
            result, context = self._check(text)
            if not result.parsed or context is None:
                self.error = (
                    "does not parse; not fixed"
                    if before is None
                    else "a fix produced code that does not parse (a detaudit bug: please report it); file left unchanged"
                )
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

    def _check(self, text: str) -> tuple[FileResult, "FileContext | None"]:
        from detaudit.static.discovery import project_root_of

        return analyse_source(text, self.path, rules=self.rules, project_root=project_root_of(self.path))

    @staticmethod
    def _fixable_hits(result: FileResult, findings: list[Finding], context: "FileContext") -> list[RuleHit]:
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
            if target.read_bytes() != original_data:
                self.error = "changed on disk while being fixed; left alone"
                self.diff = ""
                return
            mode = stat.S_IMODE(target.stat().st_mode)
            handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".detaudit-fix")
            try:
                with os.fdopen(handle, "wb") as stream:
                    stream.write(new_data)
                    stream.flush()
                    os.fsync(stream.fileno())
                os.chmod(temporary, mode)
                os.replace(temporary, target)
            except BaseException:
                os.unlink(temporary)
                raise
        except OSError as error:
            self.error = f"cannot write the fix: {error.strerror or error}; file left unchanged"
            self.diff = ""


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
        self.insertions: dict[tuple[int, bool], list[str]] = {}  # (id(anchor), before) -> statement codes
        self.imports: list[str] = []
        self.first_edited_top: int | None = None
        for edit in edits:
            if isinstance(edit, Replace):
                self.replacements.setdefault(id(edit.old), edit.new)
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


def _compiles(text: str) -> bool:
    try:
        compile(text, "<fixed file>", "exec", dont_inherit=True, flags=0x400)  # ast.PyCF_ONLY_AST
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def _encoding_of(data: bytes) -> str:
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return encoding


def unified_diff(old: str, new: str, display_path: str) -> str:
    """A unified diff that ``git apply`` and ``patch -p1`` accept."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{display_path}", f"b/{display_path}"
    )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
