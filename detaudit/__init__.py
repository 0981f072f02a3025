"""detaudit: a determinism auditor for PyTorch training code.

Importing ``detaudit`` is cheap and never imports torch or numpy: the public
helpers below are loaded on first attribute access, so ``detaudit check`` (and a
pre-commit environment without torch) stays small and fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it (imported on first use)
_LAZY_EXPORTS = {
    "seed_everything": "detaudit.runtime.seeding",
    "seed_worker": "detaudit.runtime.seeding",
    "make_generator": "detaudit.runtime.seeding",
    "enable_determinism": "detaudit.runtime.determinism",
    "deterministic": "detaudit.runtime.determinism",
    "status": "detaudit.runtime.status",
    "audit": "detaudit.dynamic.audit",
    "audit_batch_invariance": "detaudit.dynamic.batch.audit",
    "audit_resume": "detaudit.resume.audit",
    "log_metric": "detaudit.stats.metrics",
    "log_predictions": "detaudit.stats.metrics",
}

__all__ = ["__version__", *_LAZY_EXPORTS]


def __getattr__(name: str) -> Any:
    module_name = _LAZY_EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'detaudit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
