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
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from detaudit.knowledge._json_reader import Node, TableFormat

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


_FORMAT = TableFormat("layer table", LayerTableError)


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
    return _FORMAT.parse(document, origin, lambda root: _read_table(root, origin))


def _read_table(root: Node, origin: str) -> LayerTable:
    root.fields(optional=_TOP_KEYS)
    missing = sorted(_TOP_KEYS - set(root.value))
    if missing:
        root.fail(f"missing key {missing[0]!r}")
    version = root["schema_version"].value
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= LAYER_TABLE_SCHEMA_VERSION:
        root["schema_version"].fail(f"expected an integer from 1 to {LAYER_TABLE_SCHEMA_VERSION}")
    package = root["package"].text()
    package_version = root["package_version"].text()
    torch_version = root["torch_version"].text()
    modules = root["modules"].texts(empty_ok=True)
    layers = []
    for name, node in root["layers"].entries(empty_ok=True):
        if not name.startswith(f"{package}."):
            node.fail(f"not a name in package {package!r}")
        if not isinstance(node.value, dict) or set(node.value) != _LAYER_KEYS:
            node.fail(f"expected an object with keys {', '.join(sorted(_LAYER_KEYS))}")
        traced = node["traced"].boolean()
        layers.append(
            DerivedLayer(
                name=name,
                kind=node["kind"].choice(LAYER_KINDS),
                defined_in=node["defined_in"].text(),
                ops=node["ops"].texts(empty_ok=True),
                draws=node["draws"].choices(DRAW_PHASES, empty_ok=True),
                traced=traced,
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
    return parse_layer_table(_FORMAT.load(path), str(path))


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
