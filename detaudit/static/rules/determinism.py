"""Whether a file asks for deterministic algorithms, and the ways that request goes wrong.

Every rule here reads the file's determinism state (``self.analyses.determinism``,
``detaudit.static.analyses.determinism``), the one place that decides "does
this file enable deterministic algorithms?".  What the cuBLAS variable and
Inductor's deterministic options are comes from the settings table
(``knowledge/backend_settings.json``).
"""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.apis import (
    FRAMEWORK_BENCHMARK_OPTIONS,
    TRAINER_DEFAULTS_ARGUMENTS,
    TRUTHY_ENVIRONMENT_VALUES,
)
from detaudit.knowledge.backend_settings import backend_settings
from detaudit.static.analyses.determinism import trainer_default
from detaudit.static.analyses.op_sites import decided_by_settings_here
from detaudit.static.engine.facts import CallFact, StaticValue
from detaudit.static.engine.walk import child_nodes
from detaudit.static.fixes.code import determinism_code
from detaudit.static.fixes.edits import InsertStatement, Replace, setting_comment_words, setup_position
from detaudit.static.rule import Invalid, Rule


#: ``torch.compile`` modes that pick kernels by timing them (torch 2.13
#: ``torch._inductor.list_mode_options``: max_autotune + coordinate_descent_tuning).
COMPILE_AUTOTUNE_MODES = frozenset({"max-autotune", "max-autotune-no-cudagraphs"})
INDUCTOR_CONFIG = "torch._inductor.config"
#: Inductor options that benchmark candidate kernels and keep the fastest.
INDUCTOR_AUTOTUNE_OPTIONS = frozenset(
    {"max_autotune", "max_autotune_gemm", "max_autotune_pointwise", "coordinate_descent_tuning"}
)
#: Environment variables that turn those options on ("1").
INDUCTOR_AUTOTUNE_ENVIRONMENT = frozenset(
    {"TORCHINDUCTOR_MAX_AUTOTUNE", "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM",
     "TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE", "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING"}
)

# -- what the settings table says about the switches these rules read ---------------
_SETTINGS = backend_settings()
_CUBLAS = _SETTINGS["cublas-workspace-config"]
CUBLAS_VARIABLE = _CUBLAS.environment_variables[0]
CUBLAS_WORKSPACE_CONFIG_VALUES = _CUBLAS.accepted
_CUBLAS_FIXED_IN = _CUBLAS.matters.torch.removeprefix("<")  # needed before this torch
#: Inductor options and variables that make it pick kernels without timing them.
#: The Lightning Trainer option that turns cuDNN autotuning on (also in ``trainer_defaults``)
_LIGHTNING_BENCHMARK = FRAMEWORK_BENCHMARK_OPTIONS["lightning.pytorch.Trainer"]
_INDUCTOR_DETERMINISM = (_SETTINGS["inductor-deterministic"], _SETTINGS["inductor-batch-invariant"])
INDUCTOR_DETERMINISTIC_OPTIONS = frozenset(a.rpartition(".")[2] for s in _INDUCTOR_DETERMINISM for a in s.attributes)
INDUCTOR_DETERMINISTIC_ENVIRONMENT = frozenset(v for s in _INDUCTOR_DETERMINISM for v in s.environment_variables)


def describe_call(call: CallFact) -> str:
    """A short spelling of the callee for messages: ``use_deterministic_algorithms``."""
    return (call.qualname or call.method or "call").rpartition(".")[2]


