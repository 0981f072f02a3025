"""``[tool.detaudit]`` configuration from the nearest ``pyproject.toml``.

Keys: ``select``, ``ignore``, ``per-file-ignores``, ``exclude``, ``fail-on``,
``file-time-budget`` (seconds; see ``engine/limits.py``), ``fix-style`` (what
``--fix`` writes: ``"plain"`` torch/numpy/random code or ``"detaudit"``'s
helpers; see ``fixes/code.py``).
Unknown keys and unknown rule names are warnings (one line each), never errors:
a config written for a newer detaudit must not break an older one.  A
``pyproject.toml`` that cannot be read, is not TOML, or holds a value of the
wrong type is an error naming the file and line: falling back to the defaults
(or to a parent directory's config) would silently check with rules the user
turned off.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from detaudit.findings import Finding, Severity
from detaudit.static.engine.limits import DEFAULT_FILE_TIME_BUDGET
from detaudit.static.fixes.code import DEFAULT_FIX_STYLE, check_style

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

_KNOWN_KEYS = {"select", "ignore", "per-file-ignores", "exclude", "fail-on", "file-time-budget", "fix-style"}
DEFAULT_FAIL_ON = Severity.WARNING


class ConfigError(Exception):
    """A config file that cannot be used at all (not TOML, wrong types): one line,
    ``path:line: what is wrong``."""

@dataclass
class Config:
    select: list[str] = field(default_factory=lambda: ["ALL"])
    ignore: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    exclude: list[str] = field(default_factory=list)
    fail_on: Severity = DEFAULT_FAIL_ON
    file_time_budget: float = DEFAULT_FILE_TIME_BUDGET
    fix_style: str = DEFAULT_FIX_STYLE
    source: Path | None = None  # the pyproject.toml it came from
    warnings: list[str] = field(default_factory=list)

    @property
    def root(self) -> Path | None:
        return self.source.parent if self.source is not None else None


def find_pyproject(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` at or above ``start`` that has ``[tool.detaudit]``."""
    directory = start if os.path.isdir(start) else start.parent
    for candidate in (directory, *directory.parents):
        pyproject = candidate / "pyproject.toml"
        if os.path.isfile(pyproject) and "detaudit" in _PyProject.read(pyproject).tool:
            return pyproject
    return None


def load_config(pyproject: Path | None) -> Config:
    if pyproject is None:
        return Config()
    source = _PyProject.read(pyproject)
    table = source.tool.get("detaudit", {})
    if not isinstance(table, dict):
        raise source.error("detaudit", f"[tool.detaudit] must be a table, not {_kind(table)}")
    config = Config(source=pyproject)
    for key in sorted(set(table) - _KNOWN_KEYS):
        config.warnings.append(f"{pyproject}: unknown [tool.detaudit] key {key!r} ignored")
    config.select = source.string_list(table, "select") or config.select
    config.ignore = source.string_list(table, "ignore")
    config.exclude = source.string_list(table, "exclude")
    per_file = table.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        raise source.error("per-file-ignores", "per-file-ignores must be a table of pattern = [rules]")
    config.per_file_ignores = {str(k): source.string_list(per_file, k, f"per-file-ignores.{k}") for k in per_file}
    if "fail-on" in table:
        try:
            config.fail_on = Severity.parse(str(table["fail-on"]))
        except ValueError as error:
            raise source.error("fail-on", f"fail-on: {error}") from None
    if "file-time-budget" in table:
        try:
            config.file_time_budget = parse_budget(table["file-time-budget"])
        except ValueError as error:
            raise source.error("file-time-budget", f"file-time-budget: {error}") from None
    if "fix-style" in table:
        try:
            config.fix_style = check_style(table["fix-style"])
        except ValueError as error:
            raise source.error("fix-style", f"fix-style: {error}") from None
    return config


