"""A whole ``detaudit check`` run: discovery, cache, parallel checking, filtering."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from detaudit.findings import Finding
from detaudit.static.cache import ResultCache, content_hash
from detaudit.static.config import Config, RuleSelection, filter_findings
from detaudit.static.discovery import discover, display_path, project_root_of
from detaudit.static.engine import FileResult, check_file

#: Below this many files to parse, a process pool costs more than it saves.
MIN_FILES_FOR_POOL = 16


@dataclass
class CheckRun:
    results: list[FileResult]
    findings: list[Finding]  # selected, not suppressed, sorted
    suppressed: list[Finding]
    messages: list[str]
    elapsed: float
    paths: dict[str, Path] = field(default_factory=dict)  # display path -> file

    @property
    def files_checked(self) -> int:
        return len(self.results)


def run_check(
    paths: list[Path], config: Config, selection: RuleSelection, *, use_cache: bool = True, jobs: int | None = None
) -> CheckRun:
    started = time.perf_counter()
    root = config.root or Path.cwd()
    files = list(dict.fromkeys(discover(paths, config.exclude, root)))
    cache = ResultCache(project_root_of(files[0] if files else root)) if use_cache else None

    results: dict[Path, FileResult] = {}
    pending: list[tuple[Path, str, Path, str]] = []  # file, display path, project root, content hash
    for path in files:
        shown = display_path(path)
        try:
            data = path.read_bytes()
        except OSError:
            results[path] = check_file(path, shown, path.parent)  # reports the read error
            continue
        digest = content_hash(data)
        cached = cache.get(path.resolve(), shown, digest) if cache is not None else None
        if cached is not None:
            results[path] = cached
        else:
            pending.append((path, shown, project_root_of(path), digest))

    for (path, _, _, digest), result in zip(pending, _check_all(pending, jobs)):
        results[path] = result
        if cache is not None:
            cache.put(path.resolve(), digest, result)
    if cache is not None:
        cache.save()

    ordered = [results[path] for path in files]
    reported = [f for r in ordered for f in r.findings]
    suppressed = [f for r in ordered for f in r.suppressed]
    if reported or suppressed:  # resolving the selection imports the rules (and libcst)
        reported = filter_findings(reported, selection.codes, config)
        suppressed = filter_findings(suppressed, selection.codes, config)
    messages = [m for r in ordered for m in r.messages]
    return CheckRun(
        results=ordered,
        findings=sorted(reported, key=Finding.sort_key),
        suppressed=sorted(suppressed, key=Finding.sort_key),
        messages=messages,
        elapsed=time.perf_counter() - started,
        paths={display_path(path): path for path in files},
    )


def _check_one(job: tuple[Path, str, Path, str]) -> FileResult:
    path, shown, project_root, _ = job
    return check_file(path, shown, project_root)


def _check_all(pending: list, jobs: int | None) -> list[FileResult]:
    workers = jobs or os.cpu_count() or 1
    if workers <= 1 or len(pending) < MIN_FILES_FOR_POOL:
        return [_check_one(job) for job in pending]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # fork shares the already-imported libcst with the workers (no re-import cost)
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else None)
    import libcst  # noqa: F401  (imported before forking, on purpose)

    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        return list(pool.map(_check_one, pending, chunksize=max(1, len(pending) // (workers * 8))))
