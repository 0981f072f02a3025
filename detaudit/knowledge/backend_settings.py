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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from detaudit.knowledge._json_reader import Node, TableFormat
from detaudit.knowledge.versions import version_in_range

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


_FORMAT = TableFormat("settings table", SettingsTableError, root="$")


@functools.lru_cache(maxsize=1)
def backend_settings() -> BackendSettings:
    """The shipped table, read and checked once per process."""
    return parse_backend_settings(_FORMAT.load(SHIPPED_TABLE), str(SHIPPED_TABLE))


def parse_backend_settings(document: Any, origin: str = "<table>") -> BackendSettings:
    """Check a decoded document and build the table in one pass."""
    return _FORMAT.parse(document, origin, _parse_table)


def _parse_table(root: Node) -> BackendSettings:
    top = root.fields(("schema_version", "torch_versions", "provenance", "hazards", "settings", "namespaces"))
    top["schema_version"].schema_version(SCHEMA_VERSION)
    top["provenance"].fields(("kind", "date", "description"))
    hazards = {key: _parse_hazard(key, node) for key, node in top["hazards"].entries()}
    items = top["settings"].items()
    settings = [_parse_setting(node, hazards) for node in items]
    namespaces = {name: _parse_namespace(name, node) for name, node in top["namespaces"].entries()}
    _check_references(items, settings, namespaces)
    return BackendSettings(top["torch_versions"].version_range(), hazards, tuple(settings), namespaces)


def _parse_sources(node: Node) -> tuple[Source, ...]:
    sources = []
    for item in node.items():
        item.fields(("kind", "ref"))
        sources.append(Source(item["kind"].choice(SOURCE_KINDS), item["ref"].text()))
    return tuple(sources)


def _parse_hazard(hazard_id: str, node: Node) -> Hazard:
    node.fields(("summary", "why", "cost", "sources"), ("problem", "fix"))
    problem = node.optional("problem", Node.text)
    if problem is not None and any(brace in problem.replace("{value}", "") for brace in "{}"):
        node["problem"].fail("the only placeholder a problem may use is {value}")
    return Hazard(
        hazard_id,
        node["summary"].text(),
        node["why"].text(),
        node["cost"].text(),
        _parse_sources(node["sources"]),
        problem,
        node.optional("fix", Node.text),
    )


_SPELLING_KINDS = {
    "attribute": ("module", "import"),
    "read": ("write", "argument", "position", "values"),
    "write": ("read", "argument", "position", "values"),
    "environment": (),
}


def _parse_spelling(node: Node) -> Spelling:
    kinds = [k for k in ("attribute", "read", "write", "environment") if isinstance(node.value, dict) and k in node.value]
    primary = kinds[0] if kinds else None
    if primary is None or (primary in ("attribute", "environment") and len(kinds) > 1):
        node.fail("expected exactly one of 'attribute', 'environment', or 'read'/'write' functions")
    node.fields((primary,), ("torch", *_SPELLING_KINDS[primary]))
    spelling = Spelling(
        torch=node.optional("torch", Node.version_range),
        attribute=node.optional("attribute", Node.text),
        module=node.optional("module", Node.text),
        import_module=node.optional("import", Node.boolean, True),
        read=node.optional("read", Node.text),
        write=node.optional("write", Node.text),
        argument=node.optional("argument", Node.text),
        position=node.optional("position", _parse_position),
        values=node.optional("values", _parse_value_map),
        environment=node.optional("environment", Node.text),
    )
    if spelling.write is not None and spelling.argument is None:
        node.fail("a 'write' function needs the 'argument' it takes the value as")
    if spelling.write is None and (spelling.argument is not None or spelling.values is not None):
        node.fail("'argument' and 'values' describe a 'write' function")
    if spelling.attribute is not None and spelling.module is not None and not spelling.attribute.startswith(spelling.module + "."):
        node["module"].fail(f"{spelling.attribute!r} is not an attribute of module {spelling.module!r}")
    return spelling


