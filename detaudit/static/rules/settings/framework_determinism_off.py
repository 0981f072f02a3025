"""A training framework told to turn determinism off or cuDNN autotuning on (DET018 framework-determinism-off)."""

from __future__ import annotations

from detaudit.findings import Severity
from detaudit.knowledge.apis import DETERMINISM_SWITCHES, FRAMEWORK_BENCHMARK_OPTIONS, TRAINER_DEFAULTS_ARGUMENTS
from detaudit.static.analyses.determinism import trainer_default
from detaudit.static.engine.facts import CallFact, StaticValue
from detaudit.static.rule import Invalid, Rule

#: The Lightning Trainer option that turns cuDNN autotuning on (also in ``trainer_defaults``)
_LIGHTNING_BENCHMARK = FRAMEWORK_BENCHMARK_OPTIONS["lightning.pytorch.Trainer"]
#: transformers ``TrainingArguments(tf32=True)`` sets ``torch.backends.cuda.matmul.allow_tf32``
#: and ``torch.backends.cudnn.allow_tf32`` (its default, None, leaves torch's settings alone)
_TF32_OPTIONS = {name: "tf32" for name, switch in DETERMINISM_SWITCHES.items() if switch.framework == "transformers TrainingArguments"}
_TF32_EFFECT = "turns TF32 on for float32 matmuls and convolutions: results differ from float32 and between GPUs"
_BENCHMARK_EFFECT = "turns cuDNN autotuning on: algorithm choice can differ between runs"


class FrameworkDeterminismOff(Rule):
    code = "DET018"
    name = "framework-determinism-off"
    severity = Severity.WARNING
    summary = "A training framework is told to turn determinism off or cuDNN autotuning on."
    rationale = """
        Lightning `Trainer(deterministic=False)` calls
        `torch.use_deterministic_algorithms(False)` (overriding any earlier
        request) and `Trainer(benchmark=True)` turns cuDNN autotuning on;
        transformers `TrainingArguments(full_determinism=False)` skips
        `enable_full_determinism`, and its `tf32=True` turns TF32 on for
        float32 matmuls and convolutions.  These options hide in a config
        object far from the training loop, or in a dictionary unpacked into the
        call (`Trainer(**cfg)`).  (A `seed=` drawn from the clock or the OS is
        reported by entropy-seed.)
        """
    fix_hint = "Pass `deterministic=True` / `full_determinism=True` and leave `benchmark` off for runs that must reproduce."
    VALID = (
        "import torch, lightning as L\ntrainer = L.Trainer(deterministic=True, benchmark=False)\n",
        "import torch, lightning as L\ntrainer = L.Trainer(max_epochs=3)\n",
        "import torch\nfrom transformers import TrainingArguments\nargs = TrainingArguments('out', seed=42, full_determinism=True)\n",
        # the default of TrainingArguments is no full determinism: not a decision in this file
        "import torch\nfrom transformers import TrainingArguments\nargs = TrainingArguments('out', seed=42)\n",
        "import pytorch_lightning as pl\ntrainer = pl.Trainer(benchmark=False)\n",
        "from lightning.pytorch.cli import LightningCLI\nLightningCLI(trainer_defaults={'benchmark': False, 'deterministic': True})\n",
        # a parameter a caller sets: the value is not known
        "import lightning as L\ndef fit(benchmark=True):\n    L.Trainer(benchmark=benchmark)\nfit(benchmark=use_benchmark)\n",
    )
    INVALID = (
        Invalid("import torch, lightning as L\ntrainer = L.Trainer(deterministic=False, benchmark=True)\n", line=2, message="Lightning Trainer"),
        Invalid("import pytorch_lightning as pl\ntrainer = pl.Trainer(benchmark=True)\n", line=2, message="benchmark"),
        Invalid("import torch\nfrom transformers import TrainingArguments\nargs = TrainingArguments('out', full_determinism=False)\n", line=3),
        Invalid("import torch\nfrom transformers import TrainingArguments\nargs = TrainingArguments('out', bf16=True, tf32=True)\n", line=3, message="TF32"),
        # options passed as a literal dictionary
        Invalid("import lightning as L\ncfg = {'max_epochs': 3, 'benchmark': True}\ntrainer = L.Trainer(**cfg)\n", line=2, message="benchmark=True"),
        Invalid("import pytorch_lightning as pl\ntrainer = pl.Trainer(**{'deterministic': False})\n", line=2, message="deterministic=False"),
        # the Trainer LightningCLI builds gets these options unless the command line changes them
        Invalid("from lightning.pytorch.cli import LightningCLI\nLightningCLI(trainer_defaults={'benchmark': True})\n", line=2, message="benchmark=True"),
        Invalid("import torch\nfrom lightning.pytorch.cli import LightningCLI\nLightningCLI(trainer_defaults={'deterministic': False})\n", line=3),
        Invalid(
            "import lightning as L\ndef fit(benchmark=True):\n    L.Trainer(benchmark=benchmark)\nfit()\n",
            line=3,
            message="the default of parameter benchmark of fit()",
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        for request in self.analyses.determinism.requests:
            if request.turns_off and request.framework is not None:
                self.report(
                    request.value_node or request.call.node,
                    f"{request.framework}: {request.switch.argument}={request.enabled.describe()} turns deterministic algorithms off.",
                )
        for call in facts.calls:
            effect = _BENCHMARK_EFFECT
            option = FRAMEWORK_BENCHMARK_OPTIONS.get(call.qualname) if call.qualname else None
            if option is not None:
                node = call.value_node(option)
            elif call.qualname in TRAINER_DEFAULTS_ARGUMENTS:
                option = _LIGHTNING_BENCHMARK
                node = trainer_default(call, option)
            elif call.qualname in _TF32_OPTIONS:
                option, effect = _TF32_OPTIONS[call.qualname], _TF32_EFFECT
                node = call.value_node(option)
            else:
                self._report_instantiated_benchmark(call)
                continue
            value = self.analyses.values.evaluate(node, call.scope)
            if value.truthy:
                self.report(node, f"{option}={value.describe()} {effect}.")


    def _report_instantiated_benchmark(self, call: CallFact) -> None:
        """``hydra.utils.instantiate(cfg.trainer)`` whose config turns ``benchmark`` on."""
        built = self.analyses.values.instantiated(call)
        option = FRAMEWORK_BENCHMARK_OPTIONS.get(built[0]) if built is not None else None
        if option is not None and built[1].get(option, StaticValue(False)).truthy:
            value = built[1][option]
            self.report(call.node, f"{option}={value.describe()} {_BENCHMARK_EFFECT}.")
