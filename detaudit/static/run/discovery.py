"""Which files a check covers: walking directories like ruff and pytest users expect.

A directory that cannot be read is skipped with a one-line warning; the walk
goes on.  (``os.path``'s tests are used instead of ``Path.is_file()``: they
answer False for a path they may not look at, where ``Path``'s raise.)"""

from __future__ import annotations

import fnmatch
import functools
import os
import stat
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


def display_path(path: Path) -> str:
    """Paths are shown relative to the current directory when they are below it."""
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)


def project_root_of(path: Path) -> Path:
    """The nearest ancestor that looks like a project root (pyproject.toml, setup.py,
    setup.cfg or .git), else the file's directory."""
    directory = path if os.path.isdir(path) else path.parent
    return _project_root_of_directory(directory.resolve())


@functools.lru_cache(maxsize=None)
def _project_root_of_directory(directory: Path) -> Path:
    for candidate in (directory, *directory.parents):
        if any(os.path.exists(candidate / marker) for marker in ("pyproject.toml", "setup.py", "setup.cfg", ".git")):
            return candidate
    return directory
