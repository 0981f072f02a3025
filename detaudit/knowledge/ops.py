"""The knowledge base of nondeterministic PyTorch ops: loading, validation, queries.

The facts live in ``nondeterministic_ops.json`` (or a table written by
``detaudit calibrate``); this module only reads them.  Three users:

* the static rule ``nondeterministic-op`` asks :meth:`OpsTable.match_call`
  whether a call site reaches a listed op, with the literal arguments it saw;
* the dynamic pass asks :meth:`OpsTable.lookup_aten` (or ``lookup_alert``) for
  the entry behind a root-cause aten op, and prints :meth:`OpEntry.hint`;
* ``detaudit ops`` / ``detaudit calibrate`` print and rebuild the table.

Which table is read: an explicit path, else ``$DETAUDIT_OPS_TABLE``, else the
shipped one.  This module is imported by the static linter, so it must never
import torch or numpy.
"""

from __future__ import annotations

import ast
import copy
import functools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

SCHEMA_VERSION = 1
TABLE_ENV_VAR = "DETAUDIT_OPS_TABLE"
SHIPPED_TABLE = Path(__file__).with_name("nondeterministic_ops.json")

DEVICES = ("cpu", "cuda")
PHASES = ("forward", "backward")
SOURCE_KINDS = ("docs", "alert", "measurement", "source", "issue")

# What torch.use_deterministic_algorithms(True) does to an op, worded for hints;
# ``{where}`` becomes " on CUDA" when the answer differs between devices.
DETERMINISTIC_MODES = {
    "raises": "raises{where}: no deterministic implementation",
    "switches": "switches to a deterministic kernel{where}",
    "nothing": "does not help{where}: no alert, the race stays",
}

# The text torch puts after the caller name in a nondeterminism alert.
_ALERT_MARKER = " does not have a deterministic implementation"


class OpsTableError(ValueError):
    """A table that cannot be read or does not follow the schema (one line)."""


class _Unknown:
    """A call argument the linter could not evaluate to a literal."""

    def __repr__(self) -> str:
        return "UNKNOWN"


class _Missing:
    """An argument neither passed nor defaulted."""

    def __repr__(self) -> str:
        return "MISSING"


UNKNOWN: Any = _Unknown()
_MISSING: Any = _Missing()


@dataclass(frozen=True)
class CallArguments:
    """The arguments of one call site as the linter saw them.

    Values are Python literals (str, int, float, bool, None, tuples) or
    :data:`UNKNOWN` for anything else.  ``positional`` holds the arguments
    before any ``*args``; ``unpacked`` says the call had ``*args`` or
    ``**kwargs``, so an argument not seen may still have been passed.
    """

    positional: tuple[Any, ...] = ()
    keywords: Mapping[str, Any] = field(default_factory=dict)
    unpacked: bool = False


@dataclass(frozen=True)
class Param:
    name: str
    position: int | None  # None for keyword-only parameters
    default: Any = _MISSING


def _same_literal(value: Any, expected: Any) -> bool:
    # True == 1 in Python, but accumulate=1 is not what a table entry means by True
    if isinstance(value, bool) or isinstance(expected, bool):
        return value is expected
    return value == expected and type(value) in (type(expected), int, float)


@dataclass(frozen=True)
class Condition:
    """An argument condition of an entry: ``test`` is one of
    ``equals``/``in`` (compare a literal; an unknown value is undecided),
    ``passed`` (given and not literally None) and ``not_number`` (given and
    not a numeric literal); for the last two an unknown expression counts as
    satisfied, since passing a variable there is what the hazard needs."""

    arg: str
    test: str
    expected: Any = None

    def evaluate(self, value: Any) -> bool | None:
        """True, False, or None when the value is unknown and it matters."""
        if value is _MISSING:
            return False
        if self.test in ("equals", "in"):
            if value is UNKNOWN:
                return None
            choices = self.expected if self.test == "in" else (self.expected,)
            return any(_same_literal(value, choice) for choice in choices)
        if value is UNKNOWN:
            return True
        if self.test == "passed":
            return value is not None
        return isinstance(value, bool) or not isinstance(value, (int, float, complex))

    def describe(self) -> str:
        if self.test == "equals":
            return f"{self.arg}={self.expected!r}"
        if self.test == "in":
            return f"{self.arg} in {{{', '.join(repr(v) for v in self.expected)}}}"
        if self.test == "passed":
            return f"{self.arg}=..."
        return f"tensor {self.arg}"


