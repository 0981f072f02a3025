"""Assignments to ``torch.backends`` attributes that do not exist: silent no-ops (DET012 unknown-backend-flag)."""

from __future__ import annotations

import difflib

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.backend_settings import backend_settings
from detaudit.static.engine.facts import SettingWrite
from detaudit.static.fixes.edits import Replace
from detaudit.static.rule import Invalid, Rule

_ROOT = "torch.backends"
#: namespace -> every attribute it has (the settings table's namespaces)
_ATTRIBUTES = {name: namespace.attributes for name, namespace in backend_settings().namespaces.items()}


def unknown_backend_attribute(target: str) -> tuple[str, str] | None:
    """(namespace, attribute) for the first component of ``target`` that its
    ``torch.backends`` namespace lacks; None when every component is known or
    the namespace is one the knowledge base does not list (no guessing)."""
    if not target.startswith(_ROOT + "."):
        return None
    parts = target.split(".")
    for depth in range(2, len(parts)):
        namespace, attribute = ".".join(parts[:depth]), parts[depth]
        known = _ATTRIBUTES.get(namespace)
        if known is None or attribute.startswith("_"):
            return None  # unlisted namespace, or deliberate monkeypatching of a private name
        if attribute not in known:
            return namespace, attribute
    return None


def suggestion(namespace: str, attribute: str) -> str | None:
    """The setting the author most likely meant: the same name one namespace
    down (``cuda.allow_tf32`` -> ``cuda.matmul.allow_tf32``), else the closest name."""
    nested = sorted(n for n, names in _ATTRIBUTES.items() if n.startswith(namespace + ".") and attribute in names)
    if nested:
        return f"{nested[0]}.{attribute}"
    close = difflib.get_close_matches(attribute, _ATTRIBUTES[namespace], n=1, cutoff=0.75)
    return close[0] if close else None


class UnknownBackendFlag(Rule):
    code = "DET012"
    name = "unknown-backend-flag"
    severity = Severity.WARNING
    summary = "Assignment to a `torch.backends` attribute that does not exist (a silent no-op)."
    rationale = """
        `torch.backends.cudnn.benchmarks = False` or `cudnn.determinstic = True`
        raise no error: Python just creates a new attribute that nothing reads,
        and the setting the author believes protects the run stays at its
        default.  The same happens with settings put on the wrong namespace,
        such as `torch.backends.cuda.allow_tf32` (the real one is
        `torch.backends.cuda.matmul.allow_tf32`).  Such typos are found in real
        training code.
        """
    fix_hint = "Use the real attribute name (the message suggests the closest one)."
    VALID = (
        "import torch\ntorch.backends.cudnn.benchmark = False\ntorch.backends.cudnn.deterministic = True\n",
        "import torch\ntorch.backends.cuda.matmul.allow_tf32 = False\n",
        "from torch.backends import cudnn\ncudnn.enabled = True\n",
        # reading is not setting, and private names are deliberate monkeypatching
        "import torch\nprint(torch.backends.cudnn.benchmarks)\ntorch.backends.cudnn._flags_backup = None\n",
        # a namespace the knowledge base does not list is not guessed at
        "import torch\ntorch.backends.mps.some_future_flag = True\n",
    )
    INVALID = (
        Invalid(
            "import torch\ntorch.backends.cudnn.benchmarks = False\n",
            line=2,
            message="did you mean `benchmark`",
            fixed="import torch\ntorch.backends.cudnn.benchmark = False\n",
        ),
        Invalid("from torch.backends import cudnn\ncudnn.determinstic = True\n", line=2, message="`deterministic`"),
        Invalid("import torch\ntorch.backends.cuda.allow_tf32 = False\n", line=2, message="torch.backends.cuda.matmul.allow_tf32"),
        Invalid("import torch\nsetattr(torch.backends.cudnn, 'fastest', True)\n", line=2),
        Invalid("import torch\ntorch.backends.cudnnn.benchmark = False\n", line=2, message="`cudnn`"),
    )

    def finish(self) -> None:
        for write in self.facts.settings:
            unknown = unknown_backend_attribute(write.target)
            if unknown is None:
                continue
            namespace, attribute = unknown
            meant = suggestion(namespace, attribute)
            hint = f" (did you mean `{meant}`?)" if meant else ""
            self.report(
                write.node,
                f"`{namespace}` has no attribute `{attribute}`: this assignment does nothing{hint}.",
                fix=self._rename(write, namespace, attribute, meant),
            )

    @staticmethod
    def _rename(write: SettingWrite, namespace: str, attribute: str, meant: str | None) -> Replace | None:
        """Rename a misspelt last attribute: the assignment then does what its author meant."""
        target = write.target_node
        if meant is None or "." in meant or not isinstance(target, cst.Attribute) or write.target != f"{namespace}.{attribute}":
            return None
        return Replace(target.attr, cst.Name(meant))
