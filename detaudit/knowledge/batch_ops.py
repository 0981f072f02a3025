"""The knowledge base of batch-variant ops: loading and the hints it gives.

The facts live in ``batch_variant_ops.json``: which ops give a sample
different bits depending on the batch it is in (``kind`` "kernel": the
reduction order follows the shape; "sample-mixing": the result depends on the
other samples; "random": draws are made for the whole batch), why on each
device, and the remedies that make them invariant with what they cost.
Remedies are defined once and referred to by id.

Readers: the batch-invariance report (``detaudit.dynamic.batch.audit``) asks
:meth:`BatchOpsTable.hint` for a root-cause op; the static rule
``batch-size-equality`` asks :meth:`BatchOpsTable.invariance_markers` which
names in a file show that batch-invariant kernels are on.  This module never
imports torch or numpy.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

SCHEMA_VERSION = 1
SHIPPED_TABLE = Path(__file__).with_name("batch_variant_ops.json")
KINDS = ("kernel", "sample-mixing", "random")
DEVICES = ("cpu", "cuda")


class BatchOpsTableError(ValueError):
    """The table cannot be read or breaks the schema (one line)."""


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
    evidence: str  # "measured" or "sources"


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


def _remedy(data: dict) -> Remedy:
    return Remedy(
        id=data["id"],
        how=data["how"],
        devices=tuple(data["devices"]),
        cost=data["cost"],
        source=data["source"],
        requires=data.get("requires", ""),
        module=data.get("module", ""),
        markers=tuple(data.get("markers", ())),
    )


def parse_table(data: dict) -> BatchOpsTable:
    """Validate and build the table; raises BatchOpsTableError with the first problem."""
    if data.get("schema_version") != SCHEMA_VERSION:
        raise BatchOpsTableError(f"schema_version must be {SCHEMA_VERSION}, got {data.get('schema_version')!r}")
    try:
        remedies = {entry["id"]: _remedy(entry) for entry in data["remedies"]}
        ops = []
        for entry in data["ops"]:
            if entry["kind"] not in KINDS:
                raise BatchOpsTableError(f"op {entry['id']}: kind must be one of {', '.join(KINDS)}")
            behaviours = tuple(
                Behaviour(tuple(b["devices"]), b["why"], b["evidence"]) for b in entry["behaviours"]
            )
            unknown = [d for b in behaviours for d in b.devices if d not in DEVICES]
            if unknown:
                raise BatchOpsTableError(f"op {entry['id']}: unknown device {unknown[0]!r}")
            missing = [r for r in entry["remedies"] if r not in remedies]
            if missing:
                raise BatchOpsTableError(f"op {entry['id']}: unknown remedy {missing[0]!r}")
            ops.append(
                BatchVariantOp(
                    id=entry["id"],
                    summary=entry["summary"],
                    kind=entry["kind"],
                    aten=tuple(entry["aten"]),
                    behaviours=behaviours,
                    remedies=tuple(remedies[r] for r in entry["remedies"]),
                )
            )
    except (KeyError, TypeError) as error:
        raise BatchOpsTableError(f"malformed batch-variant ops table: missing or wrong field {error}") from None
    return BatchOpsTable(ops, list(remedies.values()))


@functools.lru_cache(maxsize=None)
def load_batch_ops_table(path: str | None = None) -> BatchOpsTable:
    """The shipped table, or the one at ``path``."""
    source = Path(path) if path else SHIPPED_TABLE
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise BatchOpsTableError(f"cannot read batch-variant ops table {source}: {error}") from None
    return parse_table(data)