def determinism_fix(rule: Rule, before: CallFact) -> tuple[InsertStatement, ...] | None:
    """The fix style's request for deterministic algorithms (``fixes.code.determinism_code``)
    right after the file's last seeding call that runs before ``before`` (in
    the same block), else after the imports: at module level it runs once per
    process.

    Unsafe: a nondeterministic op without a deterministic implementation then
    raises, which changes what the program does."""
    code = determinism_code(rule.facts.names.bindings(), rule.context.fix_style)
    if code is None:
        return None

    def insert(anchor: cst.BaseStatement, before_anchor: bool = False) -> tuple[InsertStatement, ...]:
        return tuple(InsertStatement(anchor, line, before=before_anchor, imports=code.imports, safe=False) for line in code.lines)

    last_seeding = None  # after the last one: a block of seeding calls stays together
    for call in rule.facts.calls:
        if call.order >= before.order:
            break
        if call.scope.function not in (None, before.scope.function) or not call.scope.straight_line:
            continue
        statement = _statement_holding(rule, call)
        if statement is not None and rule.analyses.rng_effects.call_effects(call).seeds:
            last_seeding = statement
    if last_seeding is not None:
        return insert(last_seeding)
    return insert(*setup_position(rule.context.module, before.scope.top_level_index))


def _statement_holding(rule: Rule, call: CallFact) -> cst.SimpleStatementLine | None:
    """The statement that is ``call`` (``f(x)`` or ``y = f(x)``) in the block of
    its function, the module or the main guard; None when it is nested deeper."""
    if call.scope.function is not None:
        function = rule.facts.functions.get(call.scope.function)
        blocks = [function.body.body] if function is not None and isinstance(function.body, cst.IndentedBlock) else []
    else:
        module = rule.context.module
        top = module.body[call.scope.top_level_index] if call.scope.top_level_index < len(module.body) else None
        blocks = [[top]] if top is not None else []
        if isinstance(top, cst.If) and isinstance(top.body, cst.IndentedBlock):
            blocks.append(top.body.body)  # the main guard
    for block in blocks:
        for statement in block:
            if isinstance(statement, cst.SimpleStatementLine) and any(
                getattr(small, "value", None) is call.node for small in statement.body
            ):
                return statement
    return None


# -- rules -----------------------------------------------------------------------


