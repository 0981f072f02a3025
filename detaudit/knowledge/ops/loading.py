"""Reading an ops table: which file, its JSON, and the typed model built from
it in one pass (``knowledge._json_reader``) that names the JSON path of the
first problem and the entry it is in (``ops[12].behaviours[0].devices[0]:
'tpu' is not one of cpu, cuda (op 'histc')``).

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
import os
import re
from pathlib import Path
from typing import Any

from detaudit.knowledge._json_reader import Node, TableFormat
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

SCHEMA_VERSION = 1
TABLE_ENV_VAR = "DETAUDIT_OPS_TABLE"
SHIPPED_TABLE = Path(__file__).parent.parent / "nondeterministic_ops.json"
SCHEMA_FILE = SHIPPED_TABLE.with_name("nondeterministic_ops.schema.json")

# Same pattern as the schema's, which anchors it with ^...$
ATEN_NAME = re.compile(r"aten\.[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)?")


class OpsTableError(ValueError):
    """A table that cannot be read or does not follow the schema (one line)."""


_FORMAT = TableFormat("ops table", OpsTableError)


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
    return parse_ops_table(_FORMAT.load(Path(path), origin), origin)


def parse_ops_table(document: Any, origin: str = "<table>") -> OpsTable:
    """Validate a decoded JSON document and build the table."""
    return _FORMAT.parse(document, origin, lambda root: _read_table(root, origin))


# --- the document, one constructor per part ---------------------------------------


def _read_table(root: Node, origin: str) -> OpsTable:
    root.fields(("schema_version", "torch_versions", "provenance", "ops"), ("$schema",))
    root.optional("$schema", Node.string)
    version = root["schema_version"].schema_version(SCHEMA_VERSION)
    torch_versions = root["torch_versions"].version_range()
    provenance = root["provenance"].fields(("kind",), None)
    provenance["kind"].string()
    entries: list[OpEntry] = []
    first_index: dict[str, int] = {}
    for i, node in enumerate(root["ops"].items()):
        entry = _read_entry(node)
        if entry.id in first_index:
            node["id"].fail(f"duplicate id {entry.id!r} (first at ops[{first_index[entry.id]}])")
        first_index[entry.id] = i
        entries.append(entry)
    return OpsTable(
        tuple(entries),
        schema_version=version,
        torch_versions=torch_versions,
        provenance=provenance.value,
        document=root.value,
        origin=origin,
    )


_ENTRY_KEYS = ("id", "summary", "spellings", "aten", "behaviours", "sources")
_OPTIONAL_ENTRY_KEYS = (
    "when", "static", "certain_when", "alerts", "recipe", "note", "measurements",
    "one_thread_deterministic", "deterministic_settings", "replacement", "hazard_by_default", "exact_results",
)


def _read_entry(node: Node) -> OpEntry:
    node = node.entry("op")  # every message below names the op
    node.fields(_ENTRY_KEYS, _OPTIONAL_ENTRY_KEYS)
    entry_id = node["id"].text()
    summary = node["summary"].text()
    static, recipe, note = (node.optional(key, Node.text) for key in ("static", "recipe", "note"))
    replacement = node.optional("replacement", Node.text)
    exact_results = node.optional("exact_results", Node.text)
    one_thread = node.optional("one_thread_deterministic", Node.boolean, False)
    by_default = node.optional("hazard_by_default", Node.boolean, False)
    if by_default and static is None:
        node["hazard_by_default"].fail("only an entry with `static` (a run-time choice) can name its default")
    settings = node.optional("deterministic_settings", lambda items: tuple(_setting_id(item) for item in items.items()), ())
    when = node.optional("when", _conditions, ())
    certain_when = node.optional("certain_when", _conditions, ())
    if certain_when and static is None:
        node["certain_when"].fail("only an entry with `static` (a call site that cannot decide) needs evidence")
    spellings = tuple(_read_spelling(item, when) for item in node["spellings"].items())
    aten = tuple(_aten_name(item) for item in node["aten"].items())
    alerts = node.optional("alerts", lambda callers: callers.texts(empty_ok=True), ())
    behaviours = tuple(_read_behaviour(item) for item in node["behaviours"].items())
    sources = tuple(_read_source(item) for item in node["sources"].items())
    for measurement in node.optional("measurements", lambda items: items.items(empty_ok=True), ()):
        measurement.fields(optional=None)
    return OpEntry(
        id=entry_id,
        summary=summary,
        spellings=spellings,
        when=when,
        static=static,
        certain_when=certain_when,
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
        exact_results=exact_results,
    )


@functools.lru_cache(maxsize=1)
def _setting_ids() -> frozenset[str]:
    return frozenset(setting.id for setting in backend_settings().settings)


def _setting_id(node: Node) -> str:
    setting_id = node.text()
    if setting_id not in _setting_ids():
        node.fail(f"{setting_id!r} is not a setting of backend_settings.json")
    return setting_id


def _aten_name(node: Node) -> str:
    if not isinstance(node.value, str) or not ATEN_NAME.fullmatch(node.value):
        node.fail(f"{node.value!r} is not an aten op name like 'aten.index_put.default'")
    return node.value


def _conditions(node: Node) -> tuple[Condition, ...]:
    return tuple(_read_condition(item) for item in node.items(empty_ok=True))


def _as_literal(value):
    """A JSON value as the linter sees a call's literal (a list is a tuple: ``(1, 1)``)."""
    return tuple(_as_literal(item) for item in value) if isinstance(value, list) else value


