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
order and loading · ``other_frameworks/`` DET040-049 TensorFlow/Keras and JAX
· ``checkpoints/`` DET050-059 resume checkpoints that leave out training state.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Iterable


def import_rule_modules(package: str, path: Iterable[str]) -> list[ModuleType]:
    """Import every rule module of ``package`` (whose directories are ``path``) and
    of its sub-packages, the rule families.  Names that start with ``_`` are
    left out: a family's private modules (``_common.py``) hold no rule, and the
    rules that use them import them.  The folders are scanned directly:
    ``pkgutil.iter_modules`` over the six of them cost about a millisecond at
    every start, more than the imports of the modules it found."""
    modules = []
    for directory in path:
        for entry in sorted(os.scandir(directory), key=lambda entry: entry.name):
            name = entry.name.removesuffix(".py")
            if name.startswith("_") or not name.isidentifier():
                continue
            if entry.name.endswith(".py") and entry.is_file():
                modules.append(importlib.import_module(f"{package}.{name}"))
            elif entry.is_dir() and os.path.isfile(os.path.join(entry.path, "__init__.py")):
                modules += import_rule_modules(f"{package}.{name}", [entry.path])
    return modules


RULE_MODULES = import_rule_modules(__name__, __path__)
