"""Which files a check covers: walking directories like ruff and pytest users expect.

A directory that cannot be read is skipped with a one-line warning; the walk
goes on.  (``os.path``'s tests are used instead of ``Path.is_file()``: they
answer False for a path they may not look at, where ``Path``'s raise.)"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

CHECKED_SUFFIXES = (".py", ".ipynb")
#: Directories never worth walking into.
SKIPPED_DIRECTORIES = frozenset(
    {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".env", "env", ".tox", ".nox",
     ".mypy_cache", ".pytest_cache", ".ruff_cache", ".detaudit_cache", "build", "dist",
     "node_modules", "site-packages", ".eggs", ".ipynb_checkpoints"}
)


class GitignoreRules:
    """The subset of .gitignore semantics that matters for skipping source files:
    globs, ``**``, anchored (``/x``) and directory-only (``x/``) patterns, ``!`` negation."""

    def __init__(self) -> None:
        self._rules: list[tuple[Path, str, bool, bool, bool]] = []  # base, pattern, negated, dir_only, anchored

    def extended(self, directory: Path) -> "GitignoreRules":
        gitignore = directory / ".gitignore"
        if not os.path.isfile(gitignore):
            return self
        extended = GitignoreRules()
        extended._rules = list(self._rules)
        try:
            lines = gitignore.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return self
        for raw in lines:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            line = line[1:] if negated else line
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            anchored = "/" in line
            extended._rules.append((directory, line.lstrip("/"), negated, dir_only, anchored))
        return extended

    def ignores(self, path: Path, is_dir: bool) -> bool:
        ignored = False
        for base, pattern, negated, dir_only, anchored in self._rules:
            if dir_only and not is_dir:
                continue
            try:
                relative = path.relative_to(base).as_posix()
            except ValueError:
                continue
            if anchored:
                hit = fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(relative, pattern.replace("**/", ""))
            else:
                hit = fnmatch.fnmatch(path.name, pattern)
            if hit:
                ignored = not negated
        return ignored


def _is_virtualenv(directory: Path) -> bool:
    return os.path.isfile(directory / "pyvenv.cfg")


def discover(
    paths: list[Path], exclude: list[str], root: Path | None, warnings: list[str] | None = None
) -> Iterator[Path]:
    """Files to check under ``paths`` (which exist), in a stable order.  A file named
    explicitly is always checked (as pre-commit passes them), whatever its suffix or
    ignores.  What is skipped for being unreadable is said in ``warnings``."""
    warnings = warnings if warnings is not None else []
    from detaudit.static.run.config import path_matches

    def excluded(path: Path) -> bool:
        if not exclude:
            return False
        shown = os.path.relpath(path, root) if root is not None else display_path(path)
        return any(path_matches(shown, pattern) for pattern in exclude)

    for given in paths:
        try:
            mode = os.stat(given).st_mode
        except OSError:
            mode = stat.S_IFREG  # cannot even be looked at: checking it reports why
        if stat.S_ISDIR(mode):
            yield from _walk(given, GitignoreRules(), excluded, warnings)
        elif not stat.S_ISREG(mode):
            warnings.append(f"{display_path(given)} is not a regular file; skipped")  # a FIFO would block the read
        elif not excluded(given):
            yield given


def _walk(directory: Path, ignores: GitignoreRules, excluded, warnings: list[str]) -> Iterator[Path]:
    ignores = ignores.extended(directory)
    try:
        with os.scandir(directory) as listing:
            entries = sorted(listing, key=lambda e: e.name)
    except OSError as error:
        warnings.append(f"cannot read directory {display_path(directory)}: {error.strerror or error}; skipped")
        return
    for entry in entries:
        path = Path(entry.path)
        try:
            is_directory = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_directory = False
        if is_directory:
            if entry.name in SKIPPED_DIRECTORIES or _is_virtualenv(path) or ignores.ignores(path, True) or excluded(path):
                continue
            yield from _walk(path, ignores, excluded, warnings)
        elif entry.name.endswith(CHECKED_SUFFIXES) and not ignores.ignores(path, False) and not excluded(path):
            yield path


#: Files that mark a project's root: packaging and version control.
PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git", ".hg")
#: What a training repository has at its top even without those (a zip download, a
#: container build context, a copied folder).
REPOSITORY_MARKERS = ("requirements.txt", "environment.yml", "environment.yaml", "Pipfile", "LICENSE", "LICENSE.md", "LICENSE.txt")
#: Weaker still: a subfolder may have its own README (``tools/README.md``).
README_MARKERS = ("README.md", "README.rst")
#: How far above a file repository markers and its own top-level imports are looked for.
MAX_IMPORT_LEVELS = 3
#: The head of a script read for its imports (they sit at the top).
MAX_IMPORT_SCAN_BYTES = 64 * 1024
_TOP_LEVEL_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([A-Za-z_]\w*)[\w.]*[ \t]+import\b|import[ \t]+([A-Za-z_]\w*))", re.MULTILINE)


@dataclass(frozen=True)
class ProjectRoot:
    """The folder a file's project modules are resolved from, and what gave it away."""

    path: Path
    found_by: str  # a marker file ("pyproject.toml", "requirements.txt"), "imports NAME", or "the file's folder"


