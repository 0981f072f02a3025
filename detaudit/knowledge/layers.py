"""Third-party layers that run nondeterministic kernels or draw from the torch RNG.

A GNN layer (``torch_geometric.nn.GCNConv``) aggregates with scatter-add, and
its constructor initialises weights from the torch RNG, yet a call site shows
neither.  Which layers do is derived, not hand-listed: ``detaudit calibrate
--modules PACKAGE.MODULE`` (``detaudit.knowledge.derive_layers``) builds each
public layer of an installed package, runs it forward and backward on the CPU
under a dispatch mode, and writes the ops-table entries its aten ops reach and
the RNG draws it makes, with the package version it was derived from, as a
*derived layer table* (JSON).  This module reads those tables without torch, for
the static pass: the shipped ones in ``derived_layers/`` and the files or
folders ``$DETAUDIT_LAYER_TABLES`` names (``os.pathsep``-separated).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

#: The format this reader understands; bump it when the document changes shape.
LAYER_TABLE_SCHEMA_VERSION = 1
SHIPPED_DIR = Path(__file__).with_name("derived_layers")
TABLES_VARIABLE = "DETAUDIT_LAYER_TABLES"

#: When a layer draws from the torch RNG: building it (weight init) or calling it (dropout, sampling).
DRAW_PHASES = ("construction", "call")
LAYER_KINDS = ("class", "function")

_TOP_KEYS = {"schema_version", "package", "package_version", "torch_version", "modules", "layers"}
_LAYER_KEYS = {"kind", "defined_in", "ops", "draws", "traced"}


class LayerTableError(ValueError):
    """A derived layer table that cannot be used, with the JSON path of the problem."""


@dataclass(frozen=True)
class DerivedLayer:
    """One public layer (class or function) of a traced package."""

    name: str  # the public dotted name it was traced under: torch_geometric.nn.GCNConv
    kind: str  # one of LAYER_KINDS
    defined_in: str  # the module that defines it: torch_geometric.nn.conv.gcn_conv
    ops: tuple[str, ...]  # ids of ops-table entries its forward/backward reached
    draws: tuple[str, ...]  # a subset of DRAW_PHASES
    traced: bool  # False: it could not be built or run, ops and call draws are unknown
    package: str
    package_version: str  # the installed version it was derived from

    @property
    def derived_from(self) -> str:
        return f"{self.package} {self.package_version}"


@dataclass(frozen=True)
class LayerTable:
    package: str
    package_version: str
    torch_version: str
    modules: tuple[str, ...]
    layers: tuple[DerivedLayer, ...]
    origin: str


def parse_layer_table(document: Any, origin: str = "<document>") -> LayerTable:
    """Validate a derived layer table document; :class:`LayerTableError` names the first problem."""

    def fail(where: str, problem: str) -> LayerTableError:
        return LayerTableError(f"bad layer table {origin}: {where}: {problem}")

    def text(value: Any, where: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise fail(where, "expected a non-empty string")
        return value

    def texts(value: Any, where: str, allowed: tuple[str, ...] | None = None) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise fail(where, "expected a list")
        items = tuple(text(item, f"{where}[{i}]") for i, item in enumerate(value))
        for i, item in enumerate(items):
            if allowed is not None and item not in allowed:
                raise fail(f"{where}[{i}]", f"{item!r} is not one of {', '.join(allowed)}")
        return items

    if not isinstance(document, dict):
        raise fail("top level", "expected an object")
    unknown = set(document) - _TOP_KEYS
    missing = _TOP_KEYS - set(document)
    if unknown or missing:
        raise fail("top level", f"unknown key {sorted(unknown)[0]!r}" if unknown else f"missing key {sorted(missing)[0]!r}")
    version = document["schema_version"]
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= LAYER_TABLE_SCHEMA_VERSION:
        raise fail("schema_version", f"expected an integer from 1 to {LAYER_TABLE_SCHEMA_VERSION}")
    package = text(document["package"], "package")
    package_version = text(document["package_version"], "package_version")
    torch_version = text(document["torch_version"], "torch_version")
    modules = texts(document["modules"], "modules")
    raw_layers = document["layers"]
    if not isinstance(raw_layers, dict):
        raise fail("layers", "expected an object")
    layers = []
    for name, raw in raw_layers.items():
        where = f"layers.{name}"
        if not name.startswith(f"{package}."):
            raise fail(where, f"not a name in package {package!r}")
        if not isinstance(raw, dict) or set(raw) != _LAYER_KEYS:
            raise fail(where, f"expected an object with keys {', '.join(sorted(_LAYER_KEYS))}")
        if not isinstance(raw["traced"], bool):
            raise fail(f"{where}.traced", "expected true or false")
        if raw["kind"] not in LAYER_KINDS:
            raise fail(f"{where}.kind", f"{raw['kind']!r} is not one of {', '.join(LAYER_KINDS)}")
        layers.append(
            DerivedLayer(
                name=name,
                kind=raw["kind"],
                defined_in=text(raw["defined_in"], f"{where}.defined_in"),
                ops=texts(raw["ops"], f"{where}.ops"),
                draws=texts(raw["draws"], f"{where}.draws", DRAW_PHASES),
                traced=raw["traced"],
                package=package,
                package_version=package_version,
            )
        )
    return LayerTable(package, package_version, torch_version, modules, tuple(layers), origin)


def _table_files() -> Iterator[Path]:
    yield from sorted(SHIPPED_DIR.glob("*.json"))
    for item in filter(None, os.environ.get(TABLES_VARIABLE, "").split(os.pathsep)):
        path = Path(item)
        yield from sorted(path.glob("*.json")) if path.is_dir() else (path,)


def layer_table_stamps() -> list[str]:
    """Path, size and modification time of every table read, for the result cache's key."""
    stamps = []
    for path in _table_files():
        try:
            stat = path.stat()
        except OSError:
            continue
        stamps.append(f"{path}:{stat.st_size}:{stat.st_mtime_ns}")
    return stamps


