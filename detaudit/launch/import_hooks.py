"""Run code in the child when the script imports a module, without importing it first.

A feature that changes a framework's class (Lightning's ``Trainer``,
transformers' ``Trainer``, accelerate's ``Accelerator``) must not import the
framework itself before the script runs: the script may set environment
variables first that the framework reads on import (``HF_HOME``,
``TRANSFORMERS_OFFLINE``), and a script that never imports it would pay
seconds for nothing.  ``when_imported(name, action)`` calls ``action(module)``
right after ``name`` has been imported, by whoever imports it (now, if it
already is).  Torch-free.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable

_PENDING: dict[str, list[Callable]] = {}  # module name -> actions waiting for its import


def when_imported(name: str, action: Callable) -> None:
    """Call ``action(module)`` once module ``name`` is imported (at once if it is)."""
    if name in sys.modules:
        action(sys.modules[name])
        return
    _PENDING.setdefault(name, []).append(action)
    if not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds a waited-for module through the other finders and wraps its loader."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _PENDING:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenAct(spec.loader, fullname)
                return spec
        return None


class _ThenAct(importlib.abc.Loader):
    def __init__(self, loader, name: str):
        self.loader = loader
        self.name = name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        for action in _PENDING.pop(self.name, []):
            action(module)

    def __getattr__(self, attribute):  # get_source, is_package ... of the wrapped loader
        return getattr(self.loader, attribute)
