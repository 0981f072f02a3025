"""``[tool.detaudit]`` configuration from the nearest ``pyproject.toml``.

Keys: ``select``, ``ignore``, ``per-file-ignores``, ``exclude``, ``fail-on``.
Unknown keys and unknown rule names are warnings (one line each), never errors:
a config written for a newer detaudit must not break an older one.
"""

from __future__ import annotations

import fnmatch
import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path

from detaudit.findings import Finding, Severity

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

_KNOWN_KEYS = {"select", "ignore", "per-file-ignores", "exclude", "fail-on"}
DEFAULT_FAIL_ON = Severity.WARNING


class ConfigError(Exception):
    """A config file that cannot be used at all (not TOML, wrong types)."""


@dataclass
class Config:
    select: list[str] = field(default_factory=lambda: ["ALL"])
    ignore: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    exclude: list[str] = field(default_factory=list)
    fail_on: Severity = DEFAULT_FAIL_ON
    source: Path | None = None  # the pyproject.toml it came from
    warnings: list[str] = field(default_factory=list)

    @property
    def root(self) -> Path | None:
        return self.source.parent if self.source is not None else None


def find_pyproject(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` at or above ``start`` that has ``[tool.detaudit]``."""
    directory = start if start.is_dir() else start.parent
    for candidate in (directory, *directory.parents):
        pyproject = candidate / "pyproject.toml"
        if pyproject.is_file():
            try:
                data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                continue
            if "detaudit" in data.get("tool", {}):
                return pyproject
    return None


def load_config(pyproject: Path | None) -> Config:
    if pyproject is None:
        return Config()
    try:
        table = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["detaudit"]
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{pyproject}: {error}") from None
    config = Config(source=pyproject)
    for key in sorted(set(table) - _KNOWN_KEYS):
        config.warnings.append(f"{pyproject}: unknown [tool.detaudit] key {key!r} ignored")
    config.select = _string_list(table, "select", pyproject) or config.select
    config.ignore = _string_list(table, "ignore", pyproject)
    config.exclude = _string_list(table, "exclude", pyproject)
    per_file = table.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        raise ConfigError(f"{pyproject}: per-file-ignores must be a table of pattern = [rules]")
    config.per_file_ignores = {str(k): _as_list(v, f"per-file-ignores.{k}", pyproject) for k, v in per_file.items()}
    if "fail-on" in table:
        try:
            config.fail_on = Severity.parse(str(table["fail-on"]))
        except ValueError as error:
            raise ConfigError(f"{pyproject}: fail-on: {error}") from None
    return config


def _string_list(table: dict, key: str, source: Path) -> list[str]:
    return _as_list(table.get(key, []), key, source)


def _as_list(value: object, key: str, source: Path) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: {key} must be a list of strings")
    return list(value)


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
