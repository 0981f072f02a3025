"""Where a project's own modules are found: the import system, read statically.

Python finds ``import models`` in the importing script's folder, then on
``sys.path``.  Training repositories put their packages there at run time
(``import _init_paths`` whose module-level code does
``sys.path.insert(0, osp.join(osp.dirname(__file__), '..', 'lib'))``,
``sys.path.append(os.path.dirname(__file__) + "/..")``,
``sys.path.insert(0, "src")``), or keep them under ``src/``.  ``ModuleLocator``
answers "which file is this module?" from the importer's folder, the folders
the entry script's path edits add (its own and those of the project modules it
imports), the project root and its ``src/``; ``path_edits`` reads the edits.
A module found nowhere there is taken from the one source folder (a folder of
the root, or of one of those, that is no package: ``lib/``, ``src/lib/``) that
holds it, as when a library module is checked without the script that puts its
folder on the path.

Path edits are read, never run: a literal, ``__file__`` and names assigned
once, through ``os.path.dirname/abspath/realpath/normpath/join``, ``str``,
``pathlib.Path`` (``.parent``, ``.resolve()``, ``/``) and ``+``; a wrapper
(``def add_path(p): sys.path.insert(0, p)``) is followed to its callers in the
same file.  A relative literal is taken from the project root, where
users start their scripts.

``ModuleLocator.files_mentioning`` answers the reverse question for a name:
which of the project's files mention it (where a function may be called from).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator

import libcst as cst

from detaudit.static.engine.facts import CallFact, FileFacts

#: Calls that add a folder to the module search path -> the position of that folder.
SEARCH_PATH_EDITS = {"sys.path.insert": 1, "sys.path.append": 0, "site.addsitedir": 0}
#: Functions whose result is a path computed from their string arguments.
_PATH_FUNCTIONS = {
    "os.path.dirname": os.path.dirname,
    "os.path.abspath": os.path.abspath,
    "os.path.realpath": os.path.abspath,  # links are not resolved statically
    "os.path.normpath": os.path.normpath,
    "os.path.join": os.path.join,
    "os.fspath": str,
    "str": str,
    "pathlib.Path": os.path.join,
}
_PATH_METHODS = {"resolve": os.path.abspath, "absolute": os.path.abspath, "joinpath": os.path.join}
_MAX_DEPTH = 8


def path_edits(facts: FileFacts, path: Path, root: Path) -> tuple[Path, ...]:
    """The existing folders that running ``path`` (parsed into ``facts``) adds to ``sys.path``."""
    found: list[Path] = []
    for call in facts.calls:
        position = SEARCH_PATH_EDITS.get(call.qualname or "")
        if position is None:
            continue
        for value in _edited_values(facts, call, position):
            text = _path_text(value, facts, path, 0)
            if text is None:
                continue
            folder = Path(os.path.normpath(text if os.path.isabs(text) else root / text))
            if os.path.isdir(folder) and folder not in found:
                found.append(folder)
    return tuple(found)


def _edited_values(facts: FileFacts, call: CallFact, position: int) -> list[cst.BaseExpression]:
    """The folder expressions an edit adds: its argument, or, when that is a
    parameter of a file-level wrapper, what each call of the wrapper passes."""
    value = call.value_node(None, position)
    if value is None:
        return []
    function = facts.functions.get(call.scope.function or "")
    if function is None or not isinstance(value, cst.Name):
        return [value]
    parameters = [param.name.value for param in (*function.params.posonly_params, *function.params.params)]
    if value.value not in parameters:
        return [value]
    index, name = parameters.index(value.value), call.scope.function
    passed = []
    for site in facts.calls:
        if isinstance(site.node.func, cst.Name) and site.node.func.value == name:
            argument = site.value_node(value.value, index)
            if argument is not None:
                passed.append(argument)
    return passed


def _path_text(node: cst.BaseExpression, facts: FileFacts, path: Path, depth: int) -> str | None:
    if depth > _MAX_DEPTH:
        return None
    if isinstance(node, cst.Name):
        if node.value == "__file__":
            return str(path)
        assigned = facts.simple_assignments.get(node.value)
        return _path_text(assigned[0], facts, path, depth + 1) if assigned and len(assigned) == 1 else None
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
        value = facts.evaluate(node).value
        return value if isinstance(value, str) else None
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Divide)):
        left, right = _path_text(node.left, facts, path, depth + 1), _path_text(node.right, facts, path, depth + 1)
        if left is None or right is None:
            return None
        return left + right if isinstance(node.operator, cst.Add) else os.path.join(left, right)
    if isinstance(node, cst.Attribute) and node.attr.value == "parent":
        inner = _path_text(node.value, facts, path, depth + 1)
        return os.path.dirname(inner) if inner is not None else None
    if isinstance(node, cst.Call) and not any(arg.keyword or arg.star for arg in node.args):
        function = _PATH_FUNCTIONS.get(facts.names.resolve(node.func) or "")
        receiver: list[cst.BaseExpression] = []
        if function is None and isinstance(node.func, cst.Attribute):
            function = _PATH_METHODS.get(node.func.attr.value)
            receiver = [node.func.value]
        if function is None:
            return None
        parts = [_path_text(part, facts, path, depth + 1) for part in (*receiver, *(arg.value for arg in node.args))]
        if not parts or None in parts:
            return None
        return function(*parts)
    return None


#: Folders that hold no code of the project itself.
_NOT_PROJECT_FOLDERS = frozenset({"__pycache__", "node_modules", "site-packages", "venv", "env", "build", "dist"})
#: Config files that may name a function for a registry or a factory to call.
_CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml", ".cfg", ".ini")
#: A project with more files than this is not read for mentions: the question stays open.
MAX_PROJECT_FILES = 3000


class ModuleLocator:
    """Finds the file of a module a project file imports."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._search_path: tuple[Path, ...] = ()
        self._locations: dict[tuple[Path, tuple[str, ...]], Path | None] = {}
        #: (parts, dots, importer's folder) -> the first two modules found for them under the current search path
        self._found: dict[tuple[tuple[str, ...], int, Path], tuple[tuple[Path, str], ...]] = {}
        self._folders: list[Path] | None = None  # the root's folders that are not packages (source roots)
        self._files: list[Path] | None = None  # the project's Python and config files, listed once
        self._texts: dict[Path, tuple[tuple[int, int], bytes]] = {}

    @property
    def search_path(self) -> tuple[Path, ...]:
        """Folders the current entry script's path edits add, searched after the importer's folder."""
        return self._search_path

    @search_path.setter
    def search_path(self, folders: tuple[Path, ...]) -> None:
        if folders != self._search_path:
            self._search_path = folders
            self._found.clear()

    def candidates(self, parts: tuple[str, ...], dots: int, importer: Path) -> Iterator[tuple[Path, str]]:
        """(module file, attribute path) for each way to split ``parts``; longest module first."""
        key = (parts, dots, importer.parent)
        found = self._found.get(key)
        if found is None:  # asked about 12,000 times per repository: once per question and folder
            found = self._found[key] = tuple(self._search(parts, dots, importer.parent))
        for path, attribute in found:
            if path != importer:  # ``import utils`` in utils.py is another utils
                yield path, attribute
                return

    def _search(self, parts: tuple[str, ...], dots: int, folder: Path) -> Iterator[tuple[Path, str]]:
        """Every (module file, attribute path) ``parts`` may name from a module in ``folder``, in the
        order the import system would try them; the first but one is needed when the first is the importer."""
        if dots:
            base = folder
            for _ in range(dots - 1):
                base = base.parent
            bases = [base]
            shortest = 0  # ``from . import set_seed``: the package's __init__.py
        else:
            bases = list(dict.fromkeys([folder, *self.search_path, self.root, self.root / "src"]))
            shortest = 1
        found = 0
        for split in range(len(parts) - 1, shortest - 1, -1):
            for base in bases:
                path = self.module_file(base, parts[:split])
                if path is not None:
                    yield path, ".".join(parts[split:])
                    found += 1
                    if found == 2:
                        return

    def files_mentioning(self, name: str, excluding: Path) -> list[Path] | None:
        """The project's Python files, other than ``excluding``, whose text has ``name``
        as a word; None when a config file names it too (a registry may call it by
        name) or the project has too many files to read."""
        files = self._project_files()
        if files is None:
            return None
        word = re.compile(rb"\b" + re.escape(name.encode()) + rb"\b")
        found = []
        for path in files:
            if not word.search(self._text(path)):
                continue
            if path.suffix != ".py":
                return None
            if path != excluding:
                found.append(path)
        return found

    def _project_files(self) -> list[Path] | None:
        if self._files is None:
            files: list[Path] = []
            for folder, subfolders, names in os.walk(self.root):
                subfolders[:] = sorted(d for d in subfolders if not d.startswith(".") and d not in _NOT_PROJECT_FOLDERS)
                files += [Path(os.path.abspath(os.path.join(folder, n))) for n in sorted(names) if n.endswith((".py", *_CONFIG_SUFFIXES))]
                if len(files) > MAX_PROJECT_FILES:
                    break
            self._files = files
        return self._files if len(self._files) <= MAX_PROJECT_FILES else None

    def _text(self, path: Path) -> bytes:
        """The file's bytes, read again only when it changed on disk."""
        try:
            stat = path.stat()
            key = (stat.st_mtime_ns, stat.st_size)
            cached = self._texts.get(path)
            if cached is None or cached[0] != key:
                cached = self._texts[path] = (key, path.read_bytes())
            return cached[1]
        except OSError:
            return b""

    def in_source_folders(self, parts: tuple[str, ...]) -> tuple[Path, str] | None:
        """The module in the one source folder (``_source_folders``) that holds it (a
        script that puts ``lib/`` or ``src/lib/`` on ``sys.path`` in a way not read
        here, or a library module checked without that script), else None."""
        found = {candidate for folder in self._source_folders() for candidate in self._candidates_under(folder, parts)}
        return found.pop() if len(found) == 1 else None

    def _source_folders(self) -> list[Path]:
        """The root's folders that are not packages, and theirs (``src/lib`` of a
        repository whose ``src/_init_paths.py`` puts it on the path)."""
        if self._folders is None:
            top = _plain_folders(self.root)
            self._folders = top + [inner for folder in top for inner in _plain_folders(folder)]
        return self._folders

    def _candidates_under(self, base: Path, parts: tuple[str, ...]) -> Iterator[tuple[Path, str]]:
        for split in range(len(parts) - 1, 0, -1):
            path = self.module_file(base, parts[:split])
            if path is not None:
                yield path, ".".join(parts[split:])
                return

    def module_file(self, base: Path, module: tuple[str, ...]) -> Path | None:
        key = (base, module)
        if key not in self._locations:
            stem = base.joinpath(*module)
            found = None
            for candidate in (stem.with_name(stem.name + ".py") if module else None, stem / "__init__.py"):
                if candidate is not None and os.path.isfile(candidate):
                    found = candidate
                    break
            self._locations[key] = found
        return self._locations[key]


def _plain_folders(parent: Path) -> list[Path]:
    """``parent``'s folders that are not packages, hidden or private ones left out."""
    try:
        return sorted(
            entry for entry in parent.iterdir()
            if entry.is_dir() and not entry.name.startswith((".", "_")) and not (entry / "__init__.py").exists()
        )
    except OSError:
        return []
