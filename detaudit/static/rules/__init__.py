"""The rule catalogue: one module per rule family.  Importing this package imports
every rule module under it, family folders included, which registers their rules,
so adding a rule is adding a module and nothing else.  Rule modules never import
each other: what several rules need is in ``detaudit.static.analyses``.

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


def import_rule_modules(package: str, path: Iterable[str]) -> list[ModuleType]:
    """Import every rule module of ``package`` (whose directories are ``path``) and
    of its sub-packages, the rule families.  A family's private modules
    (``_common.py``) hold no rule: the rules that use them import them."""
    modules = []
    for found in pkgutil.iter_modules(path):
        if found.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{found.name}")
        if found.ispkg:
            modules += import_rule_modules(module.__name__, module.__path__)
        else:
            modules.append(module)
    return modules


RULE_MODULES = import_rule_modules(__name__, __path__)
