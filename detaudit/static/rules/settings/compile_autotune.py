"""``torch.compile`` and Inductor autotuning, which picks kernels by timing them (DET017 compile-autotune).

Inductor's deterministic options and variables come from the settings table
(``knowledge/backend_settings.json``).
"""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.apis import INDUCTOR_AUTOTUNE_OPTIONS, TRUTHY_ENVIRONMENT_VALUES
from detaudit.knowledge.backend_settings import backend_settings
from detaudit.static.engine.facts import CallFact
from detaudit.static.rule import Invalid, Rule

#: ``torch.compile`` modes that pick kernels by timing them (torch 2.13
#: ``torch._inductor.list_mode_options``: max_autotune + coordinate_descent_tuning).
COMPILE_AUTOTUNE_MODES = frozenset({"max-autotune", "max-autotune-no-cudagraphs"})
INDUCTOR_CONFIG = "torch._inductor.config"
#: Environment variables that turn the autotuning options on ("1").
INDUCTOR_AUTOTUNE_ENVIRONMENT = frozenset(
    {"TORCHINDUCTOR_MAX_AUTOTUNE", "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM",
     "TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE", "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING"}
)

_SETTINGS = backend_settings()
#: Inductor options and variables that make it pick kernels without timing them.
_INDUCTOR_DETERMINISM = (_SETTINGS["inductor-deterministic"], _SETTINGS["inductor-batch-invariant"])
INDUCTOR_DETERMINISTIC_OPTIONS = frozenset(a.rpartition(".")[2] for s in _INDUCTOR_DETERMINISM for a in s.attributes)
INDUCTOR_DETERMINISTIC_ENVIRONMENT = frozenset(v for s in _INDUCTOR_DETERMINISM for v in s.environment_variables)


class CompileAutotune(Rule):
    code = "DET017"
    name = "compile-autotune"
    severity = Severity.WARNING
    summary = "torch.compile autotuning picks kernels by timing them."
    rationale = """
        `torch.compile(mode="max-autotune")` (and `"max-autotune-no-cudagraphs"`,
        or the Inductor options `max_autotune`, `max_autotune_gemm`,
        `max_autotune_pointwise`, `coordinate_descent_tuning`) benchmarks
        candidate kernels and keeps the fastest.  Timings are noisy, so two
        processes can keep different kernels (tile sizes, split-K) that round
        differently, and the choice also depends on the autotune cache.
        Inductor's deterministic mode picks without timing; it is on when the
        file sets `torch._inductor.config.deterministic = True` or calls
        `torch.use_deterministic_algorithms(True)` (torch 2.13 ties the two),
        and then this is not reported.
        """
    fix_hint = 'Use the default mode (or "reduce-overhead") for runs that must reproduce, or turn on `torch._inductor.config.deterministic`.'
    VALID = (
        "import torch\nmodel = torch.compile(model)\n",
        "import torch\nmodel = torch.compile(model, mode='reduce-overhead')\n",
        "import torch\ntorch.use_deterministic_algorithms(True)\nmodel = torch.compile(model, mode='max-autotune')\n",
        "import torch\nimport torch._inductor.config as inductor_config\ninductor_config.deterministic = True\n"
        "model = torch.compile(model, mode='max-autotune')\n",
        "import torch\nmodel = torch.compile(model, options={'max_autotune': False})\n",
        "import re\npattern = re.compile('x', re.I)\n",
    )
    INVALID = (
        Invalid("import torch\nmodel = torch.compile(model, mode='max-autotune')\n", line=2, message="max-autotune"),
        Invalid("import torch\n\n@torch.compile(mode='max-autotune-no-cudagraphs')\ndef f(x):\n    return x\n", line=3),
        Invalid("import torch\nmodel.compile(mode='max-autotune')\n", line=2),
        Invalid("import torch\nmodel = torch.compile(model, options={'max_autotune': True})\n", line=2),
        Invalid("import torch._inductor.config as config\nconfig.coordinate_descent_tuning = True\n", line=2),
        Invalid("from torch._inductor import config\nwith config.patch(max_autotune_gemm=True):\n    pass\n", line=2),
        Invalid("import os\nimport torch\nos.environ['TORCHINDUCTOR_MAX_AUTOTUNE'] = '1'\n", line=3),
    )

    def finish(self) -> None:
        facts = self.facts
        if self._deterministic_inductor():
            return
        for call in facts.calls:
            if call.qualname == "torch.compile" or (call.method == "compile" and call.qualname is None and facts.imports_module("torch")):
                mode = facts.evaluate(call.value_node("mode"))
                if mode.is_(*COMPILE_AUTOTUNE_MODES):
                    self.report(call.node, f"torch.compile(mode={mode.describe()}) picks kernels by timing them: the choice can differ between runs.")
                self._report_options(call.value_node("options"), call.node)
            elif call.qualname == f"{INDUCTOR_CONFIG}.patch":
                self._report_patch(call)
        for write in facts.settings:
            namespace, _, option = write.target.rpartition(".")
            if namespace == INDUCTOR_CONFIG and option in INDUCTOR_AUTOTUNE_OPTIONS and facts.evaluate(write.value).truthy:
                self.report(write.node, f"Inductor autotuning turned on ({option}): kernels are picked by timing them.")
        for write in facts.environment:
            if write.name in INDUCTOR_AUTOTUNE_ENVIRONMENT and facts.evaluate(write.value).is_("1"):
                self.report(write.node, f"Inductor autotuning turned on ({write.name}=1): kernels are picked by timing them.")

    def _deterministic_inductor(self) -> bool:
        facts = self.facts
        if self.analyses.determinism.enabled:
            return True
        if any(
            write.target.rpartition(".")[2] in INDUCTOR_DETERMINISTIC_OPTIONS and facts.evaluate(write.value).truthy
            for write in facts.settings
            if write.target.startswith(INDUCTOR_CONFIG + ".")
        ):
            return True
        return any(
            write.name in INDUCTOR_DETERMINISTIC_ENVIRONMENT and facts.evaluate(write.value).value in TRUTHY_ENVIRONMENT_VALUES
            for write in facts.environment
        )

    def _report_options(self, options: cst.BaseExpression | None, where: cst.CSTNode) -> None:
        if not isinstance(options, cst.Dict):
            return
        for element in options.elements:
            if isinstance(element, cst.DictElement):
                key = self.facts.evaluate(element.key)
                if key.value in INDUCTOR_AUTOTUNE_OPTIONS and self.facts.evaluate(element.value).truthy:
                    self.report(where, f"torch.compile option {key.value}=True picks kernels by timing them.")

    def _report_patch(self, call: CallFact) -> None:
        for arg in call.node.args:
            if arg.keyword is not None and arg.keyword.value in INDUCTOR_AUTOTUNE_OPTIONS and self.facts.evaluate(arg.value).truthy:
                self.report(call.node, f"Inductor autotuning turned on ({arg.keyword.value}=True): kernels are picked by timing them.")
        self._report_options(call.value_node(position=0), call.node)
