"""A light import/alias table: resolves an expression to a dotted qualified name.

libcst's QualifiedNameProvider costs about 11x the parse; the static pass only
needs "which module attribute is this?", so it keeps its own table of what each
local name was bound to by imports and simple aliasing assignments.
"""

from __future__ import annotations

import builtins
import random

import libcst as cst

_BUILTINS = frozenset(dir(builtins))

#: What ``from MODULE import *`` binds, for the star imports rules need to see
#: through: the global Python RNG's functions (``from random import *`` then a
#: bare ``randint()``).  Other star imports bind names nobody can list here.
STAR_EXPORTS = {"random": frozenset(random.__all__)}


def dotted_name(node: cst.BaseExpression) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted_name(node.value)
        return f"{base}.{node.attr.value}" if base is not None else None
    return None


def callee_name(func: cst.BaseExpression) -> str | None:
    """The last part of a callee's name: ``f`` of ``f(...)``, ``save`` of ``self.save(...)``."""
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


def _module_name(node: cst.BaseExpression | None) -> str:
    return dotted_name(node) or "" if node is not None else ""


class NameTable:
    """Maps local names to the qualified names they were bound to.

    Relative imports keep their leading dots (``from .misc import set_seed``
    binds ``set_seed`` to ``.misc.set_seed``) so project resolution can find the
    module relative to the file.
    """

    def __init__(self) -> None:
        self._bindings: dict[str, str] = {}
        #: modules star-imported (``from utils import *``) whose names cannot be listed
        #: here; the project index can look into the project's own
        self.star_modules: list[str] = []
        #: every module an import statement names, fully (``import a.b``: ``a.b``;
        #: ``from a import b``: ``a`` and ``a.b``, which may be a submodule): what importing runs
        self.imported_modules: list[str] = []

    def add_import(self, node: cst.Import | cst.ImportFrom) -> None:
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = _module_name(alias.name)
                self.imported_modules.append(full)
                if alias.asname is not None:
                    self._bindings[_module_name(alias.asname.name)] = full
                else:
                    top = full.split(".", 1)[0]
                    self._bindings[top] = top
            return
        module = "." * len(node.relative) + _module_name(node.module)
        self.imported_modules.append(module)
        if isinstance(node.names, cst.ImportStar):
            if module in STAR_EXPORTS:
                for name in STAR_EXPORTS[module]:
                    self._bindings[name] = f"{module}.{name}"
            else:
                self.star_modules.append(module)
            return
        for alias in node.names:
            imported = _module_name(alias.name)
            local = _module_name(alias.asname.name) if alias.asname is not None else imported
            separator = "" if module.endswith(".") or not module else "."
            self.imported_modules.append(f"{module}{separator}{imported}")
            self._bindings[local] = f"{module}{separator}{imported}"

    def bind(self, local: str, qualified: str) -> None:
        self._bindings[local] = qualified

    def is_bound(self, local: str) -> bool:
        return local in self._bindings

    def bindings(self) -> dict[str, str]:
        return dict(self._bindings)

    def resolve(self, node: cst.BaseExpression) -> str | None:
        """The qualified name of ``node``, or None when it does not come from an import.

        Unbound builtins resolve to their bare name (``setattr``, ``sorted``).
        """
        if isinstance(node, cst.Name):
            bound = self._bindings.get(node.value)
            if bound is not None:
                return bound
            return node.value if node.value in _BUILTINS else None
        if isinstance(node, cst.Attribute):
            base = self.resolve(node.value)
            if base is None or base in _BUILTINS:
                return None
            return f"{base}.{node.attr.value}"
        return None
