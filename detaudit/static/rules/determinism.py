"""Whether a file asks for deterministic algorithms, and the ways that request goes wrong.

``determinism_state(facts)`` is the one place that decides "does this file
enable deterministic algorithms?"; the rules here, compile-autotune and
nondeterministic-op all read it.  Which calls switch determinism, with which
arguments, is data in ``detaudit.knowledge.apis.DETERMINISM_SWITCHES`` and (for
torch's own switches) in the settings table, ``knowledge/backend_settings.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.apis import (
    COMPILE_AUTOTUNE_MODES,
    DETERMINISM_SWITCHES,
    FRAMEWORK_BENCHMARK_OPTIONS,
    INDUCTOR_AUTOTUNE_ENVIRONMENT,
    INDUCTOR_AUTOTUNE_OPTIONS,
    INDUCTOR_CONFIG,
    TORCH_OPTIMIZER_NAMESPACE,
    TRAINER_CLASSES,
    TRUTHY_ENVIRONMENT_VALUES,
    WELL_KNOWN_LIBRARIES,
    DeterminismSwitch,
)
from detaudit.knowledge.backend_settings import backend_settings
from detaudit.static.edits import Replace, determinism_fix
from detaudit.static.facts import UNKNOWN, CallFact, FileFacts, SettingWrite, StaticValue
from detaudit.static.rule import Invalid, Rule

# -- what the settings table says about the switches these rules read ---------------
_SETTINGS = backend_settings()
_CUBLAS = _SETTINGS["cublas-workspace-config"]
CUBLAS_VARIABLE = _CUBLAS.environment_variables[0]
CUBLAS_WORKSPACE_CONFIG_VALUES = _CUBLAS.accepted
_CUBLAS_FIXED_IN = _CUBLAS.matters.torch.removeprefix("<")  # needed before this torch
#: Writes that make one library pick deterministic kernels (cudnn/mkldnn ``deterministic``).
LIBRARY_DETERMINISM_SETTINGS = frozenset(
    attribute for s in _SETTINGS.in_hazard("deterministic-kernels") for attribute in s.attributes
)
#: The debug-mode setter, and each of its modes -> (deterministic algorithms on, warn only).
_DEBUG_MODE = next(w for w in _SETTINGS["deterministic-algorithms"].writers if w.values)
_DEBUG_MODE_WARNS = dict(next(w for w in _SETTINGS["deterministic-warn-only"].writers if w.write == _DEBUG_MODE.write).values)
DETERMINISTIC_DEBUG_MODES = {mode: (on, _DEBUG_MODE_WARNS[mode]) for mode, on in _DEBUG_MODE.values}
#: Inductor options and variables that make it pick kernels without timing them.
_INDUCTOR_DETERMINISM = (_SETTINGS["inductor-deterministic"], _SETTINGS["inductor-batch-invariant"])
INDUCTOR_DETERMINISTIC_OPTIONS = frozenset(a.rpartition(".")[2] for s in _INDUCTOR_DETERMINISM for a in s.attributes)
INDUCTOR_DETERMINISTIC_ENVIRONMENT = frozenset(v for s in _INDUCTOR_DETERMINISM for v in s.environment_variables)


@dataclass(frozen=True)
class DeterminismRequest:
    """One call that switches deterministic algorithms on or off.

    ``enabled``/``warn_only`` are what the linter knows of the call's arguments
    (flag defaults included); ``explicit`` says the on/off value was passed
    rather than left at the callee's default.
    """

    call: CallFact
    switch: DeterminismSwitch | None  # None for set_deterministic_debug_mode
    enabled: StaticValue
    warn_only: StaticValue
    explicit: bool
    value_node: cst.BaseExpression | None

    @property
    def turns_on(self) -> bool:
        return self.enabled.truthy

    @property
    def turns_off(self) -> bool:
        return self.explicit and self.enabled.falsy

    @property
    def sets_cublas_workspace(self) -> bool:
        return self.switch is not None and self.switch.sets_cublas_workspace

    @property
    def framework(self) -> str | None:
        return self.switch.framework if self.switch is not None else None


@dataclass
class DeterminismState:
    """What a file says about deterministic algorithms."""

    requests: list[DeterminismRequest] = field(default_factory=list)
    #: writes of cudnn/mkldnn ``deterministic`` (one library's kernels only)
    library_settings: list[SettingWrite] = field(default_factory=list)
    #: some other call passes ``deterministic=`` or names determinism (a project helper)
    mentions_helper: bool = False

    @property
    def enabled(self) -> bool:
        """Deterministic algorithms are turned on somewhere in the file."""
        return any(r.turns_on for r in self.requests)

    @property
    def warn_only(self) -> bool:
        """Every request that turns them on only warns (nondeterministic ops still run)."""
        on = [r for r in self.requests if r.turns_on]
        return bool(on) and all(r.warn_only.truthy for r in on)

    @property
    def addressed(self) -> bool:
        """The author made a choice about determinism (on, off or through a helper)."""
        return bool(self.requests or self.library_settings or self.mentions_helper)


def determinism_state(facts: FileFacts) -> DeterminismState:
    """The file's determinism requests, computed once per file and shared by rules."""
    state = facts.derived.get("determinism")
    if state is None:
        state = facts.derived["determinism"] = _collect_state(facts)
    return state


