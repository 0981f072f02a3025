"""Analyses that several rules read, each computed once per checked file, on first use.

Rules never import each other: what rules of several families need to know
about a file lives here, typed, and a rule reads it as ``self.analyses.<name>``:

- ``script`` (``script.py``): does executing the file do work, does a run reach a call;
- ``rng_effects`` (``project.py``, the project index): what each call does to the global RNGs,
  across the file and the project modules it imports (found as a run would find them:
  ``module_paths.py`` reads the ``sys.path`` edits a script makes; ``rng_apis.py`` knows what
  library APIs do);
- ``training`` (``script.py``): the call that makes the file a training script, if any;
- ``run_order`` (``execution.py``): the calls a run reaches, in order (the
  statement walker every rule uses is there too);
- ``seeding`` (``seeding.py``): what the file seeds, where it first draws, what comes too late;
- ``determinism`` (``determinism.py``): the file's requests for deterministic algorithms;
- ``op_sites`` (``op_sites.py``): the calls that reach an entry of the ops table;
- ``grad_flow`` (``grad_flow.py``): where no parameter's gradient can pass (backward-only hazards),
  and which code evaluates (a no_grad block, a function that evaluates a model);
- ``values`` (``values.py``): the value an expression has in a default run when it comes
  through a parameter or a project config (yacs, dataclasses, Hydra/OmegaConf YAML);
- ``checkpoints`` (``checkpoints.py``): the resume checkpoints the file saves (dicts holding
  optimizer state), the LR schedulers and GradScalers it builds, what it draws while training,
  the resumes that load weights without the optimizer's state.

String-ness (``strings.py``), project helpers named for what they do
(``helpers.py``) and what distributed code looks like (``distributed.py``:
which identifiers hold a rank, the names a callee goes by) are functions of a
node or a call, with nothing to cache.

Analyses import ``engine/``'s building blocks (facts, walk, names, and for the
project index sources, limits and trees), ``detaudit.knowledge`` and each
other; ``context.py`` only for its types; never a rule, the pipeline
(``engine/check.py``), ``fixes/`` or ``run/``.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from detaudit.static.analyses import determinism, op_sites, script
from detaudit.static.analyses.checkpoints import Checkpoints
from detaudit.static.analyses.determinism import DeterminismState
from detaudit.static.analyses.execution import RunOrder, run_order
from detaudit.static.analyses.grad_flow import GradFlow, ProjectCallers
from detaudit.static.analyses.op_sites import OpSite
from detaudit.static.analyses.project import ModuleSummary
from detaudit.static.analyses.script import ScriptAnalysis
from detaudit.static.analyses.seeding import SeedingState
from detaudit.static.analyses.values import Values
from detaudit.static.engine.facts import CallFact

if TYPE_CHECKING:
    from detaudit.static.context import FileContext


class FileAnalyses:
    """The shared analyses of one checked file (``FileContext.analyses``)."""

    def __init__(self, context: "FileContext") -> None:
        self._context = context

    @cached_property
    def script(self) -> ScriptAnalysis:
        context = self._context
        return script.analyse(context.facts, context.module, context.path, lambda: self.run_order.calls)

    @cached_property
    def determinism(self) -> DeterminismState:
        return determinism.analyse(self._context.facts, self.values, self._context)

    @cached_property
    def values(self) -> Values:
        return Values(self._context)

    @cached_property
    def checkpoints(self) -> Checkpoints:
        return Checkpoints(self._context)

    @cached_property
    def op_sites(self) -> tuple[OpSite, ...]:
        return op_sites.find(self._context.facts)

    @cached_property
    def grad_flow(self) -> GradFlow:
        return GradFlow(self._context.facts, self._context.source.text, ProjectCallers(self._context))

    @cached_property
    def rng_effects(self) -> ModuleSummary:
        """The RNG effects of this file's calls; answers that read project modules
        name those files, so the seeding analysis can record them as dependencies."""
        context = self._context
        context.project.refresh()
        return ModuleSummary(context.facts, context.path, None, context.project)

    @cached_property
    def run_order(self) -> RunOrder:
        return run_order(self.rng_effects)

    @cached_property
    def training(self) -> CallFact | None:
        evidence, read = script.training_evidence(self._context.facts, self.script, self.rng_effects)
        self._context.dependencies.update(read)
        return evidence

    @cached_property
    def seeding(self) -> SeedingState:
        return SeedingState(self._context)