class DeterminismNotRequested(Rule):
    code = "DET015"
    name = "determinism-not-requested"
    severity = Severity.INFO
    summary = "A training script never enables deterministic algorithms."
    rationale = """
        By default PyTorch runs CUDA kernels that are nondeterministic (atomicAdd
        scatter/index ops, pooling and upsampling backward, cuDNN algorithm
        choice) and never says so.  `torch.use_deterministic_algorithms(True)`
        swaps in deterministic kernels where they exist and raises where they do
        not, so every nondeterministic op becomes visible.  Leaving it off is a
        legitimate choice (it costs speed), so this is informational: it tells
        you that two runs with the same seed may still differ.  cuDNN's choice
        of convolution algorithm is named here (with the file's convolutions),
        once, not at every `Conv2d`: one setting decides it for the process.
        """
    fix_hint = (
        "Call `torch.use_deterministic_algorithms(True)` at start-up (or Lightning `Trainer(deterministic=True)`, "
        "transformers `enable_full_determinism(seed)`, `detaudit.enable_determinism()`)."
    )
    VALID = (
        "import torch\ntorch.use_deterministic_algorithms(True)\nmodel = torch.nn.Linear(2, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        # cuDNN's switch is a request too
        "import torch\ntorch.backends.cudnn.deterministic = True\nopt = torch.optim.Adam([])\n",
        # a framework helper asks for it
        "import lightning as L\nimport torch\n\nclass M(L.LightningModule):\n    def configure_optimizers(self):\n"
        "        return torch.optim.Adam(self.parameters())\n\nif __name__ == '__main__':\n"
        "    L.Trainer(deterministic=True).fit(M())\n",
        "from transformers import enable_full_determinism\nimport torch\nenable_full_determinism(0)\nloss = torch.ones(1, requires_grad=True).sum()\nloss.backward()\n",
        # a project helper named for it: its body is another file's business
        "import torch\nfrom utils import setup\nsetup(seed=0, deterministic=True)\nopt = torch.optim.SGD([], lr=0.1)\n",
        # a library module: no main guard, training code only inside functions
        "import torch\n\ndef train(model):\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    model(1).sum().backward()\n",
        # set_seed asked for deterministic kernels
        "from transformers import set_seed\nimport torch\nset_seed(0, deterministic=True)\nopt = torch.optim.AdamW([], lr=0.1)\n",
        # turned off on purpose is deterministic-off's business, not this rule's
        "import torch\ntorch.use_deterministic_algorithms(False)\nopt = torch.optim.SGD([], lr=0.1)\n",
    )
    INVALID = (
        Invalid(
            "import torch\nmodel = torch.nn.Linear(2, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
            line=3,
            message="never enables deterministic algorithms",
        ),
        # cuDNN's switch only under an option that is off by default
        Invalid(
            "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--seed', type=int, default=None)\n"
            "args = p.parse_args()\nif args.seed is not None:\n    torch.manual_seed(args.seed)\n"
            "    torch.backends.cudnn.deterministic = True\nopt = torch.optim.SGD([], lr=0.1)\n",
            line=8,
            message="only when `args.seed is not None` is True",
        ),
        # transformers' set_seed seeds, but leaves deterministic=False
        Invalid(
            "from transformers import set_seed\nimport torch\nset_seed(0)\nopt = torch.optim.AdamW([], lr=0.1)\n",
            line=4,
            message="never enables deterministic algorithms",
        ),
        Invalid(
            "import torch\n\ndef main():\n    x = torch.ones(2, requires_grad=True)\n    (x * 2).sum().backward()\n\n"
            "if __name__ == '__main__':\n    main()\n",
            line=5,
        ),
        Invalid("import pytorch_lightning as pl\n\nif __name__ == '__main__':\n    pl.Trainer(max_epochs=1).fit(model)\n", line=4),
        Invalid(
            "import torch\nnet = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ConvTranspose2d(8, 3, 3))\n"
            "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n",
            line=3,
            message="2 call sites of torch.nn.Conv2d and torch.nn.ConvTranspose2d",
        ),
    )

    def finish(self) -> None:
        evidence = self.analyses.training
        if evidence is None or self.analyses.determinism.addressed:
            return
        convolutions = decided_by_settings_here(self.analyses.op_sites)
        optional = self.analyses.determinism.off_by_default
        only_when = ""
        if optional:
            condition, value = optional[0]
            test = " ".join(self.context.module.code_for_node(condition.test).split())
            default = f" (with the default of --{value.flag} it is {bool(value.value)})" if value.flag else ""
            only_when = f" by default: only when `{test}` is {not value.value}{default} does it ask for them, and"
        self.report(
            evidence.node,
            f"training script never enables deterministic algorithms{only_when or ':'} nondeterministic kernels "
            "(atomicAdd scatter/index ops, pooling/upsampling backward, cuDNN algorithm choice for every convolution"
            f"{': ' + convolutions if convolutions else ''}) run silently.",
            fix=determinism_fix(self, evidence),
        )


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
        `enable_full_determinism`.  These options hide in a config object far
        from the training loop.  (A `seed=` drawn from the clock or the OS is
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
            option = FRAMEWORK_BENCHMARK_OPTIONS.get(call.qualname) if call.qualname else None
            if option is not None:
                node = call.value_node(option)
            elif call.qualname in TRAINER_DEFAULTS_ARGUMENTS:
                option = _LIGHTNING_BENCHMARK
                node = trainer_default(call, option)
            else:
                self._report_instantiated_benchmark(call)
                continue
            value = self.analyses.values.evaluate(node, call.scope)
            if value.truthy:
                self.report(
                    node,
                    f"{option}={value.describe()} turns cuDNN autotuning on: algorithm choice can differ between runs.",
                )


    def _report_instantiated_benchmark(self, call: CallFact) -> None:
        """``hydra.utils.instantiate(cfg.trainer)`` whose config turns ``benchmark`` on."""
        built = self.analyses.values.instantiated(call)
        option = FRAMEWORK_BENCHMARK_OPTIONS.get(built[0]) if built is not None else None
        if option is not None and built[1].get(option, StaticValue(False)).truthy:
            value = built[1][option]
            self.report(call.node, f"{option}={value.describe()} turns cuDNN autotuning on: algorithm choice can differ between runs.")


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