def _collect_state(facts: FileFacts) -> DeterminismState:
    state = DeterminismState(library_settings=list(facts.settings_of(*LIBRARY_DETERMINISM_SETTINGS)))
    for call in facts.calls:
        switch = DETERMINISM_SWITCHES.get(call.qualname) if call.qualname else None
        if switch is not None:
            request = _switch_request(facts, call, switch)
            if request is not None:
                state.requests.append(request)
        elif call.qualname == _DEBUG_MODE.write:
            state.requests.append(_debug_mode_request(facts, call))
        elif _names_determinism(call):
            state.mentions_helper = True
    return state


def _switch_request(facts: FileFacts, call: CallFact, switch: DeterminismSwitch) -> DeterminismRequest | None:
    if switch.argument is None:
        enabled, explicit, node = StaticValue(True, True), True, None
    else:
        node = call.value_node(switch.argument, switch.position)
        explicit = node is not None
        if not explicit and switch.default is not None:
            enabled = StaticValue(True, switch.default)
        elif not explicit:
            return None  # e.g. Lightning's Trainer() leaves determinism alone by default
        else:
            enabled = UNKNOWN if call.has_star_args and node is None else facts.evaluate(node)
    warn_only = StaticValue(True, False)
    if switch.warn_value is not None and enabled.is_(switch.warn_value):
        warn_only = StaticValue(True, True, enabled.flag)
    elif switch.warn_only is not None:
        keyword, position, warn_value = switch.warn_only
        warn_node = call.value_node(keyword, position)
        if warn_node is not None:
            value = facts.evaluate(warn_node)
            warn_only = StaticValue(True, value.value == warn_value, value.flag) if value.known else UNKNOWN
    return DeterminismRequest(call, switch, enabled, warn_only, explicit, node)


def _debug_mode_request(facts: FileFacts, call: CallFact) -> DeterminismRequest:
    node = call.value_node("debug_mode", 0)
    value = facts.evaluate(node)
    mode = DETERMINISTIC_DEBUG_MODES.get(value.value) if value.known and isinstance(value.value, (str, int)) else None
    if mode is None:
        return DeterminismRequest(call, None, UNKNOWN, UNKNOWN, node is not None, node)
    on, warn = mode
    return DeterminismRequest(call, None, StaticValue(True, on, value.flag), StaticValue(True, warn), True, node)


def _names_determinism(call: CallFact) -> bool:
    """A project helper such as ``setup(seed, deterministic=True)`` or ``make_deterministic()``."""
    if project_helper_named(call, "determinis"):
        return True
    return any(arg.keyword is not None and "determinis" in arg.keyword.value for arg in call.node.args)


def project_helper_named(call: CallFact, word: str) -> bool:
    """A call of a project-local helper whose name contains ``word`` (``set_seed``,
    ``make_deterministic``): its body is out of sight, so it is taken at its word.
    Library functions are matched by their real names instead."""
    root = (call.qualname or "").split(".", 1)[0]
    callee = call.method or (call.qualname or "").rpartition(".")[2]
    return root not in WELL_KNOWN_LIBRARIES and word in callee.lower()


def describe_call(call: CallFact) -> str:
    """A short spelling of the callee for messages: ``use_deterministic_algorithms``."""
    return (call.qualname or call.method or "call").rpartition(".")[2]


def is_training_script(facts: FileFacts) -> CallFact | None:
    """The call that makes this file a PyTorch training script (an optimiser
    built, a ``.backward()``, a framework trainer), or None."""
    return script_evidence(facts, lambda call: _is_training_call(facts, call), prefer=lambda call: call.method != "backward")


