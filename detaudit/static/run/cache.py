"""Results cached by file content, so an unchanged tree re-checks almost instantly.

One JSON file per detaudit build under ``.detaudit_cache/`` in the project root.
An entry is valid while the file's content hash, and the hashes of the project
files its result depends on (helpers it imports), are unchanged.  Results hold
the findings of every rule (suppression comments are part of the content, so
they are applied before caching); rule selection is applied after the cache,
so changing ``--select`` never needs a re-parse.

The cache is only ever a shortcut: an entry that is not exactly what this
build writes (hand-edited, truncated, from a buggy build) is recomputed and
overwritten, never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from detaudit import __version__
from detaudit.findings import Finding, Severity
from detaudit.knowledge.layers import layer_table_stamps
from detaudit.static.context import FileResult

CACHE_DIRECTORY = ".detaudit_cache"


def content_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _engine_fingerprint() -> str:
    """Changes whenever detaudit's own code changes (a new rule must re-check files)."""
    package = Path(__file__).resolve().parents[2]
    stamps = [__version__]
    for path in sorted(package.rglob("*.py")) + sorted(package.rglob("*.json")):
        if "static" in path.parts or "knowledge" in path.parts:
            stat = path.stat()
            stamps.append(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
    stamps += layer_table_stamps()  # tables outside the package that findings read
    return content_hash("\n".join(stamps).encode())


class ResultCache:
    def __init__(self, root: Path) -> None:
        self.directory = root / CACHE_DIRECTORY
        self.file = self.directory / f"results-{_engine_fingerprint()}.json"
        self._entries: dict[str, dict] = {}
        self._dirty = False
        try:
            entries = json.loads(self.file.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            entries = {}
        self._entries = entries if isinstance(entries, dict) else {}

    def get(self, path: Path, display_path: str, digest: str) -> FileResult | None:
        """The cached result, or None when there is none, it is stale, or it is malformed."""
        entry = self._entries.get(str(path))
        try:
            if entry["hash"] != digest or entry["result"]["path"] != display_path:
                return None
            dependencies = entry["dependencies"]
            if not isinstance(dependencies, dict):
                return None
            for dependency, dependency_hash in dependencies.items():
                try:
                    if content_hash(Path(dependency).read_bytes()) != dependency_hash:
                        return None
                except OSError:
                    return None
            result = _result_from_json(entry["result"])
        except (KeyError, TypeError, ValueError, AttributeError, _Malformed):
            return None
        result.dependencies = dict(dependencies)
        return result

    def put(self, path: Path, digest: str, result: FileResult) -> None:
        self._entries[str(path)] = {
            "hash": digest,
            "dependencies": result.dependencies,
            "result": _result_to_json(result),
        }
        self._dirty = True

    def save(self) -> None:
        """Write atomically; a cache that cannot be written is silently skipped
        (read-only checkouts must still be checkable)."""
        if not self._dirty:
            return
        try:
            self.directory.mkdir(exist_ok=True)
            (self.directory / ".gitignore").write_text("*\n", encoding="utf-8")
            for stale in self.directory.glob("results-*.json"):
                if stale != self.file:
                    stale.unlink(missing_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                json.dump(self._entries, stream)
            os.replace(temporary, self.file)
        except OSError:
            pass


class _Malformed(Exception):
    """A cache entry that does not have the shape this build writes."""


def _finding_to_json(finding: Finding) -> dict:
    data = finding.to_dict()
    data["suppressed_reason"] = finding.suppressed_reason
    return data


#: Finding field -> the JSON types a valid entry holds for it
_FINDING_FIELDS: dict[str, tuple[type, ...]] = {
    "code": (str,), "name": (str,), "severity": (str,), "message": (str,), "path": (str,),
    "line": (int,), "column": (int,), "end_line": (int,), "end_column": (int,), "fix_hint": (str,),
    "cell": (int, type(None)), "details": (dict,), "suppressed_reason": (str, type(None)),
}
_REQUIRED_FINDING_FIELDS = {"code", "name", "severity", "message", "path"}


def _finding_from_json(data: object) -> Finding:
    if not isinstance(data, dict) or not _REQUIRED_FINDING_FIELDS <= data.keys() <= _FINDING_FIELDS.keys():
        raise _Malformed
    for key, value in data.items():
        if not isinstance(value, _FINDING_FIELDS[key]) or isinstance(value, bool):
            raise _Malformed
    data = dict(data)
    data["severity"] = Severity.parse(data["severity"])  # ValueError for an unknown one
    return Finding(**data)


def _result_to_json(result: FileResult) -> dict:
    return {
        "path": result.path,
        "findings": [_finding_to_json(f) for f in result.findings],
        "suppressed": [_finding_to_json(f) for f in result.suppressed],
        "messages": result.messages,
        "parsed": result.parsed,
    }


def _result_from_json(data: object) -> FileResult:
    if not isinstance(data, dict) or not isinstance(data["path"], str) or not isinstance(data["parsed"], bool):
        raise _Malformed
    lists = [data["findings"], data["suppressed"], data["messages"]]
    if not all(isinstance(value, list) for value in lists) or not all(isinstance(m, str) for m in data["messages"]):
        raise _Malformed
    return FileResult(
        path=data["path"],
        findings=[_finding_from_json(f) for f in data["findings"]],
        suppressed=[_finding_from_json(f) for f in data["suppressed"]],
        messages=list(data["messages"]),
        parsed=data["parsed"],
    )