def display_path(path: Path) -> str:
    """Paths are shown relative to the current directory when they are below it."""
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)


def project_root_of(path: Path) -> Path:
    return find_project_root(path).path


def find_project_root(path: Path) -> ProjectRoot:
    """The nearest ancestor with a packaging or version-control marker.  Without
    one, the outermost of: the nearest ancestor with a repository marker
    (``requirements.txt``, ``LICENSE``; else ``README.md``) and the nearest ancestor
    holding a module a script imports that its own folder does not (``lib`` for
    ``tools/train.py``), each looked for at most ``MAX_IMPORT_LEVELS`` above the
    file (a home folder's README is no project's).  Else the file's folder."""
    is_directory = os.path.isdir(path)
    directory = (path if is_directory else path.parent).resolve()
    marked = _marked_ancestor(directory, PROJECT_MARKERS, None)
    if marked is not None:
        return marked
    candidates = [
        found
        for found in (
            _marked_ancestor(directory, REPOSITORY_MARKERS, MAX_IMPORT_LEVELS) or _marked_ancestor(directory, README_MARKERS, MAX_IMPORT_LEVELS),
            None if is_directory else _imports_ancestor(path, directory),
        )
        if found is not None
    ]
    if candidates:
        return min(candidates, key=lambda root: len(root.path.parts))
    return ProjectRoot(directory, "the file's folder")


@functools.lru_cache(maxsize=None)
def _marked_ancestor(directory: Path, markers: tuple[str, ...], levels: int | None) -> ProjectRoot | None:
    """The nearest of ``directory`` and its ancestors (at most ``levels`` above) holding a marker."""
    for candidate in (directory, *directory.parents)[: None if levels is None else levels + 1]:
        for marker in markers:
            if os.path.exists(candidate / marker):
                return ProjectRoot(candidate, marker)
    return None


def _imports_ancestor(path: Path, directory: Path) -> ProjectRoot | None:
    """The nearest ancestor holding a top-level module the script imports, when its own folder does not."""
    try:
        with open(path, encoding="utf-8", errors="replace") as stream:
            text = stream.read(MAX_IMPORT_SCAN_BYTES)
    except OSError:
        return None
    names = {a or b for a, b in _TOP_LEVEL_IMPORT.findall(text)} - set(sys.stdlib_module_names)
    names = {name for name in names if not _holds_module(directory, name)}
    for candidate in list(directory.parents)[:MAX_IMPORT_LEVELS]:
        # at the ancestor itself, or in one of its source folders (``lib/models``)
        folders = [candidate, *(candidate / entry for entry in sorted(_listing(candidate)) if not entry.startswith((".", "_")) and os.path.isdir(candidate / entry))]
        for folder in folders:
            found = sorted(name for name in names if _holds_module(folder, name))
            if found:
                where = found[0] if folder == candidate else f"{folder.name}/{found[0]}"
                return ProjectRoot(candidate, f"imports {where}")
    return None


def _holds_module(directory: Path, name: str) -> bool:
    return os.path.isfile(directory / f"{name}.py") or os.path.isfile(directory / name / "__init__.py") or (
        os.path.isdir(directory / name) and any(entry.endswith(".py") for entry in _listing(directory / name))
    )


def _listing(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []
