"""The rule catalogue: one module per rule, named after the rule (``cudnn_benchmark.py`` holds cudnn-benchmark), in one folder per family of codes.

Importing this package imports every rule module under it, found by walking
the folders, which registers their rules: adding a rule is adding its module,
listed nowhere.  A rule module imports the rule base (``rule.py``), the
analyses, ``engine/``'s building blocks, ``fixes/edits.py`` and
``fixes/code.py``, ``detaudit.knowledge``, and of ``rules/`` only its own
family's private modules (``_common.py``: what rules of one family share);
what rules of several families need is an analysis.  The families follow
the code decades: ``parse_error.py`` DET000 (files that could not be read or
parsed) · ``seeding/`` DET001-009 · ``settings/`` DET010-019 backend and
determinism settings · ``kernels/`` DET020-029 nondeterministic ops, memory,
batch invariance and unfinished collectives · ``data_order/`` DET030-039 data
order and loading · ``other_frameworks/`` DET040-049 TensorFlow/Keras and JAX.
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
