"""The knowledge base of batch-variant ops: loading and the hints it gives.

The facts live in ``batch_variant_ops.json``: which ops give a sample
different bits depending on the batch it is in (``kind`` "kernel": the
reduction order follows the shape; "sample-mixing": the result depends on the
other samples; "random": draws are made for the whole batch), why on each
device, and the remedies that make them invariant with what they cost.
Remedies are defined once and referred to by id.  The table is checked as it
is read (``knowledge._json_reader``): a broken one is refused in one line that
names the JSON path of the problem.

Readers: the batch-invariance report (``detaudit.dynamic.batch.audit``) asks
:meth:`BatchOpsTable.hint` for a root-cause op; the static rule
``batch-size-equality`` asks :meth:`BatchOpsTable.invariance_markers` which
names in a file show that batch-invariant kernels are on.  This module never
imports torch or numpy.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from detaudit.knowledge._json_reader import Node, TableFormat

SCHEMA_VERSION = 1
SHIPPED_TABLE = Path(__file__).with_name("batch_variant_ops.json")
KINDS = ("kernel", "sample-mixing", "random")
DEVICES = ("cpu", "cuda")
#: What a behaviour's reason rests on: measured by detaudit's batch fixtures, or read in the sources.
EVIDENCE = ("measured", "sources")


class BatchOpsTableError(ValueError):
    """The table cannot be read or breaks its format (one line, with the JSON path)."""


@dataclass(frozen=True)
class Remedy:
    id: str
    how: str
    devices: tuple[str, ...]
    cost: str
    source: str
    requires: str = ""
    module: str = ""  # a library that provides it: the hint says when it is installed
    markers: tuple[str, ...] = ()  # names in code that show it is in use

    def installed(self) -> bool:
        return bool(self.module) and importlib.util.find_spec(self.module) is not None


@dataclass(frozen=True)
class Behaviour:
    devices: tuple[str, ...]
    why: str
    evidence: str  # one of EVIDENCE


@dataclass(frozen=True)
class BatchVariantOp:
    id: str
    summary: str
    kind: str
    aten: tuple[str, ...]
    behaviours: tuple[Behaviour, ...]
    remedies: tuple[Remedy, ...]

    def why(self, device: str | None = None) -> str:
        """Why it varies on ``device`` (every device's reason when None or unknown)."""
        chosen = [b for b in self.behaviours if device in b.devices] or list(self.behaviours)
        return "; ".join(b.why for b in chosen)

    def remedies_for(self, device: str | None = None) -> list[Remedy]:
        return [r for r in self.remedies if device is None or device in r.devices] or list(self.remedies)


class BatchOpsTable:
    def __init__(self, ops: list[BatchVariantOp], remedies: list[Remedy]):
        self.ops = ops
        self.remedies = remedies
        self._by_aten = {name: op for op in ops for name in op.aten}

    def lookup_aten(self, op: str) -> BatchVariantOp | None:
        """The entry for an aten overload ("aten.mm.default"); None if unknown."""
        return self._by_aten.get(op)

    def explain(self, op: str, device: str | None = None, remedies: int = 3) -> tuple[str, list[str]]:
        """Why ``op`` is batch-variant on ``device``, and its first few remedies
        with their cost (("", []) for an op the table does not know)."""
        entry = self.lookup_aten(op)
        if entry is None:
            return "", []
        fixes = []
        for remedy in entry.remedies_for(device)[:remedies]:
            installed = " (installed here)" if remedy.installed() else ""
            fixes.append(f"{remedy.how}{installed} (cost: {remedy.cost})")
        return f"{entry.summary}: {entry.why(device)}", fixes

    def hint(self, op: str, device: str | None = None) -> str:
        """``explain`` as one paragraph."""
        why, fixes = self.explain(op, device)
        return f"{why}. Invariant with: {'; or '.join(fixes)}." if why else ""

    def invariance_markers(self) -> frozenset[str]:
        """Names whose presence in code means batch-invariant kernels are switched on."""
        return frozenset(marker for remedy in self.remedies for marker in remedy.markers)


# --- reading ----------------------------------------------------------------------


_FORMAT = TableFormat("batch-variant ops table", BatchOpsTableError)
T = TypeVar("T", Remedy, BatchVariantOp)


def parse_table(document: Any, origin: str = "<table>") -> BatchOpsTable:
    """Validate and build the table; raises BatchOpsTableError naming the JSON path of the first problem."""
    return _FORMAT.parse(document, origin, _read_table)


@functools.lru_cache(maxsize=None)
def load_batch_ops_table(path: str | None = None) -> BatchOpsTable:
    """The shipped table, or the one at ``path``."""
    source = Path(path) if path else SHIPPED_TABLE
    return parse_table(_FORMAT.load(source), str(source))


def _read_table(root: Node) -> BatchOpsTable:
    root.fields(("schema_version", "torch_versions", "provenance", "remedies", "ops"))
    root["schema_version"].schema_version(SCHEMA_VERSION)
    root["torch_versions"].version_range()
    root["provenance"].fields(("kind", "date", "description"))
    remedies = _by_id(root["remedies"].items(), _read_remedy)
    ops = _by_id(root["ops"].items(), lambda node: _read_op(node, remedies))
    return BatchOpsTable(list(ops.values()), list(remedies.values()))


def _by_id(nodes: list[Node], read: Callable[[Node], T]) -> dict[str, T]:
    """Each entry read, by its id, which no other entry of the list may have."""
    read_so_far: dict[str, T] = {}
    for node in nodes:
        entry = read(node)
        if entry.id in read_so_far:
            node["id"].fail(f"duplicate id {entry.id!r}")
        read_so_far[entry.id] = entry
    return read_so_far


def _read_remedy(node: Node) -> Remedy:
    node.fields(("id", "how", "devices", "cost", "source"), ("requires", "module", "markers"))
    return Remedy(
        id=node["id"].text(),
        how=node["how"].text(),
        devices=node["devices"].choices(DEVICES),
        cost=node["cost"].text(),
        source=node["source"].text(),
        requires=node.optional("requires", Node.text, ""),
        module=node.optional("module", Node.text, ""),
        markers=node.optional("markers", Node.texts, ()),
    )


def _read_op(node: Node, remedies: Mapping[str, Remedy]) -> BatchVariantOp:
    node = node.entry("op")  # every message below names the op
    node.fields(("id", "summary", "kind", "aten", "behaviours", "remedies"))
    return BatchVariantOp(
        id=node["id"].text(),
        summary=node["summary"].text(),
        kind=node["kind"].choice(KINDS),
        aten=node["aten"].texts(),
        behaviours=tuple(_read_behaviour(item) for item in node["behaviours"].items()),
        remedies=tuple(_remedy_named(item, remedies) for item in node["remedies"].items()),
    )


def _read_behaviour(node: Node) -> Behaviour:
    node.fields(("devices", "why", "evidence"))
    return Behaviour(node["devices"].choices(DEVICES), node["why"].text(), node["evidence"].choice(EVIDENCE))


def _remedy_named(node: Node, remedies: Mapping[str, Remedy]) -> Remedy:
    remedy_id = node.text()
    if remedy_id not in remedies:
        node.fail(f"unknown remedy {remedy_id!r}")
    return remedies[remedy_id]