@dataclass(frozen=True, repr=False)
class Spelling:
    """One Python spelling that reaches an op: a function or ``nn`` module
    class by qualified name, or a Tensor method by attribute name."""

    kind: str  # "function" | "module" | "method"
    name: str
    params: tuple[Param, ...]
    shared_name: bool = False  # the method name is common on numpy/pandas objects too
    when: tuple[Condition, ...] | None = None  # overrides the entry's conditions

    def __repr__(self) -> str:
        return f"Spelling({self.kind}={self.name!r})"

    @property
    def display(self) -> str:
        return f".{self.name}()" if self.kind == "method" else self.name

    def argument(self, name: str, arguments: CallArguments, offset: int = 0) -> Any:
        """The value bound to parameter ``name``; ``offset`` skips an explicit
        ``self`` (``torch.Tensor.index_add_(t, ...)``)."""
        if name in arguments.keywords:
            return arguments.keywords[name]
        param = next(p for p in self.params if p.name == name)
        if param.position is not None and param.position + offset < len(arguments.positional):
            return arguments.positional[param.position + offset]
        if arguments.unpacked:
            return UNKNOWN
        return param.default


@dataclass(frozen=True)
class Behaviour:
    devices: tuple[str, ...]
    phases: tuple[str, ...]
    mechanism: str
    deterministic_mode: str  # a key of DETERMINISTIC_MODES
    torch: str | None = None  # version range, e.g. ">=2.11,<2.13"; None: the whole table range

    def applies(self, device: str | None = None, torch_version: str | None = None) -> bool:
        if device is not None and device not in self.devices:
            return False
        return torch_version is None or self.torch is None or version_in_range(torch_version, self.torch)


def _devices_text(devices: Iterable[str]) -> str:
    names = [{"cpu": "CPU", "cuda": "CUDA"}[d] for d in DEVICES if d in set(devices)]
    return " and ".join(names)


def devices_of(behaviours) -> tuple[str, ...]:
    """The devices any of ``behaviours`` applies to, in canonical order."""
    return tuple(d for d in DEVICES if any(d in b.devices for b in behaviours))


def phases_of(behaviours) -> tuple[str, ...]:
    """The phases (forward/backward) any of ``behaviours`` applies to, in canonical order."""
    return tuple(p for p in PHASES if any(p in b.phases for b in behaviours))


@dataclass(frozen=True, repr=False)
class OpEntry:
    id: str
    summary: str
    spellings: tuple[Spelling, ...]
    when: tuple[Condition, ...]
    static: str | None  # why a call site alone cannot decide it, when it cannot
    aten: tuple[str, ...]
    alerts: tuple[str, ...]
    behaviours: tuple[Behaviour, ...]
    sources: tuple[Mapping[str, str], ...]
    recipe: str | None
    note: str | None

    def __repr__(self) -> str:
        return f"OpEntry({self.id!r})"

    def behaviours_for(self, device: str | None = None, torch_version: str | None = None) -> tuple[Behaviour, ...]:
        return tuple(b for b in self.behaviours if b.applies(device, torch_version))

    @property
    def devices(self) -> tuple[str, ...]:
        return devices_of(self.behaviours)

    @property
    def phases(self) -> tuple[str, ...]:
        return phases_of(self.behaviours)

    def hint(self, device: str | None = None, torch_version: str | None = None) -> str:
        """One line: what is nondeterministic, where, and what deterministic
        mode does about it, e.g. "atomicAdd on CUDA (forward);
        torch.use_deterministic_algorithms(True) switches to a deterministic kernel"."""
        behaviours = self.behaviours_for(device, torch_version)
        if not behaviours:
            where = f" on {_devices_text([device])}" if device else ""
            return f"{self.summary}: no known nondeterminism{where} for this torch version"
        hazards = []
        for b in behaviours:
            text = f"{b.mechanism} on {_devices_text(b.devices)} ({', '.join(b.phases)})"
            if text not in hazards:
                hazards.append(text)
        modes = []
        several = len({b.deterministic_mode for b in behaviours}) > 1
        for b in behaviours:
            where = f" on {_devices_text(b.devices)}" if several else ""
            if several and b.torch and torch_version is None:
                where += f" with torch {b.torch}"
            text = DETERMINISTIC_MODES[b.deterministic_mode].format(where=where)
            if text not in modes:
                modes.append(text)
        return f"{'; '.join(hazards)}; torch.use_deterministic_algorithms(True) {', and '.join(modes)}"


