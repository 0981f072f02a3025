"""Deterministic algorithms requested without ``CUBLAS_WORKSPACE_CONFIG`` set in code (DET016 cublas-workspace-config).

The variable, the values torch accepts and the torch that no longer needs it come
from the settings table (``knowledge/backend_settings.json``).
"""

from __future__ import annotations

from detaudit.findings import Severity
from detaudit.knowledge.backend_settings import backend_settings
from detaudit.static.rule import Invalid, Rule

_SETTINGS = backend_settings()
_CUBLAS = _SETTINGS["cublas-workspace-config"]
CUBLAS_VARIABLE = _CUBLAS.environment_variables[0]
CUBLAS_WORKSPACE_CONFIG_VALUES = _CUBLAS.accepted
_CUBLAS_FIXED_IN = _CUBLAS.matters.torch.removeprefix("<")  # needed before this torch


class CublasWorkspaceConfig(Rule):
    code = "DET016"
    name = "cublas-workspace-config"
    severity = Severity.INFO
    summary = f"Deterministic algorithms requested without `{CUBLAS_VARIABLE}` set in code (needed on CUDA before torch {_CUBLAS_FIXED_IN})."
    rationale = f"""
        On CUDA, torch before {_CUBLAS_FIXED_IN} refuses to run cuBLAS matmuls under
        `use_deterministic_algorithms(True)` unless the environment variable
        `{CUBLAS_VARIABLE}` is `:4096:8` or `:16:8` when the first matmul runs
        (`RuntimeError: ... you have CUDA >= 10.2 ...`).  pytorch/pytorch PR
        #161749 (torch {_CUBLAS_FIXED_IN}) dropped the check because per-stream
        cuBLAS workspaces are already deterministic.  The linter cannot know
        which torch runs the file, nor whether the variable is set in the
        shell, so this is informational: it matters only for older torch.
        Lightning `Trainer(deterministic=True)`, transformers
        `enable_full_determinism` and `detaudit.enable_determinism` set it
        themselves and are not reported.
        """
    fix_hint = f'Set `os.environ.setdefault("{CUBLAS_VARIABLE}", ":4096:8")` before the first CUDA matmul (or export it in the launcher).'
    VALID = (
        f"import os, torch\nos.environ['{CUBLAS_VARIABLE}'] = ':4096:8'\ntorch.use_deterministic_algorithms(True)\n",
        f"import os, torch\nos.environ.setdefault('{CUBLAS_VARIABLE}', ':16:8')\ntorch.use_deterministic_algorithms(True)\n",
        "import torch\nimport lightning as L\ntrainer = L.Trainer(deterministic=True)\n",
        "import torch\ntorch.use_deterministic_algorithms(False)\n",
        # a library helper that switches the mode temporarily: the caller's environment decides
        "import torch\n\ndef topk_deterministic(x, k):\n    torch.use_deterministic_algorithms(True)\n    return torch.topk(x, k)\n",
    )
    INVALID = (
        Invalid("import torch\ntorch.use_deterministic_algorithms(True)\n", line=2, message=f"torch < {_CUBLAS_FIXED_IN}"),
        Invalid(
            "import torch\n\ndef main():\n    torch.use_deterministic_algorithms(True)\n\nif __name__ == '__main__':\n    main()\n",
            line=4,
        ),
        Invalid("import torch\nfrom transformers import set_seed\nset_seed(0, deterministic=True)\n", line=3),
        Invalid(
            f"import os, torch\nos.environ['{CUBLAS_VARIABLE}'] = ':0:0'\ntorch.use_deterministic_algorithms(True)\n",
            line=2,
            message="not a value",
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        requests = [r for r in self.analyses.determinism.requests if r.turns_on]
        if any(r.sets_cublas_workspace for r in requests):
            return
        # a library function that switches the mode for its caller runs under the caller's environment
        requests = [r for r in requests if self.analyses.script.reaches(r.call)]
        if not requests:
            return
        writes = list(facts.environment_writes(CUBLAS_VARIABLE))
        for write in writes:
            value = facts.evaluate(write.value)
            if value.known and value.value not in CUBLAS_WORKSPACE_CONFIG_VALUES:
                accepted = " or ".join(CUBLAS_WORKSPACE_CONFIG_VALUES)
                self.report(write.node, f"{CUBLAS_VARIABLE}={value.describe()} is not a value torch accepts ({accepted}).")
        if writes:
            return
        self.report(
            requests[0].call.node,
            f"deterministic algorithms requested but {CUBLAS_VARIABLE} is not set in code: on CUDA, torch < "
            f"{_CUBLAS_FIXED_IN} raises RuntimeError at the first cuBLAS matmul unless it is "
            f"{CUBLAS_WORKSPACE_CONFIG_VALUES[0]} (torch >= {_CUBLAS_FIXED_IN} no longer needs it).",
        )
