"""Helpers users call from their own training code.

``seeding`` (seed_everything, seed_worker, make_generator), ``determinism``
(enable_determinism, deterministic), ``status`` and ``environment`` (the
determinism fingerprint shared with the dynamic pass), ``settings`` (the
backend settings table applied to the running torch: which spelling this
version has, reading and writing it).  May import ``detaudit.knowledge``.
This package file stays free of torch/numpy imports: ``import detaudit``
loads the helpers lazily.
"""

from __future__ import annotations


class DeterminismWarning(UserWarning):
    """Something about this process keeps runs from being reproducible and a
    helper cannot fix it from inside the process (e.g. PYTHONHASHSEED)."""
