"""A whole ``detaudit check`` run: discovery, cache, parallel checking, filtering.

Problems that are not findings are kept apart by what they mean for the run:
``messages`` are notes, ``warnings`` say what was skipped (a directory that
cannot be read), ``errors`` make the run exit 2 after reporting everything
else (a path that does not exist, an internal error while checking a file).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from detaudit.findings import Finding
from detaudit.static.context import FileResult
from detaudit.static.engine.check import check_file
from detaudit.static.run.cache import ResultCache, content_hash
from detaudit.static.run.config import Config, RuleSelection, filter_findings
from detaudit.static.run.discovery import ProjectRoot, discover, display_path, find_project_root, project_root_of

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
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: the project roots the files' project modules were resolved from
    roots: list[ProjectRoot] = field(default_factory=list)

    @property
    def files_checked(self) -> int:
        return len(self.results)


def run_check(
    paths: list[Path], config: Config, selection: RuleSelection, *, use_cache: bool = True, jobs: int | None = None
) -> CheckRun:
    started = time.perf_counter()
    root = config.root or Path.cwd()
    errors = [f"no such file or directory: {path}" for path in paths if not os.path.exists(path)]
    warnings: list[str] = []
    existing = [path for path in paths if os.path.exists(path)]
    files = list(dict.fromkeys(discover(existing, config.exclude, root, warnings)))
    cache = ResultCache(project_root_of(files[0] if files else root)) if use_cache else None

    results: dict[Path, FileResult] = {}
    pending: list[tuple[Path, str, Path, float]] = []  # file, display path, project root, time budget
    content_hash_of: dict[Path, str] = {}
    roots: dict[Path, ProjectRoot] = {}
    for path in files:
        shown = display_path(path)
        project_root = find_project_root(path)
        roots.setdefault(project_root.path, project_root)
        try:
            data = path.read_bytes()
        except OSError:
            results[path] = check_file(path, shown, path.parent, budget=config.file_time_budget)  # reports the read error
            continue
        digest = content_hash_of[path] = content_hash(data)
        cached = cache.get(path.resolve(), shown, digest) if cache is not None else None
        if cached is not None:
            results[path] = cached
        else:
            pending.append((path, shown, project_root.path, config.file_time_budget))

    for (path, *_), result in zip(pending, _check_all(pending, jobs)):
        results[path] = result
        # a result with a gap (internal error, over a limit) is checked again next time
        if cache is not None and result.complete and not result.internal_errors:
            cache.put(path.resolve(), content_hash_of[path], result)
    if cache is not None:
        cache.save()

    ordered = [results[path] for path in files]
    reported = [f for r in ordered for f in r.findings]
    suppressed = [f for r in ordered for f in r.suppressed]
    if reported or suppressed:  # resolving the selection imports the rules (and libcst)
        reported = filter_findings(reported, selection.codes, config)
        suppressed = filter_findings(suppressed, selection.codes, config)
    messages = [m for r in ordered for m in r.messages]
    errors += [e for r in ordered for e in r.internal_errors]
    return CheckRun(
        results=ordered,
        findings=sorted(reported, key=Finding.sort_key),
        suppressed=sorted(suppressed, key=Finding.sort_key),
        messages=messages,
        elapsed=time.perf_counter() - started,
        paths={display_path(path): path for path in files},
        warnings=warnings,
        errors=errors,
        roots=list(roots.values()),
    )


def _check_one(job: tuple[Path, str, Path, float]) -> FileResult:
    path, shown, project_root, budget = job
    return check_file(path, shown, project_root, budget=budget)


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
