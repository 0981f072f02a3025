"""The rule catalogue: one module per rule family.  Importing this package imports
every module in it, which registers their rules, so adding a rule family is
adding a module here and nothing else.  Rule modules never import each other:
what several rules need is in ``detaudit.static.analyses``.

Code ranges: DET000 parse errors · DET001-009 seeding · DET010-019 backend and
determinism settings · DET020-029 nondeterministic ops, memory and unfinished
collectives · DET030-039 data order and loading · DET040-049 TensorFlow/Keras
and JAX.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Iterable


def import_modules(package: str, path: Iterable[str]) -> list[ModuleType]:
    """Import every module of ``package`` (whose directories are ``path``)."""
    return [importlib.import_module(f"{package}.{module.name}") for module in pkgutil.iter_modules(path)]


RULE_MODULES = import_modules(__name__, __path__)
