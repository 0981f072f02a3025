"""Project helpers: read where the project index can, else taken at their word.

A call of a project-local helper (``set_seed(0)``, ``make_deterministic()``,
``setup(seed, deterministic=True)``) hides its body in another file, or in a
package the linter does not read.  When the project index finds the function,
its calls are read (``helper_calls``: what it switches on, what it calls
``set_epoch`` on); else, when its name says what it does, rules trust it rather
than demand what it probably already does.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from detaudit.static.engine.facts import CallFact, FileFacts

if TYPE_CHECKING:
    from detaudit.static.context import FileContext

#: Top-level modules whose functions are library APIs, never project helpers
#: (a helper named ``set_seed`` from one of these is matched by its real name).
WELL_KNOWN_LIBRARIES = frozenset(
    {"random", "numpy", "torch", "tensorflow", "keras", "tf_keras", "jax", "flax", "optax",
     "lightning", "pytorch_lightning", "transformers", "accelerate", "sklearn"}
)


def project_helper_named(call: CallFact, word: str) -> bool:
    """A call of a project-local helper whose name contains ``word`` (``set_seed``,
    ``make_deterministic``): its body is out of sight, so it is taken at its word.
    Library functions are matched by their real names instead."""
    root = (call.qualname or "").split(".", 1)[0]
    callee = call.method or (call.qualname or "").rpartition(".")[2]
    return root not in WELL_KNOWN_LIBRARIES and word in callee.lower()


def helper_calls(context: "FileContext", call: CallFact, mentions: Iterable[str]) -> tuple[FileFacts, list[CallFact]] | None:
    """The facts of the project module whose function ``call`` calls, and the calls
    in that function's body (None when the callee is not a function of another
    project module, or the module's text mentions none of ``mentions``: most
    modules a script imports are never parsed for this).  The module becomes a
    dependency of the checked file's result."""
    qualname = call.qualname
    root = (qualname or "").lstrip(".").split(".", 1)[0]
    if qualname is None or root in WELL_KNOWN_LIBRARIES or root in sys.stdlib_module_names:
        return None
    located = context.project.module_of(qualname, context.path)
    if located is None:
        return None
    path, function = located
    digest = context.project.digest(path)
    if digest is None or not _mentions(path, digest, tuple(mentions)):
        return None
    summary = context.project.summary(path)
    if summary is None or function not in summary.facts.functions:
        return None
    context.dependencies[str(path)] = context.project.digest(path) or ""
    return summary.facts, summary.calls_of(function)


@lru_cache(maxsize=1024)
def _mentions(path: Path, digest: str, words: tuple[str, ...]) -> bool:
    """Whether the module's text holds one of ``words`` (``digest`` keys it to the content)."""
    try:
        text = path.read_bytes()
    except OSError:
        return False
    return any(word.encode() in text for word in words)