def _parse_position(node: Node) -> int:
    if not isinstance(node.value, int) or isinstance(node.value, bool) or node.value < 0:
        node.fail("expected a parameter position (0, 1, ...)")
    return node.value


def _parse_value_map(node: Node) -> tuple[tuple[Any, Any], ...]:
    pairs = []
    for item in node.items():
        if not isinstance(item.value, list) or len(item.value) != 2:
            item.fail("expected [argument value, setting value]")
        pairs.append((item[0].scalar(), item[1].scalar()))
    return tuple(pairs)


def _parse_setting(node: Node, hazards: Mapping[str, Hazard]) -> Setting:
    node.fields(
        ("id", "hazard", "spellings", "enable_determinism"),
        ("default", "safe", "lenient", "risky", "accepted", "matters", "superseded_by", "also_sets", "note"),
    )
    hazard_id = node["hazard"].text()
    if hazard_id not in hazards:
        node["hazard"].fail(f"no hazard {hazard_id!r}")
    if "risky" in node and "accepted" in node:
        node.fail("give 'risky' values or 'accepted' ones, not both")
    setting = Setting(
        id=node["id"].text(),
        hazard=hazards[hazard_id],
        spellings=tuple(_parse_spelling(item) for item in node["spellings"].items()),
        enable_determinism=node["enable_determinism"].choice(ENABLE_DETERMINISM),
        default=node.optional("default", Node.scalar),
        safe=node.optional("safe", Node.scalar),
        lenient=node.optional("lenient", Node.scalar),
        risky=node.optional("risky", _scalars, ()),
        accepted=node.optional("accepted", _scalars),
        matters=node.optional("matters", _parse_matters, Matters()),
        superseded_by=node.optional("superseded_by", Node.texts, ()),
        also_sets=node.optional("also_sets", Node.texts, ()),
        note=node.optional("note", Node.text),
    )
    if not setting.spellings[0].readable and setting.spellings[0].environment is None:
        node["spellings"].fail("the first spelling names the setting: an attribute, a getter or a variable")
    if setting.enable_determinism != "never" and setting.safe is None:
        node.fail(f"enable_determinism {setting.enable_determinism!r} needs a 'safe' value")
    if setting.reports and setting.hazard.problem is None:
        node["hazard"].fail(f"hazard {hazard_id!r} has no 'problem' to report a risky value with")
    if setting.safe is not None and setting.is_risky(setting.safe):
        node.fail(f"the safe value {setting.safe!r} is also risky")
    return setting


def _scalars(node: Node) -> tuple[Any, ...]:
    return tuple(item.scalar() for item in node.items())


def _parse_matters(node: Node) -> Matters:
    node.fields((), ("devices", "torch", "requires"))
    return Matters(
        node.optional("devices", lambda devices: devices.choices(DEVICES)),
        node.optional("torch", Node.version_range),
        node.optional("requires", Node.text),
    )


def _parse_namespace(name: str, node: Node) -> Namespace:
    node.fields(("attributes",), ("flags", "note"))
    attributes = frozenset(node["attributes"].texts())
    flags = node.optional("flags", Node.texts, ())
    for parameter in set(flags) - attributes:
        node["flags"].fail(f"flags() parameter {parameter!r} is not an attribute of {name}")
    return Namespace(name, attributes, flags)


def _check_references(items: list[Node], settings: list[Setting], namespaces: Mapping[str, Namespace]) -> None:
    """Ids unique and resolvable, legacy settings read after their successors,
    attributes of listed namespaces listed there (``items``: the settings' nodes)."""
    position = {}
    for index, setting in enumerate(settings):
        if setting.id in position:
            items[index].fail(f"duplicate id {setting.id!r}")
        position[setting.id] = index
    for index, setting in enumerate(settings):
        where = items[index]
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
