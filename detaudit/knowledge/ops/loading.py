"""Reading an ops table: which file, its JSON, and the typed model built from
it in one pass that names the JSON path of the first problem
(``ops[12].behaviours[0].devices[0]: 'tpu' is not one of cpu, cuda``).

The format is published for editors as ``nondeterministic_ops.schema.json``.
detaudit does not need a JSON Schema library to run; tests/test_ops_schema.py
feeds the same broken documents to the schema and to this reader so the two
cannot drift.  This reader also checks what the schema cannot say: ids are
unique, conditions name parameters of the spelling's signature, signatures
parse as Python parameter lists with literal defaults.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, NoReturn

from detaudit.knowledge.backend_settings import backend_settings
from detaudit.knowledge.ops.matching import OpsTable
from detaudit.knowledge.ops.model import (
    CONDITION_TESTS,
    DETERMINISTIC_MODES,
    DEVICES,
    MISSING,
    PHASES,
    SOURCE_KINDS,
    SPELLING_KINDS,
    Behaviour,
    Condition,
    OpEntry,
    Param,
    Spelling,
)
from detaudit.knowledge.versions import range_problem

SCHEMA_VERSION = 1
TABLE_ENV_VAR = "DETAUDIT_OPS_TABLE"
SHIPPED_TABLE = Path(__file__).parent.parent / "nondeterministic_ops.json"
SCHEMA_FILE = SHIPPED_TABLE.with_name("nondeterministic_ops.schema.json")

# Same pattern as the schema's, which anchors it with ^...$
ATEN_NAME = re.compile(r"aten\.[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)?")


class OpsTableError(ValueError):
    """A table that cannot be read or does not follow the schema (one line)."""


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
        return _read_table(document, origin)
    except _Invalid as error:
        raise OpsTableError(f"bad ops table {origin}: {error}") from None


# --- where a value is, and what is wrong with it ------------------------------------


class _Invalid(Exception):
    """The first problem in a document, as ``path: problem``."""


class _At:
    """A place in the document (``ops[12].behaviours[0].devices``) and the id
    of the entry around it, for error messages."""

    __slots__ = ("path", "op")

    def __init__(self, path: str = "", op: str | None = None):
        self.path = path
        self.op = op

    def __getitem__(self, key: str | int) -> _At:
        if isinstance(key, int):
            return _At(f"{self.path}[{key}]", self.op)
        return _At(f"{self.path}.{key}" if self.path else key, self.op)

    def within(self, op: str) -> _At:
        """The same place, inside the entry with id ``op``."""
        return _At(self.path, op)

    def fail(self, problem: str) -> NoReturn:
        around = f" (op {self.op!r})" if self.op else ""
        raise _Invalid(f"{self.path or 'top level'}: {problem}{around}")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    names = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def _object(value: Any, at: _At, required: Iterable[str] = (), optional: Iterable[str] | None = ()) -> dict:
    """``value`` as an object with the ``required`` keys and no keys beyond
    ``required`` and ``optional`` (any keys when ``optional`` is None)."""
    if not isinstance(value, dict):
        at.fail(f"expected an object, got {_json_type(value)}")
    missing = [key for key in required if key not in value]
    if missing:
        at.fail(f"missing {', '.join(repr(key) for key in missing)}")
    if optional is not None:
        unknown = sorted(set(value) - set(required) - set(optional))
        if unknown:
            at.fail(f"unknown key {unknown[0]!r}")
    return value


def _list(value: Any, at: _At, *, empty_ok: bool = False) -> list:
    if not isinstance(value, list) or (not value and not empty_ok):
        at.fail("expected a list" if empty_ok else "expected a non-empty list")
    return value


def _text(value: Any, at: _At) -> str:
    if not isinstance(value, str) or not value.strip():
        at.fail("expected a non-empty string")
    return value


def _one_of(value: Any, at: _At, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        at.fail(f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _some_of(value: Any, at: _At, allowed: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(_one_of(item, at[i], allowed) for i, item in enumerate(_list(value, at)))


def _version_range(value: Any, at: _At) -> str:
    problem = range_problem(_text(value, at))
    if problem:
        at.fail(problem)
    return value


# --- the document, one constructor per part ---------------------------------------


def _read_table(document: Any, origin: str) -> OpsTable:
    at = _At()
    _object(document, at, ("schema_version", "torch_versions", "provenance", "ops"), ("$schema",))
    if not isinstance(document.get("$schema", ""), str):
        at["$schema"].fail("expected a string")
    version = document["schema_version"]
    if not isinstance(version, int) or isinstance(version, bool):
        at["schema_version"].fail("expected an integer")
    if version > SCHEMA_VERSION:
        at["schema_version"].fail(f"{version} is newer than this detaudit reads ({SCHEMA_VERSION}); upgrade detaudit")
    if version < 1:
        at["schema_version"].fail(f"{version} is not a valid version")
    torch_versions = _version_range(document["torch_versions"], at["torch_versions"])
    provenance = _object(document["provenance"], at["provenance"], ("kind",), None)
    if not isinstance(provenance["kind"], str):
        at["provenance"]["kind"].fail("expected a string")
    entries: list[OpEntry] = []
    first_index: dict[str, int] = {}
    for i, raw in enumerate(_list(document["ops"], at["ops"])):
        entry = _read_entry(raw, at["ops"][i])
        if entry.id in first_index:
            at["ops"][i]["id"].fail(f"duplicate id {entry.id!r} (first at ops[{first_index[entry.id]}])")
        first_index[entry.id] = i
        entries.append(entry)
    return OpsTable(
        tuple(entries),
        schema_version=version,
        torch_versions=torch_versions,
        provenance=provenance,
        document=document,
        origin=origin,
    )


_ENTRY_KEYS = ("id", "summary", "spellings", "aten", "behaviours", "sources")
_OPTIONAL_ENTRY_KEYS = (
    "when", "static", "alerts", "recipe", "note", "measurements",
    "one_thread_deterministic", "deterministic_settings", "replacement", "hazard_by_default",
)


def _read_entry(raw: Any, at: _At) -> OpEntry:
    if isinstance(raw, dict) and isinstance(raw.get("id"), str):
        at = at.within(raw["id"])  # name the entry in every message below
    _object(raw, at, _ENTRY_KEYS, _OPTIONAL_ENTRY_KEYS)

    def optional_text(key: str) -> str | None:
        return _text(raw[key], at[key]) if key in raw else None

    entry_id = _text(raw["id"], at["id"])
    summary = _text(raw["summary"], at["summary"])
    static, recipe, note = optional_text("static"), optional_text("recipe"), optional_text("note")
    replacement = optional_text("replacement")
    one_thread = raw.get("one_thread_deterministic", False)
    if not isinstance(one_thread, bool):
        at["one_thread_deterministic"].fail("expected true or false")
    by_default = raw.get("hazard_by_default", False)
    if not isinstance(by_default, bool):
        at["hazard_by_default"].fail("expected true or false")
    if by_default and static is None:
        at["hazard_by_default"].fail("only an entry with `static` (a run-time choice) can name its default")
    settings = ()
    if "deterministic_settings" in raw:
        items = _list(raw["deterministic_settings"], at["deterministic_settings"])
        settings = tuple(_setting_id(item, at["deterministic_settings"][i]) for i, item in enumerate(items))
    when = _conditions(raw.get("when", []), at["when"])
    spellings = tuple(
        _read_spelling(item, at["spellings"][i], when) for i, item in enumerate(_list(raw["spellings"], at["spellings"]))
    )
    aten = tuple(_aten_name(name, at["aten"][i]) for i, name in enumerate(_list(raw["aten"], at["aten"])))
    alerts = tuple(
        _text(caller, at["alerts"][i]) for i, caller in enumerate(_list(raw.get("alerts", []), at["alerts"], empty_ok=True))
    )
    behaviours = tuple(
        _read_behaviour(item, at["behaviours"][i]) for i, item in enumerate(_list(raw["behaviours"], at["behaviours"]))
    )
    sources = tuple(_read_source(item, at["sources"][i]) for i, item in enumerate(_list(raw["sources"], at["sources"])))
    for i, measurement in enumerate(_list(raw.get("measurements", []), at["measurements"], empty_ok=True)):
        _object(measurement, at["measurements"][i], optional=None)
    return OpEntry(
        id=entry_id,
        summary=summary,
        spellings=spellings,
        when=when,
        static=static,
        aten=aten,
        alerts=alerts,
        behaviours=behaviours,
        sources=sources,
        recipe=recipe,
        note=note,
        one_thread_deterministic=one_thread,
        deterministic_settings=settings,
        replacement=replacement,
        hazard_by_default=by_default,
    )


def _setting_id(value: Any, at: _At) -> str:
    setting_id = _text(value, at)
    if setting_id not in {setting.id for setting in backend_settings().settings}:
        at.fail(f"{setting_id!r} is not a setting of backend_settings.json")
    return setting_id


def _aten_name(value: Any, at: _At) -> str:
    if not isinstance(value, str) or not ATEN_NAME.fullmatch(value):
        at.fail(f"{value!r} is not an aten op name like 'aten.index_put.default'")
    return value


def _conditions(value: Any, at: _At) -> tuple[Condition, ...]:
    return tuple(_read_condition(item, at[i]) for i, item in enumerate(_list(value, at, empty_ok=True)))


def _read_condition(raw: Any, at: _At) -> Condition:
    tests = [test for test in CONDITION_TESTS if isinstance(raw, dict) and test in raw]
    if len(tests) != 1:
        at.fail(f"expected 'arg' and exactly one of {', '.join(CONDITION_TESTS)}")
    test = tests[0]
    _object(raw, at, ("arg", test))
    arg = _text(raw["arg"], at["arg"])
    expected = raw[test]
    if test == "in":
        expected = tuple(_list(expected, at["in"]))
    elif test in ("passed", "not_number") and expected is not True:
        at[test].fail("must be true")
    return Condition(arg, test, expected)


def _read_spelling(raw: Any, at: _At, entry_when: tuple[Condition, ...]) -> Spelling:
    kinds = [kind for kind in SPELLING_KINDS if isinstance(raw, dict) and kind in raw]
    if len(kinds) != 1:
        at.fail(f"expected exactly one of {', '.join(repr(kind) for kind in SPELLING_KINDS)}")
    kind = kinds[0]
    _object(raw, at, (kind, "signature"), ("shared_name", "when"))
    name = _text(raw[kind], at[kind])
    params = _read_signature(raw["signature"], at["signature"])
    shared_name = raw.get("shared_name", False)
    if not isinstance(shared_name, bool):
        at["shared_name"].fail("expected true or false")
    own_when = _conditions(raw["when"], at["when"]) if "when" in raw else None
    names = {param.name for param in params}
    for condition in entry_when if own_when is None else own_when:
        if condition.arg not in names:
            signature = " ".join(raw["signature"].split())  # one line, even for a signature written over several
            at.fail(f"condition argument {condition.arg!r} is not a parameter of {name}({signature})")
    return Spelling(kind, name, params, shared_name, own_when)


def _read_signature(value: Any, at: _At) -> tuple[Param, ...]:
    """Parameters from Python signature text, e.g. ``"input, dim, *, alpha=1"``."""
    text = _text(value, at)
    try:
        module = ast.parse(f"def f({text}): pass")
        if len(module.body) != 1:
            raise SyntaxError("more than a parameter list")
        arguments = module.body[0].args
        positional = arguments.posonlyargs + arguments.args
        defaults = [MISSING] * (len(positional) - len(arguments.defaults))
        defaults += [ast.literal_eval(node) for node in arguments.defaults]
        params = [Param(a.arg, i, d) for i, (a, d) in enumerate(zip(positional, defaults))]
        for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults):
            params.append(Param(arg.arg, None, MISSING if default is None else ast.literal_eval(default)))
    except (SyntaxError, ValueError) as error:
        reason = error.msg if isinstance(error, SyntaxError) else "a default is not a literal"
        at.fail(f"{text!r} is not a Python parameter list with literal defaults: {reason}")
    return tuple(params)


def _read_behaviour(raw: Any, at: _At) -> Behaviour:
    _object(raw, at, ("devices", "phases", "mechanism", "deterministic_mode"), ("torch", "evidence"))
    return Behaviour(
        devices=_some_of(raw["devices"], at["devices"], DEVICES),
        phases=_some_of(raw["phases"], at["phases"], PHASES),
        mechanism=_text(raw["mechanism"], at["mechanism"]),
        deterministic_mode=_one_of(raw["deterministic_mode"], at["deterministic_mode"], DETERMINISTIC_MODES),
        torch=_version_range(raw["torch"], at["torch"]) if "torch" in raw else None,
    )


def _read_source(raw: Any, at: _At) -> dict:
    _object(raw, at, ("kind", "ref"))
    _one_of(raw["kind"], at["kind"], SOURCE_KINDS)
    _text(raw["ref"], at["ref"])
    return raw
