"""Torch version strings and the version ranges the knowledge tables use (``>=2.11,<2.13``).

A leaf module: the ops table and the settings table both write ranges, and
their readers, models and users compare versions against them.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

# One clause of a range; the JSON Schema's ``versionRange`` pattern is these
# clauses joined by commas (tests/test_ops_schema.py keeps the two in step).
VERSION_CLAUSE = re.compile(r"(>=|<=|==|>|<)\s*([0-9]+(?:\.[0-9]+)*)")


@functools.lru_cache(maxsize=1)
def installed_torch_version() -> str | None:
    """The installed torch's version, for ``match_call(torch_version=...)``; None
    without torch.  torch itself is not imported: its ``version.py`` is read where
    the import system would find the package (importing ``importlib.metadata``
    alone costs a static check 20 ms), its package metadata otherwise."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or ():
        try:
            text = (Path(folder) / "version.py").read_text(encoding="utf-8")
        except OSError:
            continue
        found = _VERSION_ASSIGNMENT.search(text)
        if found:
            return found.group(1)
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


_VERSION_ASSIGNMENT = re.compile(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)


def range_problem(spec: str) -> str | None:
    """What is wrong with a range such as ">=2.0,<2.14", or None."""
    for clause in spec.split(","):
        if not VERSION_CLAUSE.fullmatch(clause.strip()):
            return f"{clause.strip()!r} is not a version clause like '>=2.11' or '<2.13'"
    return None


@functools.lru_cache(maxsize=256)
def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+", 1)[0].split(".")[:3]:
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
    return tuple(parts + [0] * (3 - len(parts)))


@functools.lru_cache(maxsize=256)
def _clauses(spec: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    clauses = []
    for clause in spec.split(","):
        operator, bound = VERSION_CLAUSE.fullmatch(clause.strip()).groups()
        clauses.append((operator, _version_tuple(bound)))
    return tuple(clauses)


def has_upper_bound(spec: str | None) -> bool:
    """Whether a range ends before the newest torch (``<2.13``, ``==2.11.0``)."""
    return bool(spec) and any(operator[0] in "<=" for operator, _ in _clauses(spec))


def version_in_range(version: str, spec: str) -> bool:
    """Whether a torch version (``2.13.0+cpu``) lies in ``>=2.11,<2.13``."""
    have = _version_tuple(version)
    for operator, want in _clauses(spec):
        ok = {
            ">=": have >= want,
            "<=": have <= want,
            "==": have == want,
            ">": have > want,
            "<": have < want,
        }[operator]
        if not ok:
            return False
    return True