@dataclass(frozen=True)
class OpMatch:
    """A call site that reaches a table entry.

    ``certain`` is False when the hit depends on something the call site does
    not show (``reasons`` says what: a non-literal mode, the tensor's dtype, a
    receiver that may not be a tensor).  A rule that must not cry wolf reports
    only certain matches.
    """

    entry: OpEntry
    spelling: Spelling
    certain: bool
    reasons: tuple[str, ...]
    behaviours: tuple[Behaviour, ...]

    @property
    def devices(self) -> tuple[str, ...]:
        return devices_of(self.behaviours)

    @property
    def phases(self) -> tuple[str, ...]:
        return phases_of(self.behaviours)

    @property
    def cuda_only(self) -> bool:
        return self.devices == ("cuda",)

    @property
    def deterministic_modes(self) -> frozenset[str]:
        return frozenset(b.deterministic_mode for b in self.behaviours)

    @property
    def raising_devices(self) -> tuple[str, ...]:
        """Devices where deterministic mode raises for this op."""
        return tuple(
            d for d in DEVICES if any(d in b.devices and b.deterministic_mode == "raises" for b in self.behaviours)
        )

    @property
    def raises_under_deterministic_mode(self) -> bool:
        return bool(self.raising_devices)

    @property
    def fixed_by_deterministic_mode(self) -> bool:
        """Deterministic mode switches every listed kernel: nothing to report
        in a file that enables it."""
        return self.deterministic_modes == {"switches"}

    def hint(self) -> str:
        return self.entry.hint()


