"""Reading a knowledge table's JSON: the file, then each value checked while
the table's model is built from it, in one pass that stops at the first
problem and names its JSON path (``ops[12].behaviours[0].devices[0]: 'tpu'
is not one of cpu, cuda``).

Every table reader goes through it (``backend_settings``, ``ops.loading``,
``layers``, ``batch_ops``) and keeps only what its own format says: its keys
and vocabularies, and the references between its entries.  A
:class:`TableFormat` says how errors name one kind of table, in one line
(``bad ops table FILE: PATH: PROBLEM``) raised as that table's own error class.
A path is spelled out only once a problem is found, so checking a value costs
little more than reading it unchecked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, NoReturn, TypeVar

from detaudit.knowledge.versions import range_problem

T = TypeVar("T")
_new = object.__new__


class Invalid(Exception):
    """The first problem in a document, as ``path: problem``."""


def json_type(value: Any) -> str:
    """How a message names the JSON type of ``value`` ("a list")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    names = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


class Node:
    """A JSON value and where it is in its document.

    ``node[key]`` is a member of an object or an item of a list (one the
    reader already checked is there).  A node made by :meth:`entry` names the
    table entry it is (``op 'put'``), and every message about a value inside
    ends with that name.
    """

    __slots__ = ("value", "_parent", "_key", "_entry")

    def __init__(self, value: Any, parent: Node | None, key: str | int, entry: str | None = None):
        self.value = value
        self._parent = parent
        self._key = key  # at the root: how paths start ("" or "$")
        self._entry = entry  # looked up only for a message: children do not copy it

    @property
    def path(self) -> str:
        if self._parent is None:
            return self._key  # type: ignore[return-value]
        above = self._parent.path
        if isinstance(self._key, int):
            return f"{above}[{self._key}]"
        return f"{above}.{self._key}" if above else self._key

    def __getitem__(self, key: str | int) -> Node:
        # Made without calling the class: tables read most of their values
        # through here, and the __init__ call was most of what checking one cost.
        node = _new(Node)
        node.value = self.value[key]
        node._parent = self
        node._key = key
        node._entry = None
        return node

    def __contains__(self, key: str) -> bool:
        return key in self.value

    def entry(self, kind: str) -> Node:
        """This place as an entry of the table, named by its ``id`` (``op 'put'``)
        where it has a string one."""
        entry_id = self.value.get("id") if isinstance(self.value, dict) else None
        if not isinstance(entry_id, str):
            return self
        return Node(self.value, self._parent, self._key, f"{kind} {entry_id!r}")

    def fail(self, problem: str) -> NoReturn:
        named = self
        while named is not None and named._entry is None:
            named = named._parent
        around = f" ({named._entry})" if named is not None else ""
        raise Invalid(f"{self.path or 'top level'}: {problem}{around}")

    def optional(self, key: str, read: Callable[[Node], T], default: Any = None) -> T:
        """``read`` of member ``key``, or ``default`` where the object has none."""
        return read(self[key]) if key in self.value else default

    # --- containers --------------------------------------------------------------

    def fields(self, required: Iterable[str] = (), optional: Iterable[str] | None = ()) -> Node:
        """This node, once it is an object with the ``required`` keys and none
        beyond them and ``optional`` (any others when ``optional`` is None)."""
        if not isinstance(self.value, dict):
            self.fail(f"expected an object, got {json_type(self.value)}")
        required = tuple(required)
        missing = [key for key in required if key not in self.value]
        if missing:
            self.fail(f"missing {', '.join(repr(key) for key in missing)}")
        if optional is not None and len(self.value) > len(required):  # else every key is a required one
            unknown = sorted(set(self.value).difference(required, optional))
            if unknown:
                self.fail(f"unknown key {unknown[0]!r}")
        return self

    def items(self, empty_ok: bool = False) -> list[Node]:
        return [Node(value, self, i) for i, value in enumerate(self._list(empty_ok))]

    def _list(self, empty_ok: bool) -> list:
        if not isinstance(self.value, list) or (not self.value and not empty_ok):
            self.fail("expected a list" if empty_ok else "expected a non-empty list")
        return self.value

    def entries(self, empty_ok: bool = False) -> list[tuple[str, Node]]:
        """The members of an object whose keys are names the table gives (ids, packages)."""
        if not isinstance(self.value, dict):
            self.fail(f"expected an object, got {json_type(self.value)}")
        if not self.value and not empty_ok:
            self.fail("expected a non-empty object")
        return [(key, Node(value, self, key)) for key, value in self.value.items()]

    # --- values --------------------------------------------------------------------

    def string(self) -> str:
        if not isinstance(self.value, str):
            self.fail("expected a string")
        return self.value

    def text(self) -> str:
        if not _is_text(self.value):
            self.fail("expected a non-empty string")
        return self.value

    def texts(self, empty_ok: bool = False) -> tuple[str, ...]:
        # the items are checked as values: a node is made only for the one that fails
        values = self._list(empty_ok)
        for i, value in enumerate(values):
            if not _is_text(value):
                self[i].text()
        return tuple(values)

    def choice(self, allowed: Collection[str]) -> str:
        if not _is_choice(self.value, allowed):
            self.fail(f"{self.value!r} is not one of {', '.join(allowed)}")
        return self.value

    def choices(self, allowed: Collection[str], empty_ok: bool = False) -> tuple[str, ...]:
        values = self._list(empty_ok)
        for i, value in enumerate(values):
            if not _is_choice(value, allowed):
                self[i].choice(allowed)
        return tuple(values)

    def boolean(self) -> bool:
        if not isinstance(self.value, bool):
            self.fail("expected true or false")
        return self.value

    def scalar(self) -> Any:
        if self.value is not None and not isinstance(self.value, (bool, int, str)):
            self.fail("expected a string, number, boolean or null")
        return self.value

    def version_range(self) -> str:
        problem = range_problem(self.text())
        if problem:
            self.fail(problem)
        return self.value

    def schema_version(self, newest: int) -> int:
        """A table's ``schema_version``, which this detaudit reads up to ``newest``."""
        if not isinstance(self.value, int) or isinstance(self.value, bool) or self.value < 1:
            self.fail("expected a positive integer")
        if self.value > newest:
            self.fail(f"{self.value} is newer than this detaudit reads ({newest}); upgrade detaudit")
        return self.value


def _is_text(value: Any) -> bool:
    # isspace() stops at the first other character; strip() would copy the whole text
    return isinstance(value, str) and value != "" and not value.isspace()


def _is_choice(value: Any, allowed: Collection[str]) -> bool:
    return isinstance(value, str) and value in allowed


@dataclass(frozen=True)
class TableFormat:
    """One kind of table as its errors name it (``name``: "ops table"), the
    error class they raise, and how its paths start (``root``: "" for
    ``ops[0]``, the document itself being the "top level"; "$" for ``$.settings[0]``)."""

    name: str
    error: type[ValueError]
    root: str = ""

    def load(self, path: Path, origin: str | None = None) -> Any:
        """The JSON document at ``path``; messages name it ``origin`` (default: the path)."""
        origin = origin or str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or error  # strerror: the path is already in the message
            raise self.error(f"cannot read {self.name} {origin}: {reason}") from None
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise self.error(
                f"{self.name} {origin} is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}"
            ) from None

    def parse(self, document: Any, origin: str, build: Callable[[Node], T]) -> T:
        """``build`` the table from a decoded document; its first problem is raised as one line."""
        try:
            return build(Node(document, None, self.root))
        except Invalid as problem:
            raise self.error(f"bad {self.name} {origin}: {problem}") from None
