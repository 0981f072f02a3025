"""Queries on the ops table: which entries a call site, an aten op or a
nondeterminism alert reaches.

:class:`OpsTable` indexes the entries once; the static rule asks
:meth:`OpsTable.match_call`, the dynamic pass :meth:`OpsTable.lookup_aten`
and ``lookup_alert``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from detaudit.knowledge.ops.model import MISSING, Behaviour, Condition, HasBehaviours, OpEntry, Spelling
from detaudit.knowledge.versions import has_upper_bound, installed_torch_version

# The text torch puts after the caller name in a nondeterminism alert.
_ALERT_MARKER = " does not have a deterministic implementation"


class _Unknown:
    """A call argument the linter could not evaluate to a literal."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


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


def bound_argument(spelling: Spelling, name: str, arguments: CallArguments, offset: int = 0) -> Any:
    """The value a call binds to parameter ``name`` of ``spelling`` (``MISSING``
    when neither passed nor defaulted); ``offset`` skips an explicit ``self``
    (``torch.Tensor.index_add_(t, ...)``)."""
    if name in arguments.keywords:
        return arguments.keywords[name]
    param = next(p for p in spelling.params if p.name == name)
    if param.position is not None and param.position + offset < len(arguments.positional):
        return arguments.positional[param.position + offset]
    if arguments.unpacked:
        return UNKNOWN
    return param.default


def _same_literal(value: Any, expected: Any) -> bool:
    # True == 1 in Python, but accumulate=1 is not what a table entry means by True
    if isinstance(value, bool) or isinstance(expected, bool):
        return value is expected
    return value == expected and type(value) in (type(expected), int, float)


def condition_holds(condition: Condition, value: Any) -> bool | None:
    """True, False, or None when the value is unknown and it matters.

    For ``equals``/``in`` an unknown value is undecided; for ``not_in``,
    ``passed`` and ``not_number`` an unknown expression counts as satisfied,
    since passing a variable there is what the hazard needs."""
    if value is MISSING:
        return False
    if condition.test in ("equals", "in"):
        if value is UNKNOWN:
            return None
        choices = condition.expected if condition.test == "in" else (condition.expected,)
        return any(_same_literal(value, choice) for choice in choices)
    if value is UNKNOWN:
        return True
    if condition.test == "reshaped":
        return None  # the call site's text shows it, not a literal (``op_sites``)
    if condition.test == "not_in":
        return not any(_same_literal(value, choice) for choice in condition.expected)
    if condition.test == "passed":
        return value is not None
    return isinstance(value, bool) or not isinstance(value, (int, float, complex))


@dataclass(frozen=True)
class OpMatch(HasBehaviours):
    """A call site that reaches a table entry.

    ``certain`` is False when the hit depends on something the call site does
    not show (``reasons`` says what: a non-literal mode, the tensor's dtype, a
    receiver that may not be a tensor).  A rule that must not cry wolf reports
    only certain matches.  ``behaviours`` are the entry's behaviours for the
    torch version asked about.
    """

    entry: OpEntry
    spelling: Spelling
    certain: bool
    reasons: tuple[str, ...]
    behaviours: tuple[Behaviour, ...]

    @property
    def cuda_only(self) -> bool:
        return self.devices == ("cuda",)

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
        behaviours = tuple(b for b in entry.behaviours if not has_upper_bound(b.torch))
    if not behaviours:
        return None
    reasons = []
    conditions = spelling.when if spelling.when is not None else entry.when
    for condition in conditions:
        verdict = condition_holds(condition, bound_argument(spelling, condition.arg, arguments, offset))
        if verdict is False:
            return None
        if verdict is None:
            reasons.append(f"only when {condition.describe()}; the call passes a value not known statically")
    if entry.static and not entry.hazard_by_default:
        reasons.append(entry.static)
    if unknown_receiver and spelling.shared_name:
        reasons.append(f"numpy and pandas objects have .{spelling.name}() too; the receiver may not be a tensor")
    return OpMatch(entry, spelling, not reasons, tuple(reasons), behaviours)


# --- aten names and alerts -------------------------------------------------------


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


# --- the table -------------------------------------------------------------------


class OpsTable:
    """The entries of a validated table, indexed for the queries; build it
    with :func:`detaudit.knowledge.ops.load_ops_table`."""

    def __init__(
        self,
        entries: tuple[OpEntry, ...],
        *,
        schema_version: int,
        torch_versions: str,
        provenance: Mapping[str, Any],
        document: Mapping[str, Any],
        origin: str,
    ):
        self.entries = entries
        self.schema_version = schema_version
        self.torch_versions = torch_versions
        self.provenance = provenance
        self.document = document  # the JSON as read, for printing and recalibrating
        self.origin = origin
        self._by_id = {entry.id: entry for entry in entries}
        self._callables: dict[str, list[tuple[OpEntry, Spelling]]] = {}
        self._methods: dict[str, list[tuple[OpEntry, Spelling]]] = {}
        self._by_aten: dict[str, list[OpEntry]] = {}
        self._by_alert: dict[str, OpEntry] = {}
        for entry in entries:
            for spelling in entry.spellings:
                index = self._methods if spelling.kind == "method" else self._callables
                index.setdefault(spelling.name, []).append((entry, spelling))
            for aten_name in entry.aten:
                bucket = self._by_aten.setdefault(_aten_base(aten_name), [])
                if entry not in bucket:
                    bucket.append(entry)
            for caller in entry.alerts:
                self._by_alert.setdefault(caller, entry)

    def __iter__(self) -> Iterator[OpEntry]:
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
