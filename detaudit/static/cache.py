"""Results cached by file content, so an unchanged tree re-checks almost instantly.

One JSON file per detaudit build under ``.detaudit_cache/`` in the project root.
An entry is valid while the file's content hash, and the hashes of the project
files its result depends on (helpers it imports), are unchanged.  Results hold
the findings of every rule (suppression comments are part of the content, so
they are applied before caching); rule selection is applied after the cache,
so changing ``--select`` never needs a re-parse.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from detaudit import __version__
from detaudit.findings import Finding, Severity
from detaudit.static.engine import FileResult

CACHE_DIRECTORY = ".detaudit_cache"


def content_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _engine_fingerprint() -> str:
    """Changes whenever detaudit's own code changes (a new rule must re-check files)."""
    package = Path(__file__).resolve().parent.parent
    stamps = [__version__]
    for path in sorted(package.rglob("*.py")) + sorted(package.rglob("*.json")):
        if "static" in path.parts or "knowledge" in path.parts:
            stat = path.stat()
            stamps.append(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return content_hash("\n".join(stamps).encode())


class ResultCache:
    def __init__(self, root: Path) -> None:
        self.directory = root / CACHE_DIRECTORY
        self.file = self.directory / f"results-{_engine_fingerprint()}.json"
        self._entries: dict[str, dict] = {}
        self._dirty = False
        try:
            self._entries = json.loads(self.file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self._entries = {}

    def get(self, path: Path, display_path: str, digest: str) -> FileResult | None:
        entry = self._entries.get(str(path))
        if entry is None or entry["hash"] != digest or entry["result"]["path"] != display_path:
            return None
        for dependency, dependency_hash in entry["dependencies"].items():
            try:
                if content_hash(Path(dependency).read_bytes()) != dependency_hash:
                    return None
            except OSError:
                return None
        return _result_from_json(entry["result"])

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


def _finding_to_json(finding: Finding) -> dict:
    data = finding.to_dict()
    data["suppressed_reason"] = finding.suppressed_reason
    return data


def _finding_from_json(data: dict) -> Finding:
    data = dict(data)
    data["severity"] = Severity.parse(data["severity"])
    return Finding(**data)


def _result_to_json(result: FileResult) -> dict:
    return {
        "path": result.path,
        "findings": [_finding_to_json(f) for f in result.findings],
        "suppressed": [_finding_to_json(f) for f in result.suppressed],
        "messages": result.messages,
        "parsed": result.parsed,
    }


def _result_from_json(data: dict) -> FileResult:
    return FileResult(
        path=data["path"],
        findings=[_finding_from_json(f) for f in data["findings"]],
        suppressed=[_finding_from_json(f) for f in data["suppressed"]],
        messages=list(data["messages"]),
        parsed=data["parsed"],
    )