def script_evidence(facts: FileFacts, is_evidence, prefer=lambda call: True) -> CallFact | None:
    """The first call satisfying ``is_evidence`` (one satisfying ``prefer`` if
    any) when the file is a script, else None.  Library modules (no main guard
    and no such call at module level) are not scripts: whoever imports them
    decides about seeds and determinism."""
    evidence = [c for c in facts.calls if is_evidence(c)]
    if not evidence:
        return None
    if not facts.has_main_guard and not any(c.scope.at_module_level for c in evidence):
        return None
    preferred = [c for c in evidence if prefer(c)]
    return (preferred or evidence)[0]


def _is_training_call(facts: FileFacts, call: CallFact) -> bool:
    qualname = call.qualname or ""
    namespace, _, name = qualname.rpartition(".")
    if namespace == TORCH_OPTIMIZER_NAMESPACE and name[:1].isupper():
        return True
    if qualname in TRAINER_CLASSES:
        return True
    return call.method == "backward" and facts.imports_module("torch")


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
        you that two runs with the same seed may still differ.
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
        # turned off on purpose is deterministic-off's business, not this rule's
        "import torch\ntorch.use_deterministic_algorithms(False)\nopt = torch.optim.SGD([], lr=0.1)\n",
    )
    INVALID = (
        Invalid(
            "import torch\nmodel = torch.nn.Linear(2, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
            line=3,
            message="never enables deterministic algorithms",
        ),
        Invalid(
            "import torch\n\ndef main():\n    x = torch.ones(2, requires_grad=True)\n    (x * 2).sum().backward()\n\n"
            "if __name__ == '__main__':\n    main()\n",
            line=5,
        ),
        Invalid("import pytorch_lightning as pl\n\nif __name__ == '__main__':\n    pl.Trainer(max_epochs=1).fit(model)\n", line=4),
    )

    def finish(self) -> None:
        evidence = is_training_script(self.facts)
        if evidence is None or determinism_state(self.facts).addressed:
            return
        self.report(
            evidence.node,
            "training script never enables deterministic algorithms: nondeterministic kernels "
            "(atomicAdd scatter/index ops, pooling/upsampling backward, cuDNN algorithm choice) run silently.",
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
        state = determinism_state(self.facts)
        for request in state.requests:
            if request.turns_off and request.framework is None and not _restores_in_finally(request.call):
                self.report(
                    request.call.node,
                    f"deterministic algorithms turned off: {describe_call(request.call)} receives {request.enabled.describe()}.",
                )
        if state.enabled:
            return
        for write in state.library_settings:
            value = self.facts.evaluate(write.value)
            if value.is_(False, 0):  # None (as in ``cudnn.flags(deterministic=None)``) keeps the setting
                fix = Replace(write.value, cst.Name("True"), safe=value.flag is None) if write.value is not None else None
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
                stack.extend(node.children)
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
        for request in determinism_state(self.facts).requests:
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
        requests = [r for r in determinism_state(facts).requests if r.turns_on]
        if any(r.sets_cublas_workspace for r in requests):
            return
        # a library function that switches the mode for its caller runs under the caller's environment
        requests = [r for r in requests if r.call.scope.at_module_level or facts.has_main_guard]
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
    )
    INVALID = (
        Invalid("import torch, lightning as L\ntrainer = L.Trainer(deterministic=False, benchmark=True)\n", line=2, message="Lightning Trainer"),
        Invalid("import pytorch_lightning as pl\ntrainer = pl.Trainer(benchmark=True)\n", line=2, message="benchmark"),
        Invalid("import torch\nfrom transformers import TrainingArguments\nargs = TrainingArguments('out', full_determinism=False)\n", line=3),
    )

    def finish(self) -> None:
        facts = self.facts
        for request in determinism_state(facts).requests:
            if request.turns_off and request.framework is not None:
                self.report(
                    request.value_node or request.call.node,
                    f"{request.framework}: {request.switch.argument}={request.enabled.describe()} turns deterministic algorithms off.",
                )
        for call in facts.calls:
            option = FRAMEWORK_BENCHMARK_OPTIONS.get(call.qualname) if call.qualname else None
            if option is not None:
                value = facts.evaluate(call.value_node(option))
                if value.truthy:
                    self.report(
                        call.value_node(option),
                        f"{option}={value.describe()} turns cuDNN autotuning on: algorithm choice can differ between runs.",
                    )


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
        if determinism_state(facts).enabled:
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