def load_layer_table(path: Path) -> LayerTable:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise LayerTableError(f"cannot read layer table {path}: {error.strerror}") from None
    except ValueError as error:
        raise LayerTableError(f"bad layer table {path}: not JSON ({error})") from None
    return parse_layer_table(document, str(path))


class DerivedLayers:
    """Every derived layer of the loaded tables, found by the name a call resolves to."""

    def __init__(self, tables: tuple[LayerTable, ...]) -> None:
        self.tables = tables
        self._by_name: dict[str, DerivedLayer] = {}
        # (package, last name) -> the layer, when one layer of the package has that name
        by_leaf: dict[tuple[str, str], list[DerivedLayer]] = {}
        for table in tables:  # later tables (the environment's) replace shipped ones
            for layer in table.layers:
                self._by_name[layer.name] = layer
                leaf = layer.name.rpartition(".")[2]
                self._by_name[f"{layer.defined_in}.{leaf}"] = layer
                by_leaf.setdefault((table.package, leaf), []).append(layer)
        self._by_leaf: Mapping[tuple[str, str], DerivedLayer] = {
            key: found[-1] for key, found in by_leaf.items() if len({layer.defined_in for layer in found}) == 1
        }
        self.packages = frozenset(table.package for table in tables)

    def find(self, qualname: str | None) -> DerivedLayer | None:
        """The layer ``qualname`` names: its public or defining name, or any other
        re-export in its package (``torch_geometric.nn.conv.GCNConv``)."""
        if not qualname or qualname.partition(".")[0] not in self.packages:
            return None
        found = self._by_name.get(qualname)
        if found is None:
            package, leaf = qualname.partition(".")[0], qualname.rpartition(".")[2]
            found = self._by_leaf.get((package, leaf))
        return found


@functools.lru_cache(maxsize=4)
def _derived_layers(sources: str) -> DerivedLayers:
    return DerivedLayers(tuple(load_layer_table(path) for path in _table_files()))


def derived_layers() -> DerivedLayers:
    """The shipped tables and those ``$DETAUDIT_LAYER_TABLES`` names (read once per value)."""
    return _derived_layers(os.environ.get(TABLES_VARIABLE, ""))
