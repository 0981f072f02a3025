"""Test-only fault injection: one op call of one repeat gives different bits.

Real CPU nondeterminism reaches only a few kinds of op.  To prove that
``detaudit run`` localizes a difference wherever it arises (a forward or
backward op, an in-place op, an op on a view, a custom autograd Function, a
module hook, the optimizer step, checkpoint recomputation, autocast...), the
test suite makes one op call of one repeat change its output by one ULP, as a
racy kernel would, and checks what the report says.

Never set this in a real audit.  ``DETAUDIT_TEST_FAULT`` holds a JSON object:

``{"repeat": 1, "op": "aten.addmm.default", "path": "train.py", "line": 17,
"phase": "backward", "occurrence": 0, "output": 0, "element": 0}``

or a list of such objects, each for its own repeat: ``detaudit run --repeats
K+1`` with K faults in repeats 1..K compares each with the unperturbed run 0,
so one audit proves K localization paths (K causes, each seen in one pair).

* ``repeat``: which repeat of ``detaudit run`` is perturbed (0-based; default
  1, the second run).  Its capture rerun is perturbed alike.
* ``op``, ``path``, ``line``, ``phase`` select the op calls, as the report
  names them: the overload (``aten.addmm.default``) or the packet
  (``aten.addmm``), the source file (a suffix of its path), the line and the
  phase.  Each is optional; at least one must be given.
* ``occurrence``: which of the matching calls (0-based, over the whole run).
* ``output``: which tensor output (default: the first non-empty one);
  ``element``: the flat (row-major) index of the element (default 0).

The element moves to the next representable value toward +inf (floats; the
real part of a complex), up by one (integers, wrapping) or flips (bool).

This module reads the spec (the parent process reads it too: no torch);
``feature.py`` carries it to the child, where ``injector.py`` applies it.
"""

from __future__ import annotations

import json
import os

FAULT_ENV = "DETAUDIT_TEST_FAULT"
_SELECTORS = ("op", "path", "line", "phase")
_KEYS = frozenset({"repeat", "occurrence", "output", "element", *_SELECTORS})


class FaultSpecError(ValueError):
    """DETAUDIT_TEST_FAULT does not say which op to perturb."""


def parse_specs(text: str) -> list[dict]:
    """The fault specs from their JSON text (an object or a list of objects,
    at most one per repeat), with defaults filled in."""
    try:
        document = json.loads(text)
    except ValueError as error:
        raise FaultSpecError(f"{FAULT_ENV} is not JSON: {error}") from None
    specs = [_checked(spec) for spec in (document if isinstance(document, list) else [document])]
    repeats = [spec["repeat"] for spec in specs]
    twice = sorted({repeat for repeat in repeats if repeats.count(repeat) > 1})
    if twice:
        raise FaultSpecError(f"{FAULT_ENV}: more than one fault for repeat {twice[0]} (one fault per repeat)")
    return specs


def _checked(spec) -> dict:
    if not isinstance(spec, dict):
        raise FaultSpecError(f"{FAULT_ENV} must be a JSON object or a list of objects")
    unknown = sorted(set(spec) - _KEYS)
    if unknown:
        raise FaultSpecError(f"{FAULT_ENV}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})")
    if not any(key in spec for key in _SELECTORS):
        raise FaultSpecError(f"{FAULT_ENV} must select the op by at least one of {', '.join(_SELECTORS)}")
    return {"repeat": 1, "occurrence": 0, "output": None, "element": 0, **spec}


def fault_for_repeat(repeat: int) -> dict | None:
    """The fault that repeat ``repeat`` (0-based) of ``detaudit run`` injects,
    from ``DETAUDIT_TEST_FAULT``; None for the other repeats and when unset."""
    text = os.environ.get(FAULT_ENV)
    if not text:
        return None
    return next((spec for spec in parse_specs(text) if spec["repeat"] == repeat), None)
