"""The table of torch settings that decide reproducibility: its model and loader.

``backend_settings.json`` describes each setting once: how each torch version
spells it (an attribute, a getter/setter pair, an environment variable), its
risky and safe values, when a risky value matters, and why, at what cost and
on what evidence (its *hazard*).  It also lists the attributes of every
``torch.backends`` namespace and the parameters of their ``flags()`` context
managers.  Everything in detaudit that reads, writes, matches or reports such a
setting goes through this table; when torch renames a flag, its entry gains a
spelling for the new versions and nothing else changes.

Readers: the static rules and facts (spellings to match), and
``detaudit.runtime.settings`` (reading and writing them in a live process:
``fingerprint``, ``enable_determinism``, ``status``).  The table is read and
checked once per process; this module never imports torch or numpy.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from detaudit.knowledge.versions import range_problem, version_in_range

SCHEMA_VERSION = 1
SHIPPED_TABLE = Path(__file__).with_name("backend_settings.json")

#: Devices a risky value can matter on (``cpu`` matters in every process).
DEVICES = ("cpu", "cuda")
#: What ``enable_determinism()`` does with a setting: set it to its safe value,
#: set it only where its ``matters`` conditions hold, or leave it alone.
ENABLE_DETERMINISM = ("always", "when-needed", "never")
SOURCE_KINDS = ("docs", "source", "measurement", "issue")


class SettingsTableError(ValueError):
    """The table cannot be read or breaks the schema (one line, with the JSON path)."""


@dataclass(frozen=True)
class Source:
    kind: str
    ref: str


@dataclass(frozen=True)
class Hazard:
    """What goes wrong when a setting has a risky value, shared by its settings.

    ``problem`` is the one line ``detaudit.status()`` prints (``{value}`` is
    replaced by the setting's value); ``fix`` what it proposes (None: call
    ``detaudit.enable_determinism()``).  Hazards whose settings are only
    recorded have no ``problem``.
    """

    id: str
    summary: str
    why: str
    cost: str
    sources: tuple[Source, ...]
    problem: str | None = None
    fix: str | None = None


@dataclass(frozen=True)
class Spelling:
    """One way to reach a setting on the torch versions in ``torch`` (None: all).

    Exactly one kind: an ``attribute`` (dotted path, read and written by
    assignment; ``module`` is the module that owns it, which detaudit may
    import unless ``import_module`` is false); a getter ``read`` and/or a
    setter ``write`` that takes the value as parameter ``argument`` (at
    ``position``, None for keyword-only), where ``values`` maps the argument's
    values to the setting's when they differ; or an ``environment`` variable.
    """

    torch: str | None = None
    attribute: str | None = None
    module: str | None = None
    import_module: bool = True
    read: str | None = None
    write: str | None = None
    argument: str | None = None
    position: int | None = None
    values: tuple[tuple[Any, Any], ...] | None = None
    environment: str | None = None

    @property
    def name(self) -> str:
        """The name users know it by; fingerprint keys use it (``env.NAME`` for variables)."""
        if self.environment is not None:
            return f"env.{self.environment}"
        return self.attribute or self.read or self.write  # type: ignore[return-value]

    @property
    def readable(self) -> bool:
        """Readable in a running torch (an attribute or a getter)."""
        return self.attribute is not None or self.read is not None

    def exists_on(self, torch_version: str | None) -> bool:
        """Whether this torch version has it (unknown version: assume it does)."""
        return self.torch is None or torch_version is None or version_in_range(torch_version, self.torch)


@dataclass(frozen=True)
class Matters:
    """When a risky value is a problem: on a process that can use one of
    ``devices`` (None: any), on torch versions in ``torch``, and while setting
    ``requires`` has its safe value."""

    devices: tuple[str, ...] | None = None
    torch: str | None = None
    requires: str | None = None


@dataclass(frozen=True)
class Setting:
    """One setting.  ``risky`` values are reported; with ``accepted``, every
    other value is (an unset variable included).  ``safe`` is what
    ``enable_determinism()`` sets, ``lenient`` what it sets with
    ``strict=False``.  A ``superseded_by`` setting is the legacy spelling of a
    newer API: where one of those exists, enable_determinism uses that one
    (torch raises when the two APIs are mixed), and the newer ones are read
    first.  ``also_sets``: settings that writing this one changes too."""

    id: str
    hazard: Hazard
    spellings: tuple[Spelling, ...]
    enable_determinism: str
    default: Any = None
    safe: Any = None
    lenient: Any = None
    risky: tuple[Any, ...] = ()
    accepted: tuple[Any, ...] | None = None
    matters: Matters = Matters()
    superseded_by: tuple[str, ...] = ()
    also_sets: tuple[str, ...] = ()
    note: str | None = None

    @property
    def key(self) -> str:
        """Its name in a fingerprint and in status (the first spelling's)."""
        return self.spellings[0].name

    @property
    def attributes(self) -> tuple[str, ...]:
        """Every attribute path that sets it, on any torch version."""
        return tuple(s.attribute for s in self.spellings if s.attribute is not None)

    @property
    def environment_variables(self) -> tuple[str, ...]:
        return tuple(s.environment for s in self.spellings if s.environment is not None)

    @property
    def writers(self) -> tuple[Spelling, ...]:
        """The functions that set it, on any torch version."""
        return tuple(s for s in self.spellings if s.write is not None)

    @property
    def reports(self) -> bool:
        """Whether some value of it is a problem (else it is only recorded)."""
        return bool(self.risky) or self.accepted is not None

    def is_risky(self, value: Any) -> bool:
        if self.accepted is not None:
            return not any(_same_value(value, ok) for ok in self.accepted)
        return any(_same_value(value, bad) for bad in self.risky)


@dataclass(frozen=True)
class Namespace:
    """A ``torch.backends`` namespace: every attribute it has (assigning any
    other is a silent no-op) and the parameter order of its ``flags()``."""

    name: str
    attributes: frozenset[str]
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class BackendSettings:
    torch_versions: str
    hazards: Mapping[str, Hazard]
    settings: tuple[Setting, ...]  # in reading order
    namespaces: Mapping[str, Namespace]

    def __getitem__(self, setting_id: str) -> Setting:
        for setting in self.settings:
            if setting.id == setting_id:
                return setting
        raise KeyError(setting_id)

    def in_hazard(self, hazard_id: str) -> tuple[Setting, ...]:
        return tuple(s for s in self.settings if s.hazard.id == hazard_id)

    def spellings(self) -> Iterable[tuple[Setting, Spelling]]:
        return ((setting, spelling) for setting in self.settings for spelling in setting.spellings)


def _same_value(value: Any, expected: Any) -> bool:
    # True == 1 in Python, but a setting's True is not the number 1
    if isinstance(value, bool) or isinstance(expected, bool):
        return value is expected
    return value == expected


# --- loading ---------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def backend_settings() -> BackendSettings:
    """The shipped table, read and checked once per process."""
    origin = str(SHIPPED_TABLE)
    try:
        document = json.loads(SHIPPED_TABLE.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise SettingsTableError(f"cannot read settings table {origin}: {error}") from None
    except json.JSONDecodeError as error:
        raise SettingsTableError(
            f"settings table {origin} is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}"
        ) from None
    return parse_backend_settings(document, origin)


def parse_backend_settings(document: Any, origin: str = "<table>") -> BackendSettings:
    """Check a decoded document and build the table in one pass."""
    try:
        return _parse_table(_Node(document, "$"))
    except _SchemaError as error:
        raise SettingsTableError(f"bad settings table {origin}: {error}") from None


class _SchemaError(Exception):
    pass


class _Node:
    """A JSON value and its path (``$.settings[3].spellings[0]``), for errors."""

    def __init__(self, value: Any, path: str) -> None:
        self.value = value
        self.path = path

    def fail(self, problem: str):
        raise _SchemaError(f"{self.path}: {problem}")

    def fields(self, required: Iterable[str], optional: Iterable[str] = ()) -> dict[str, "_Node"]:
        if not isinstance(self.value, dict):
            self.fail(f"expected an object, got {type(self.value).__name__}")
        required = tuple(required)
        missing = [key for key in required if key not in self.value]
        if missing:
            self.fail(f"missing {', '.join(repr(k) for k in missing)}")
        unknown = sorted(set(self.value) - set(required) - set(optional))
        if unknown:
            self.fail(f"unknown key {unknown[0]!r}")
        return {key: _Node(value, f"{self.path}.{key}") for key, value in self.value.items()}

    def items(self, allow_empty: bool = False) -> list["_Node"]:
        if not isinstance(self.value, list) or (not self.value and not allow_empty):
            self.fail("expected a list" if allow_empty else "expected a non-empty list")
        return [_Node(value, f"{self.path}[{i}]") for i, value in enumerate(self.value)]

    def entries(self) -> list[tuple[str, "_Node"]]:
        if not isinstance(self.value, dict) or not self.value:
            self.fail("expected a non-empty object")
        return [(key, _Node(value, f"{self.path}.{key}")) for key, value in self.value.items()]

    def text(self) -> str:
        if not isinstance(self.value, str) or not self.value.strip():
            self.fail("expected a non-empty string")
        return self.value

    def choice(self, allowed: tuple[str, ...]) -> str:
        if self.value not in allowed:
            self.fail(f"{self.value!r} is not one of {', '.join(allowed)}")
        return self.value

    def boolean(self) -> bool:
        if not isinstance(self.value, bool):
            self.fail("expected true or false")
        return self.value

    def version_range(self) -> str:
        problem = range_problem(self.text())
        if problem:
            self.fail(problem)
        return self.value

    def scalar(self) -> Any:
        if self.value is not None and not isinstance(self.value, (bool, int, str)):
            self.fail("expected a string, number, boolean or null")
        return self.value


def _optional(fields: Mapping[str, _Node], key: str, read: Callable[[_Node], Any], default: Any = None) -> Any:
    return read(fields[key]) if key in fields else default


def _parse_table(root: _Node) -> BackendSettings:
    top = root.fields(("schema_version", "torch_versions", "provenance", "hazards", "settings", "namespaces"))
    version = top["schema_version"]
    if not isinstance(version.value, int) or isinstance(version.value, bool) or version.value < 1:
        version.fail("expected a positive integer")
    if version.value > SCHEMA_VERSION:
        version.fail(f"{version.value} is newer than this detaudit reads ({SCHEMA_VERSION}); upgrade detaudit")
    top["provenance"].fields(("kind", "date", "description"))
    hazards = {key: _parse_hazard(key, node) for key, node in top["hazards"].entries()}
    settings = [_parse_setting(node, hazards) for node in top["settings"].items()]
    namespaces = {name: _parse_namespace(name, node) for name, node in top["namespaces"].entries()}
    _check_references(top["settings"], settings, namespaces)
    return BackendSettings(top["torch_versions"].version_range(), hazards, tuple(settings), namespaces)


def _parse_sources(node: _Node) -> tuple[Source, ...]:
    sources = []
    for item in node.items():
        fields = item.fields(("kind", "ref"))
        sources.append(Source(fields["kind"].choice(SOURCE_KINDS), fields["ref"].text()))
    return tuple(sources)


def _parse_hazard(hazard_id: str, node: _Node) -> Hazard:
    fields = node.fields(("summary", "why", "cost", "sources"), ("problem", "fix"))
    problem = _optional(fields, "problem", _Node.text)
    if problem is not None and any(brace in problem.replace("{value}", "") for brace in "{}"):
        fields["problem"].fail("the only placeholder a problem may use is {value}")
    return Hazard(
        hazard_id,
        fields["summary"].text(),
        fields["why"].text(),
        fields["cost"].text(),
        _parse_sources(fields["sources"]),
        problem,
        _optional(fields, "fix", _Node.text),
    )


_SPELLING_KINDS = {
    "attribute": ("module", "import"),
    "read": ("write", "argument", "position", "values"),
    "write": ("read", "argument", "position", "values"),
    "environment": (),
}


def _parse_spelling(node: _Node) -> Spelling:
    kinds = [k for k in ("attribute", "read", "write", "environment") if isinstance(node.value, dict) and k in node.value]
    primary = kinds[0] if kinds else None
    if primary is None or (primary in ("attribute", "environment") and len(kinds) > 1):
        node.fail("expected exactly one of 'attribute', 'environment', or 'read'/'write' functions")
    fields = node.fields((primary,), ("torch", *_SPELLING_KINDS[primary]))
    spelling = Spelling(
        torch=_optional(fields, "torch", _Node.version_range),
        attribute=_optional(fields, "attribute", _Node.text),
        module=_optional(fields, "module", _Node.text),
        import_module=_optional(fields, "import", _Node.boolean, True),
        read=_optional(fields, "read", _Node.text),
        write=_optional(fields, "write", _Node.text),
        argument=_optional(fields, "argument", _Node.text),
        position=_optional(fields, "position", _parse_position),
        values=_optional(fields, "values", _parse_value_map),
        environment=_optional(fields, "environment", _Node.text),
    )
    if spelling.write is not None and spelling.argument is None:
        node.fail("a 'write' function needs the 'argument' it takes the value as")
    if spelling.write is None and (spelling.argument is not None or spelling.values is not None):
        node.fail("'argument' and 'values' describe a 'write' function")
    if spelling.attribute is not None and spelling.module is not None and not spelling.attribute.startswith(spelling.module + "."):
        fields["module"].fail(f"{spelling.attribute!r} is not an attribute of module {spelling.module!r}")
    return spelling


def _parse_position(node: _Node) -> int:
    if not isinstance(node.value, int) or isinstance(node.value, bool) or node.value < 0:
        node.fail("expected a parameter position (0, 1, ...)")
    return node.value


def _parse_value_map(node: _Node) -> tuple[tuple[Any, Any], ...]:
    pairs = []
    for item in node.items():
        if not isinstance(item.value, list) or len(item.value) != 2:
            item.fail("expected [argument value, setting value]")
        pairs.append((_Node(item.value[0], f"{item.path}[0]").scalar(), _Node(item.value[1], f"{item.path}[1]").scalar()))
    return tuple(pairs)


def _parse_setting(node: _Node, hazards: Mapping[str, Hazard]) -> Setting:
    fields = node.fields(
        ("id", "hazard", "spellings", "enable_determinism"),
        ("default", "safe", "lenient", "risky", "accepted", "matters", "superseded_by", "also_sets", "note"),
    )
    hazard_id = fields["hazard"].text()
    if hazard_id not in hazards:
        fields["hazard"].fail(f"no hazard {hazard_id!r}")
    if "risky" in fields and "accepted" in fields:
        node.fail("give 'risky' values or 'accepted' ones, not both")
    setting = Setting(
        id=fields["id"].text(),
        hazard=hazards[hazard_id],
        spellings=tuple(_parse_spelling(item) for item in fields["spellings"].items()),
        enable_determinism=fields["enable_determinism"].choice(ENABLE_DETERMINISM),
        default=_optional(fields, "default", _Node.scalar),
        safe=_optional(fields, "safe", _Node.scalar),
        lenient=_optional(fields, "lenient", _Node.scalar),
        risky=tuple(item.scalar() for item in fields["risky"].items()) if "risky" in fields else (),
        accepted=tuple(item.scalar() for item in fields["accepted"].items()) if "accepted" in fields else None,
        matters=_optional(fields, "matters", _parse_matters, Matters()),
        superseded_by=tuple(item.text() for item in fields["superseded_by"].items()) if "superseded_by" in fields else (),
        also_sets=tuple(item.text() for item in fields["also_sets"].items()) if "also_sets" in fields else (),
        note=_optional(fields, "note", _Node.text),
    )
    if not setting.spellings[0].readable and setting.spellings[0].environment is None:
        fields["spellings"].fail("the first spelling names the setting: an attribute, a getter or a variable")
    if setting.enable_determinism != "never" and setting.safe is None:
        node.fail(f"enable_determinism {setting.enable_determinism!r} needs a 'safe' value")
    if setting.reports and setting.hazard.problem is None:
        fields["hazard"].fail(f"hazard {hazard_id!r} has no 'problem' to report a risky value with")
    if setting.safe is not None and setting.is_risky(setting.safe):
        node.fail(f"the safe value {setting.safe!r} is also risky")
    return setting


def _parse_matters(node: _Node) -> Matters:
    fields = node.fields((), ("devices", "torch", "requires"))
    devices = tuple(item.choice(DEVICES) for item in fields["devices"].items()) if "devices" in fields else None
    return Matters(devices, _optional(fields, "torch", _Node.version_range), _optional(fields, "requires", _Node.text))


def _parse_namespace(name: str, node: _Node) -> Namespace:
    fields = node.fields(("attributes",), ("flags", "note"))
    attributes = frozenset(item.text() for item in fields["attributes"].items())
    flags = tuple(item.text() for item in fields["flags"].items()) if "flags" in fields else ()
    for parameter in set(flags) - attributes:
        fields["flags"].fail(f"flags() parameter {parameter!r} is not an attribute of {name}")
    return Namespace(name, attributes, flags)


def _check_references(node: _Node, settings: list[Setting], namespaces: Mapping[str, Namespace]) -> None:
    """Ids unique and resolvable, legacy settings read after their successors,
    attributes of listed namespaces listed there."""
    position = {}
    for index, setting in enumerate(settings):
        where = _Node(None, f"{node.path}[{index}]")
        if setting.id in position:
            where.fail(f"duplicate id {setting.id!r}")
        position[setting.id] = index
    for index, setting in enumerate(settings):
        where = _Node(None, f"{node.path}[{index}]")
        for other in (*setting.superseded_by, *setting.also_sets, *filter(None, [setting.matters.requires])):
            if other not in position:
                where.fail(f"no setting {other!r}")
        for newer in setting.superseded_by:
            if position[newer] > index:
                where.fail(f"{newer!r} must come first: the legacy getter raises once the newer API was used")
        for attribute in setting.attributes:
            namespace, _, name = attribute.rpartition(".")
            known = namespaces.get(namespace)
            if known is not None and name not in known.attributes:
                where.fail(f"{attribute!r}: {name!r} is not listed in namespaces[{namespace!r}]")