class OpsTable:
    """A validated table; build it with :func:`load_ops_table`."""

    def __init__(self, document: Mapping[str, Any], origin: str):
        self.origin = origin
        self.document = document
        self.schema_version: int = document["schema_version"]
        self.torch_versions: str = document["torch_versions"]
        self.provenance: Mapping[str, Any] = document["provenance"]
        self.entries: tuple[OpEntry, ...] = tuple(_parse_entry(raw) for raw in document["ops"])
        self._by_id = {entry.id: entry for entry in self.entries}
        self._callables: dict[str, list[tuple[OpEntry, Spelling]]] = {}
        self._methods: dict[str, list[tuple[OpEntry, Spelling]]] = {}
        self._by_aten: dict[str, list[OpEntry]] = {}
        self._by_alert: dict[str, OpEntry] = {}
        for entry in self.entries:
            for spelling in entry.spellings:
                index = self._methods if spelling.kind == "method" else self._callables
                index.setdefault(spelling.name, []).append((entry, spelling))
            for aten_name in entry.aten:
                bucket = self._by_aten.setdefault(_aten_base(aten_name), [])
                if entry not in bucket:
                    bucket.append(entry)
            for caller in entry.alerts:
                self._by_alert.setdefault(caller, entry)

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def entry(self, entry_id: str) -> OpEntry | None:
        return self._by_id.get(entry_id)

    def to_document(self) -> dict[str, Any]:
        """A deep copy of the JSON document, for printing or rewriting."""
        return copy.deepcopy(dict(self.document))

    def entries_for_aten(self, name: str) -> list[OpEntry]:
        """Entries dispatching to aten op ``name``, exact overloads first."""
        candidates = self._by_aten.get(_aten_base(name), [])
        exact = _aten_spelling(name)
        return sorted(candidates, key=lambda e: exact not in {_aten_spelling(a) for a in e.aten})

    def lookup_aten(self, name: str, device: str | None = None) -> OpEntry | None:
        """The entry for an aten op, given as an overload (``aten.index_put_.default``),
        a packet (``aten.index_put``), ``aten::index_put_`` or a bare name; with
        ``device``, only entries nondeterministic on that device."""
        for entry in self.entries_for_aten(name):
            if device is None or device in entry.devices:
                return entry
        return None

    def lookup_alert(self, caller: str) -> OpEntry | None:
        """The entry whose kernel raises with this caller name (see :func:`alert_caller`)."""
        return self._by_alert.get(caller.strip())

    def match_call(
        self,
        qualified_name: str | None,
        method_name: str | None,
        arguments: CallArguments | None = None,
        *,
        torch_version: str | None = None,
    ) -> list[OpMatch]:
        """Entries a call site reaches.

        ``qualified_name`` is the resolved dotted callee when known
        (``torch.nn.functional.interpolate``, ``torch.nn.EmbeddingBag``);
        ``method_name`` the attribute called on an object of unknown type
        (``index_add_``).  Matches whose conditions are false are dropped;
        matches that need facts the call site lacks come back with
        ``certain=False``.  Only behaviours of ``torch_version`` count; by
        default the installed torch's (read from package metadata), and
        without torch the newest torch the table describes.
        """
        arguments = arguments or CallArguments()
        torch_version = torch_version or installed_torch_version()
        candidates: list[tuple[OpEntry, Spelling, int, bool]] = []
        if qualified_name:
            candidates += [(e, s, 0, False) for e, s in self._callables.get(qualified_name, [])]
            tensor_method = qualified_name.removeprefix("torch.Tensor.")
            if tensor_method != qualified_name:
                candidates += [(e, s, 1, False) for e, s in self._methods.get(tensor_method, [])]
        if method_name:
            candidates += [(e, s, 0, True) for e, s in self._methods.get(method_name, [])]
        matches = []
        for entry, spelling, offset, unknown_receiver in candidates:
            match = _match_spelling(entry, spelling, arguments, offset, unknown_receiver, torch_version)
            if match is not None:
                matches.append(match)
        return matches


def _match_spelling(
    entry: OpEntry,
    spelling: Spelling,
    arguments: CallArguments,
    offset: int,
    unknown_receiver: bool,
    torch_version: str | None,
) -> OpMatch | None:
    if torch_version:
        behaviours = entry.behaviours_for(torch_version=torch_version)
    else:
        behaviours = tuple(b for b in entry.behaviours if not _has_upper_bound(b.torch))
    if not behaviours:
        return None
    reasons = []
    conditions = spelling.when if spelling.when is not None else entry.when
    for condition in conditions:
        value = spelling.argument(condition.arg, arguments, offset)
        verdict = condition.evaluate(value)
        if verdict is False:
            return None
        if verdict is None:
            reasons.append(f"only when {condition.describe()}; the call passes a value not known statically")
    if entry.static:
        reasons.append(entry.static)
    if unknown_receiver and spelling.shared_name:
        reasons.append(f"numpy and pandas objects have .{spelling.name}() too; the receiver may not be a tensor")
    return OpMatch(entry, spelling, not reasons, tuple(reasons), behaviours)


# --- aten names --------------------------------------------------------------


def _aten_spelling(name: str) -> str:
    """``torch.ops.aten.x.default`` / ``aten::x`` / ``aten.x`` -> ``x.default`` / ``x``."""
    name = name.strip().removeprefix("torch.ops.").replace("::", ".")
    return name.removeprefix("aten.")


def _aten_base(name: str) -> str:
    """The packet name without overload and in-place suffix: the lookup key."""
    base = _aten_spelling(name).split(".", 1)[0]
    return base[:-1] if base.endswith("_") and not base.endswith("__") else base


def alert_caller(message: str) -> str | None:
    """The caller name in torch's "X does not have a deterministic
    implementation" error or warning, or None for any other message."""
    head, found, _ = message.partition(_ALERT_MARKER)
    if not found:
        return None
    return head.strip().splitlines()[-1].strip() or None


