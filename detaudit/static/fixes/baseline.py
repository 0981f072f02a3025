"""``--add-ignores``: suppress every current finding in place, to adopt detaudit
in an existing codebase and fail CI only on new hazards."""

from __future__ import annotations

import os
import re
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from detaudit.findings import Finding
from detaudit.static.engine.sources import split_lines

_EXISTING = re.compile(r"#\s*detaudit:\s*ignore\[(?P<rules>[^\]]*)\]")


def add_ignores(findings: Sequence[Finding], paths: dict[str, Path]) -> tuple[int, list[str]]:
    """Append ``# detaudit: ignore[CODES]`` to each finding's line (merging with an
    existing list).  Each file is rewritten atomically, and only if the result
    still parses.  Returns (comments added, one-line problems)."""
    import libcst as cst

    by_file: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    problems: list[str] = []
    for finding in findings:
        if finding.cell is not None or not finding.line:
            problems.append(f"{finding.location}: cannot add a suppression comment here ({finding.code})")
            continue
        by_file[finding.path][finding.line].add(finding.code)

    added = 0
    for shown, codes_by_line in by_file.items():
        path = paths[shown]
        with open(path, encoding="utf-8", newline="") as stream:  # newlines as they are: CRLF stays CRLF
            original = stream.read()
        lines = split_lines(original, keepends=True)
        changed = 0
        for number, codes in codes_by_line.items():
            line = lines[number - 1]
            body = line.rstrip("\r\n")
            ending = line[len(body):]
            if body.rstrip().endswith("\\"):
                problems.append(f"{shown}:{number}: line continues with a backslash; add the suppression by hand")
                continue
            existing = _EXISTING.search(body)
            if existing:
                merged = sorted({*(c.strip() for c in existing.group("rules").split(",") if c.strip()), *codes})
                body = body[: existing.start("rules")] + ", ".join(merged) + body[existing.end("rules"):]
            else:
                body = f"{body}  # detaudit: ignore[{', '.join(sorted(codes))}]"
            lines[number - 1] = body + ending
            changed += len(codes)
        updated = "".join(lines)
        try:
            cst.parse_module(updated)
        except cst.ParserSyntaxError:
            problems.append(f"{shown}: adding suppressions would break the file; left unchanged")
            continue
        write_atomically(path, updated)
        added += changed
    return added, problems


def write_atomically(path: Path, text: str) -> None:
    """Temp file in the same directory, then rename: the file is either the old
    one or the new one, never half-written; its permissions are kept."""
    mode = path.stat().st_mode
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as stream:
            stream.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