def parse_budget(value: object) -> float:
    """A per-file time budget: a positive number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a number of seconds, got {_kind(value)}")
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"expected a number of seconds, got {value!r}") from None
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"must be a positive number of seconds, got {value!r}")
    return seconds


class _PyProject:
    """One parsed ``pyproject.toml`` and its text, to name the line of a bad value."""

    def __init__(self, path: Path, text: str, data: dict) -> None:
        self.path = path
        self.text = text
        self.data = data

    @classmethod
    def read(cls, path: Path) -> "_PyProject":
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise ConfigError(f"{path}: cannot read: {error.strerror or error}") from None
        except UnicodeDecodeError as error:
            raise ConfigError(f"{path}: not valid UTF-8 (byte {error.start})") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            message = " ".join(str(error).split())
            where = re.search(r"\s*\(at (?:line (\d+), column \d+|end of document)\)$", message)
            line = int(where.group(1)) if where and where.group(1) else text.count("\n") + 1
            raise ConfigError(f"{path}:{line}: invalid TOML: {message[: where.start()] if where else message}") from None
        return cls(path, text, data)

    @property
    def tool(self) -> dict:
        tool = self.data.get("tool", {})
        if not isinstance(tool, dict):
            raise self.error("tool", f"[tool] must be a table, not {_kind(tool)}")
        return tool

    def string_list(self, table: dict, key: str, name: str | None = None) -> list[str]:
        value = table.get(key, [])
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, f"{name or key} must be a list of strings")
        return list(value)

    def error(self, key: str, message: str) -> ConfigError:
        """``path:line: message``, the line being where ``key`` is set (when it can be found)."""
        line = self._line_of(key)
        return ConfigError(f"{self.path}:{line}: {message}" if line else f"{self.path}: {message}")

    def _line_of(self, key: str) -> int | None:
        """The line that assigns ``key`` (bare, quoted or dotted) or opens it as a
        table: the first one in or after ``[tool.detaudit]``, else the first one,
        else a key of an inline table in or after ``[tool.detaudit]``."""
        name = re.escape(key)
        assignment = re.compile(rf"""^\s*(?:[\w.-]+\.)?["']?{name}["']?\s*=|^\s*\[\s*(?:[\w.-]+\.)?{name}\s*\]""")
        lines = self.text.splitlines()
        header = next((i for i, line in enumerate(lines) if re.match(r"^\s*\[\s*tool\.detaudit\b", line)), 0)
        for start in (header, 0):
            for number, line in enumerate(lines[start:], start=start + 1):
                if assignment.match(line):
                    return number
        inline = re.compile(rf"""(?:^|[{{,\s])["']?{name}["']?\s*=""")  # a key of an inline table
        return next((number for number, line in enumerate(lines[header:], start=header + 1) if inline.search(line)), None)


def _kind(value: object) -> str:
    kinds = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def path_matches(display_path: str, pattern: str) -> bool:
    """Glob match against the path and each of its parent directories."""
    path = display_path.replace("\\", "/")
    pattern = pattern.rstrip("/")
    if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(Path(path).name, pattern):
        return True
    parts = path.split("/")
    return any(fnmatch.fnmatch("/".join(parts[:i]), pattern) for i in range(1, len(parts)))


def ignored_for_file(config: Config, display_path: str) -> list[str]:
    return [
        selector
        for pattern, selectors in config.per_file_ignores.items()
        if path_matches(display_path, pattern)
        for selector in selectors
    ]


def filter_findings(findings: list[Finding], enabled_codes: set[str], config: Config) -> list[Finding]:
    """Keep findings of enabled rules that no per-file-ignores entry removes."""
    if not findings:
        return []
    from detaudit.static.rule import find_rule, matches_selector

    kept = []
    for finding in findings:
        if finding.code not in enabled_codes:
            continue
        rule = find_rule(finding.code)
        ignores = ignored_for_file(config, finding.path)
        if rule is not None and any(matches_selector(rule, s) for s in ignores):
            continue
        kept.append(finding)
    return kept


class RuleSelection:
    """Which rules a run reports (``select`` minus ``ignore``).

    Resolved on first use: the rule registry imports libcst, which a run whose
    files need no parse (a pre-commit hook on a file without torch) never pays for.
    """

    def __init__(self, select: list[str], ignore: list[str]) -> None:
        self.select = select
        self.ignore = ignore

    @property
    def is_default(self) -> bool:
        return [s.upper() for s in self.select] == ["ALL"] and not self.ignore

    @functools.cached_property
    def rules(self) -> list:
        from detaudit.static.rule import all_rules, matches_selector

        return [
            rule
            for rule in all_rules()
            if any(matches_selector(rule, s) for s in self.select)
            and not any(matches_selector(rule, s) for s in self.ignore)
        ]

    @functools.cached_property
    def codes(self) -> set[str]:
        return {rule.code for rule in self.rules}

    def warnings(self) -> list[str]:
        """One warning per selector that names no rule."""
        from detaudit.static.rule import all_rules, matches_selector

        rules = all_rules()
        return [
            f"unknown rule selector {selector!r} ignored"
            for selector in (*self.select, *self.ignore)
            if not any(matches_selector(rule, selector) for rule in rules)
        ]