# --- versions ----------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def installed_torch_version() -> str | None:
    """The installed torch's version from its package metadata (torch itself is
    not imported), for ``match_call(torch_version=...)``; None without torch."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None

_VERSION_CLAUSE = re.compile(r"^(>=|<=|==|>|<)\s*(\d+(?:\.\d+)*)$")


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+", 1)[0].split(".")[:3]:
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
    return tuple(parts + [0] * (3 - len(parts)))


def _check_version_range(spec: str) -> str | None:
    """An error text for a malformed range such as ">=2.0,<2.14", else None."""
    for clause in spec.split(","):
        if not _VERSION_CLAUSE.match(clause.strip()):
            return f"{clause.strip()!r} is not a version clause like '>=2.11' or '<2.13'"
    return None


def _has_upper_bound(spec: str | None) -> bool:
    """Whether a range ends before the newest torch (``<2.13``, ``==2.11.0``)."""
    return bool(spec) and any(clause.strip()[:1] in "<=" for clause in spec.split(","))


def version_in_range(version: str, spec: str) -> bool:
    """Whether a torch version (``2.13.0+cpu``) lies in ``>=2.11,<2.13``."""
    have = _version_tuple(version)
    for clause in spec.split(","):
        operator, bound = _VERSION_CLAUSE.match(clause.strip()).groups()
        want = _version_tuple(bound)
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


# --- loading and validation ----------------------------------------------------


def load_ops_table(path: str | os.PathLike | None = None) -> OpsTable:
    """Read and validate a table: ``path``, else ``$DETAUDIT_OPS_TABLE``, else
    the shipped one.  Raises :class:`OpsTableError` with a one-line message."""
    how = ""
    if path is None and os.environ.get(TABLE_ENV_VAR):
        path = os.environ[TABLE_ENV_VAR]
        how = f" (from ${TABLE_ENV_VAR})"
    resolved = Path(path) if path is not None else SHIPPED_TABLE
    try:
        stamp = resolved.stat().st_mtime_ns
    except OSError as error:
        raise OpsTableError(f"cannot read ops table {resolved}{how}: {error.strerror}") from None
    return _load_cached(str(resolved), stamp, how)


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, stamp: int, how: str) -> OpsTable:
    origin = f"{path}{how}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise OpsTableError(f"cannot read ops table {origin}: {error}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise OpsTableError(
            f"ops table {origin} is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}"
        ) from None
    return parse_ops_table(document, origin)


def parse_ops_table(document: Any, origin: str = "<table>") -> OpsTable:
    """Validate a decoded JSON document and build the table."""
    try:
        _validate_document(document)
        return OpsTable(document, origin)
    except _SchemaError as error:
        raise OpsTableError(f"bad ops table {origin}: {error}") from None


class _SchemaError(Exception):
    pass


def _fail(where: str, problem: str):
    raise _SchemaError(f"{where}: {problem}")


def _check_keys(value: Any, where: str, required: Iterable[str], optional: Iterable[str] = ()) -> None:
    if not isinstance(value, dict):
        _fail(where, f"expected an object, got {type(value).__name__}")
    missing = [key for key in required if key not in value]
    if missing:
        _fail(where, f"missing {', '.join(repr(k) for k in missing)}")
    unknown = sorted(set(value) - set(required) - set(optional))
    if unknown:
        _fail(where, f"unknown key {unknown[0]!r}")


def _check_text(value: Any, where: str) -> None:
    if not isinstance(value, str) or not value.strip():
        _fail(where, "expected a non-empty string")


def _check_list(value: Any, where: str, allow_empty: bool = False) -> None:
    if not isinstance(value, list) or (not value and not allow_empty):
        _fail(where, "expected a non-empty list" if not allow_empty else "expected a list")


def _check_range(value: Any, where: str) -> None:
    _check_text(value, where)
    problem = _check_version_range(value)
    if problem:
        _fail(where, problem)


def _check_choices(values: Any, where: str, allowed: tuple[str, ...]) -> None:
    _check_list(values, where)
    for value in values:
        if value not in allowed:
            _fail(where, f"{value!r} is not one of {', '.join(allowed)}")


def _validate_document(document: Any) -> None:
    _check_keys(document, "top level", ("schema_version", "torch_versions", "provenance", "ops"))
    version = document["schema_version"]
    if not isinstance(version, int) or isinstance(version, bool):
        _fail("schema_version", "expected an integer")
    if version > SCHEMA_VERSION:
        _fail("schema_version", f"{version} is newer than this detaudit reads ({SCHEMA_VERSION}); upgrade detaudit")
    if version < 1:
        _fail("schema_version", f"{version} is not a valid version")
    _check_range(document["torch_versions"], "torch_versions")
    provenance = document["provenance"]
    if not isinstance(provenance, dict) or not isinstance(provenance.get("kind"), str):
        _fail("provenance", "expected an object with a 'kind' string")
    _check_list(document["ops"], "ops")
    seen = set()
    for index, raw in enumerate(document["ops"]):
        where = f"ops[{index}]"
        _validate_entry(raw, where)
        if raw["id"] in seen:
            _fail(f"{where}.id", f"duplicate id {raw['id']!r}")
        seen.add(raw["id"])


def _validate_entry(raw: Any, where: str) -> None:
    _check_keys(
        raw,
        where,
        ("id", "summary", "spellings", "aten", "behaviours", "sources"),
        ("when", "static", "alerts", "recipe", "note", "measurements"),
    )
    where = f"ops[{raw['id']!r}]" if isinstance(raw["id"], str) else where
    for key in ("id", "summary"):
        _check_text(raw[key], f"{where}.{key}")
    for key in ("static", "recipe", "note"):
        if key in raw:
            _check_text(raw[key], f"{where}.{key}")
    _check_list(raw.get("when", []), f"{where}.when", allow_empty=True)
    for i, condition in enumerate(raw.get("when", [])):
        _parse_condition(condition, f"{where}.when[{i}]")
    _check_list(raw["spellings"], f"{where}.spellings")
    for i, spelling in enumerate(raw["spellings"]):
        _validate_spelling(spelling, raw.get("when", []), f"{where}.spellings[{i}]")
    _check_list(raw["aten"], f"{where}.aten")
    for i, name in enumerate(raw["aten"]):
        if not isinstance(name, str) or not re.fullmatch(r"aten\.\w+(\.\w+)?", name):
            _fail(f"{where}.aten[{i}]", f"{name!r} is not an aten op name like 'aten.index_put.default'")
    _check_list(raw.get("alerts", []), f"{where}.alerts", allow_empty=True)
    for i, caller in enumerate(raw.get("alerts", [])):
        _check_text(caller, f"{where}.alerts[{i}]")
    _check_list(raw["behaviours"], f"{where}.behaviours")
    for i, behaviour in enumerate(raw["behaviours"]):
        _validate_behaviour(behaviour, f"{where}.behaviours[{i}]")
    _check_list(raw["sources"], f"{where}.sources")
    for i, source in enumerate(raw["sources"]):
        _check_keys(source, f"{where}.sources[{i}]", ("kind", "ref"))
        _check_choices([source["kind"]], f"{where}.sources[{i}].kind", SOURCE_KINDS)
        _check_text(source["ref"], f"{where}.sources[{i}].ref")
    _check_list(raw.get("measurements", []), f"{where}.measurements", allow_empty=True)
    for i, measurement in enumerate(raw.get("measurements", [])):
        if not isinstance(measurement, dict):
            _fail(f"{where}.measurements[{i}]", "expected an object")


def _validate_spelling(raw: Any, entry_conditions: list, where: str) -> None:
    kinds = [kind for kind in ("function", "module", "method") if isinstance(raw, dict) and kind in raw]
    if len(kinds) != 1:
        _fail(where, "expected exactly one of 'function', 'module', 'method'")
    _check_keys(raw, where, (kinds[0], "signature"), ("shared_name", "when"))
    _check_text(raw[kinds[0]], f"{where}.{kinds[0]}")
    params = _parse_signature(raw["signature"], f"{where}.signature")
    if "shared_name" in raw and not isinstance(raw["shared_name"], bool):
        _fail(f"{where}.shared_name", "expected true or false")
    conditions = raw.get("when", entry_conditions)
    _check_list(conditions, f"{where}.when", allow_empty=True)
    names = {param.name for param in params}
    for i, raw_condition in enumerate(conditions):
        condition = _parse_condition(raw_condition, f"{where}.when[{i}]")
        if condition.arg not in names:
            _fail(where, f"condition argument {condition.arg!r} is not a parameter of {raw[kinds[0]]}({raw['signature']})")


def _validate_behaviour(raw: Any, where: str) -> None:
    _check_keys(raw, where, ("devices", "phases", "mechanism", "deterministic_mode"), ("torch", "evidence"))
    _check_choices(raw["devices"], f"{where}.devices", DEVICES)
    _check_choices(raw["phases"], f"{where}.phases", PHASES)
    _check_text(raw["mechanism"], f"{where}.mechanism")
    _check_choices([raw["deterministic_mode"]], f"{where}.deterministic_mode", tuple(DETERMINISTIC_MODES))
    if "torch" in raw:
        _check_range(raw["torch"], f"{where}.torch")


_CONDITION_TESTS = ("equals", "in", "passed", "not_number")


def _parse_condition(raw: Any, where: str) -> Condition:
    tests = [test for test in _CONDITION_TESTS if isinstance(raw, dict) and test in raw]
    if len(tests) != 1:
        _fail(where, f"expected 'arg' and exactly one of {', '.join(_CONDITION_TESTS)}")
    test = tests[0]
    _check_keys(raw, where, ("arg", test))
    _check_text(raw["arg"], f"{where}.arg")
    expected = raw[test]
    if test == "in":
        _check_list(expected, f"{where}.in")
        expected = tuple(expected)
    elif test in ("passed", "not_number") and expected is not True:
        _fail(f"{where}.{test}", "must be true")
    return Condition(raw["arg"], test, expected)


def _parse_signature(text: Any, where: str) -> tuple[Param, ...]:
    """Parameters from Python signature text, e.g. ``"input, dim, *, alpha=1"``."""
    _check_text(text, where)
    try:
        function = ast.parse(f"def f({text}): pass").body[0]
        arguments = function.args
        positional = arguments.posonlyargs + arguments.args
        defaults = [_MISSING] * (len(positional) - len(arguments.defaults))
        defaults += [ast.literal_eval(node) for node in arguments.defaults]
        params = [Param(a.arg, i, d) for i, (a, d) in enumerate(zip(positional, defaults))]
        for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults):
            params.append(Param(arg.arg, None, _MISSING if default is None else ast.literal_eval(default)))
    except (SyntaxError, ValueError) as error:
        _fail(where, f"{text!r} is not a Python parameter list with literal defaults ({error})")
    return tuple(params)


def _parse_entry(raw: Mapping[str, Any]) -> OpEntry:
    spellings = []
    for item in raw["spellings"]:
        kind = next(k for k in ("function", "module", "method") if k in item)
        when = None
        if "when" in item:
            when = tuple(_parse_condition(c, "") for c in item["when"])
        params = _parse_signature(item["signature"], "")
        spellings.append(Spelling(kind, item[kind], params, item.get("shared_name", False), when))
    behaviours = tuple(
        Behaviour(tuple(b["devices"]), tuple(b["phases"]), b["mechanism"], b["deterministic_mode"], b.get("torch"))
        for b in raw["behaviours"]
    )
    return OpEntry(
        id=raw["id"],
        summary=raw["summary"],
        spellings=tuple(spellings),
        when=tuple(_parse_condition(c, "") for c in raw.get("when", [])),
        static=raw.get("static"),
        aten=tuple(raw["aten"]),
        alerts=tuple(raw.get("alerts", [])),
        behaviours=behaviours,
        sources=tuple(raw["sources"]),
        recipe=raw.get("recipe"),
        note=raw.get("note"),
    )
