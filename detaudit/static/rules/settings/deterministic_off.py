"""Deterministic algorithms explicitly turned off (DET013 deterministic-off)."""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.static.engine.facts import CallFact
from detaudit.static.engine.walk import child_nodes
from detaudit.static.fixes.edits import Replace, setting_comment_words
from detaudit.static.rule import Invalid, Rule
from detaudit.static.rules.settings._common import describe_call


class DeterministicOff(Rule):
    code = "DET013"
    name = "deterministic-off"
    severity = Severity.WARNING
    summary = "Deterministic algorithms are explicitly turned off."
    rationale = """
        `torch.use_deterministic_algorithms(False)`, `set_deterministic_debug_mode("default")`
        and `torch.backends.cudnn.deterministic = False` turn off the one switch
        that makes nondeterministic kernels deterministic or loud.  Turning it
        off "just for this op" makes the whole run nondeterministic again, and a
        command-line flag that defaults to off means the runs people actually
        launch are nondeterministic.  (`cudnn.deterministic = False` next to
        `use_deterministic_algorithms(True)` is harmless and not reported: the
        latter already forces deterministic cuDNN convolutions.)
        """
    fix_hint = "Turn it on (`torch.use_deterministic_algorithms(True)`, `cudnn.deterministic = True`), or make the flag default to on."
    VALID = (
        "import torch\ntorch.use_deterministic_algorithms(True)\n",
        "import torch\ntorch.backends.cudnn.deterministic = True\n",
        # restoring a saved state is not a decision
        "import torch\nwas = torch.are_deterministic_algorithms_enabled()\ntorch.use_deterministic_algorithms(was)\n",
        # cuDNN's own switch is moot once deterministic algorithms are on
        "import torch\ntorch.use_deterministic_algorithms(True)\ntorch.backends.cudnn.deterministic = False\n",
        # a flag that defaults to on
        "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--no-det', dest='det', action='store_false')\n"
        "torch.use_deterministic_algorithms(p.parse_args().det)\n",
        "import torch\ntorch.set_deterministic_debug_mode('error')\n",
        # putting the default back after a guarded block
        "import torch\ntry:\n    torch.use_deterministic_algorithms(True)\n    check()\nfinally:\n    torch.use_deterministic_algorithms(False)\n",
        # None in flags() keeps the current setting
        "import torch\nwith torch.backends.cudnn.flags(enabled=None, benchmark=None, deterministic=None, allow_tf32=False):\n    pass\n",
    )
    INVALID = (
        Invalid("import torch\ntorch.use_deterministic_algorithms(False)\n", line=2, message="turned off"),
        Invalid(
            "import torch\ntorch.backends.cudnn.deterministic = False\n",
            line=2,
            fixed="import torch\ntorch.backends.cudnn.deterministic = True\n",
        ),
        Invalid("import torch\ntorch.set_deterministic_debug_mode('default')\n", line=2),
        Invalid(
            "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--deterministic', action='store_true')\n"
            "args = p.parse_args()\ntorch.use_deterministic_algorithms(args.deterministic)\n",
            line=5,
            message="default of --deterministic",
        ),
        Invalid("from torch.backends import cudnn\nwith cudnn.flags(enabled=True, benchmark=False, deterministic=False):\n    pass\n", line=2),
    )

    def finish(self) -> None:
        state = self.analyses.determinism
        for request in state.requests:
            if request.turns_off and request.framework is None and not _restores_in_finally(request.call):
                self.report(
                    request.call.node,
                    f"deterministic algorithms turned off: {describe_call(request.call)} receives {request.enabled.describe()}.",
                )
        if state.enabled:
            return
        for write in state.library_settings:
            value = self.analyses.values.evaluate(write.value, write.scope)
            if value.is_(False, 0):  # None (as in ``cudnn.flags(deterministic=None)``) keeps the setting
                fix = None
                if write.value is not None:
                    stale = setting_comment_words(write.target, value.describe())
                    fix = Replace(write.value, cst.Name("True"), safe=not value.from_default, stale_comment=stale)
                self.report(write.node, f"deterministic kernels turned off: {write.target} = {value.describe()}.", fix=fix)


def _restores_in_finally(call: CallFact) -> bool:
    """``try: ...deterministic check... finally: use_deterministic_algorithms(False)``
    puts the default back after a guarded block; it turns nothing off for the run."""
    for condition in call.scope.conditions:
        if isinstance(condition, cst.Try) and condition.finalbody is not None:
            stack: list[cst.CSTNode] = [condition.finalbody]
            while stack:
                node = stack.pop()
                if node is call.node:
                    return True
                stack.extend(child_nodes(node))
    return False
