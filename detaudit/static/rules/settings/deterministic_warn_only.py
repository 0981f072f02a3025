"""Deterministic algorithms that only warn, so nondeterministic ops still run (DET014 deterministic-warn-only)."""

from __future__ import annotations

from detaudit.findings import Severity
from detaudit.static.rule import Invalid, Rule
from detaudit.static.rules.settings._common import describe_call


class DeterministicWarnOnly(Rule):
    code = "DET014"
    name = "deterministic-warn-only"
    severity = Severity.WARNING
    summary = "Deterministic algorithms only warn: nondeterministic ops still run."
    rationale = """
        `use_deterministic_algorithms(True, warn_only=True)` (also
        `set_deterministic_debug_mode("warn")`, Lightning `Trainer(deterministic="warn")`,
        `enable_full_determinism(seed, warn_only=True)`) swaps in the
        deterministic kernels that exist but lets ops without one run their
        nondeterministic kernel with a warning that is easy to miss in a log.
        The run looks deterministic and is not.
        """
    fix_hint = "Drop `warn_only=True` so a nondeterministic op raises, then replace that op or accept it knowingly."
    VALID = (
        "import torch\ntorch.use_deterministic_algorithms(True)\n",
        "import torch\ntorch.use_deterministic_algorithms(True, warn_only=False)\n",
        # warn_only while turning it off is deterministic-off's business
        "import torch\ntorch.use_deterministic_algorithms(False, warn_only=True)\n",
        "import torch\nimport lightning as L\ntrainer = L.Trainer(deterministic=True)\n",
    )
    INVALID = (
        Invalid("import torch\ntorch.use_deterministic_algorithms(True, warn_only=True)\n", line=2, message="only warn"),
        Invalid("import torch\ntorch.set_deterministic_debug_mode('warn')\n", line=2),
        Invalid("import torch\ntorch.set_deterministic_debug_mode(1)\n", line=2),
        Invalid("import pytorch_lightning as pl\ntrainer = pl.Trainer(deterministic='warn')\n", line=2),
        Invalid("import torch\nfrom transformers import enable_full_determinism\nenable_full_determinism(42, warn_only=True)\n", line=3),
    )

    def finish(self) -> None:
        for request in self.analyses.determinism.requests:
            if request.turns_on and request.warn_only.truthy:
                who = request.framework or describe_call(request.call)
                self.report(
                    request.call.node,
                    f"{who} makes nondeterministic ops only warn: ops without a "
                    "deterministic kernel still run nondeterministically.",
                )