def _read_condition(node: Node) -> Condition:
    tests = [test for test in CONDITION_TESTS if isinstance(node.value, dict) and test in node.value]
    if len(tests) != 1:
        node.fail(f"expected 'arg' and exactly one of {', '.join(CONDITION_TESTS)}")
    test = tests[0]
    node.fields(("arg", test))
    arg = node["arg"].text()
    expected = node.value[test]
    if test in ("in", "not_in"):
        expected = tuple(_as_literal(item.value) for item in node[test].items())
    elif test in ("passed", "not_number", "reshaped") and expected is not True:
        node[test].fail("must be true")
    return Condition(arg, test, expected)


def _read_spelling(node: Node, entry_when: tuple[Condition, ...]) -> Spelling:
    kinds = [kind for kind in SPELLING_KINDS if isinstance(node.value, dict) and kind in node.value]
    if len(kinds) != 1:
        node.fail(f"expected exactly one of {', '.join(repr(kind) for kind in SPELLING_KINDS)}")
    kind = kinds[0]
    node.fields((kind, "signature"), ("shared_name", "when"))
    name = node[kind].text()
    params = _read_signature(node["signature"])
    shared_name = node.optional("shared_name", Node.boolean, False)
    own_when = node.optional("when", _conditions)
    names = {param.name for param in params}
    for condition in entry_when if own_when is None else own_when:
        if condition.arg not in names:
            signature = " ".join(node.value["signature"].split())  # one line, even for a signature written over several
            node.fail(f"condition argument {condition.arg!r} is not a parameter of {name}({signature})")
    return Spelling(kind, name, params, shared_name, own_when)


def _read_signature(node: Node) -> tuple[Param, ...]:
    """Parameters from Python signature text, e.g. ``"input, dim, *, alpha=1"``."""
    text = node.text()
    try:
        module = ast.parse(f"def f({text}): pass")
        if len(module.body) != 1:
            raise SyntaxError("more than a parameter list")
        arguments = module.body[0].args
        positional = arguments.posonlyargs + arguments.args
        defaults = [MISSING] * (len(positional) - len(arguments.defaults))
        defaults += [ast.literal_eval(default) for default in arguments.defaults]
        params = [Param(a.arg, i, d) for i, (a, d) in enumerate(zip(positional, defaults))]
        for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults):
            params.append(Param(arg.arg, None, MISSING if default is None else ast.literal_eval(default)))
    except (SyntaxError, ValueError) as error:
        reason = error.msg if isinstance(error, SyntaxError) else "a default is not a literal"
        node.fail(f"{text!r} is not a Python parameter list with literal defaults: {reason}")
    return tuple(params)


def _read_behaviour(node: Node) -> Behaviour:
    node.fields(("devices", "phases", "mechanism", "deterministic_mode"), ("torch", "evidence"))
    return Behaviour(
        devices=node["devices"].choices(DEVICES),
        phases=node["phases"].choices(PHASES),
        mechanism=node["mechanism"].text(),
        deterministic_mode=node["deterministic_mode"].choice(DETERMINISTIC_MODES),
        torch=node.optional("torch", Node.version_range),
    )


def _read_source(node: Node) -> dict:
    node.fields(("kind", "ref"))
    node["kind"].choice(SOURCE_KINDS)
    node["ref"].text()
    return node.value
