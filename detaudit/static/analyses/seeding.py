"""Seeding state: which global RNGs a file seeds, where it first draws from each, and what comes too late.

Seeds are found directly, in the file's own helpers, in project helpers and
through known third-party helpers (``rng_effects``).  Draws count only when the
file does work when executed (``script.does_work``): a library module's
importer seeds.  Every part is computed on first use, because resolving a call
into the project parses modules: a file that neither draws nor seeds under a
condition never pays for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import libcst as cst

from detaudit.knowledge.apis import SEEDING_CONSTRUCTORS
from detaudit.static.analyses.project import OffByDefault
from detaudit.static.analyses.rng_apis import SHUFFLING_LOADER, Effects, initialises_weights
from detaudit.static.engine.facts import CallFact
from detaudit.static.engine.walk import walk

#: Bases of the classes that make a file a library module: models and datasets.
LIBRARY_CLASS_BASES = ("torch.nn.", "torch.utils.data.", "lightning.", "pytorch_lightning.")

if TYPE_CHECKING:
    from detaudit.static.context import FileContext


@dataclass(frozen=True)
class Draw:
    call: CallFact  # where a finding goes: the call in this file that leads to the draw
    api: str  # what draws (``torch.nn.Linear``)
    direct: bool  # the call itself is the drawing API


@dataclass(frozen=True)
class SeedingOffByDefault:
    """A call that seeds ``rngs`` but does not run by default, and the ``if`` that keeps it off."""

    call: CallFact
    rngs: frozenset[str]
    condition: OffByDefault


class SeedingState:
    """What the file does to the global RNGs when it runs (``FileAnalyses.seeding``)."""

    def __init__(self, context: "FileContext") -> None:
        self._context = context
        self._summary = context.analyses.rng_effects

    def _effects(self, call: CallFact) -> Effects:
        """The call's effects; the project files the answer was read from become
        dependencies of the file's result (a cache must notice when they change)."""
        effects = self._summary.call_effects(call)
        self._context.dependencies.update(effects.files)
        return effects

    @cached_property
    def _run(self) -> tuple[tuple[CallFact, Effects], ...]:
        """The calls a run reaches, in order, with what each does to the RNGs then
        (without the draws ``counts_draw`` leaves out)."""
        run = []
        for call in self._context.analyses.run_order.calls:
            effects = self._summary.as_run(call, self._effects(call))
            if effects.draws:
                effects = Effects(effects.seeds, tuple(d for d in effects.draws if self.counts_draw(d[1])), effects.files)
            run.append((call, effects))
        return tuple(run)

    def counts_draw(self, api: str) -> bool:
        """Whether a draw by ``api`` can make this file's results differ.

        In a training script every draw does.  A script that never trains (no
        optimiser, ``backward()`` or trainer that a run reaches) only builds its
        layers as setup: its weights come from a checkpoint (inference, export,
        evaluation), so initialisation draws are left out; its other draws
        (sampling noise, a shuffle that writes a split) count.  A library module
        (one that defines ``nn.Module`` or ``Dataset`` classes) that never
        trains has no result of its own: what its ``__main__`` smoke test draws
        is left out entirely."""
        if self.trains:
            return True
        return not self.is_library_module and not initialises_weights(api)

    @cached_property
    def trains(self) -> bool:
        return self._context.analyses.training is not None

    @cached_property
    def is_library_module(self) -> bool:
        """The file defines model or dataset classes (its importers use them)."""
        facts = self._context.facts
        for node in facts.classes.values():
            for base in node.bases:
                qualname = facts.names.resolve(base.value) or ""
                if qualname.startswith(LIBRARY_CLASS_BASES):
                    return True
        return False

    @cached_property
    def off_by_default(self) -> tuple[SeedingOffByDefault, ...]:
        """Seeding calls that do not run by default."""
        found = []
        for call in self._context.facts.calls:
            condition = self._summary.off_by_default(call)
            if condition is not None:
                seeds = self._effects(call).seeds
                if seeds:
                    found.append(SeedingOffByDefault(call, seeds, condition))
        return tuple(found)

    @cached_property
    def seeded(self) -> frozenset[str]:
        """RNGs seeded on some path that runs by default."""
        summary = self._summary
        on_import = summary.imports_seeds()  # a project module that seeds when imported
        self._context.dependencies.update(on_import.files)
        workers_only = summary.worker_init_calls
        in_calls = (
            rng
            for call in self._context.facts.calls
            if id(call.node) not in workers_only and summary.off_by_default(call) is None
            for rng in self._effects(call).seeds
        )
        return frozenset(in_calls) | on_import.seeds

    @cached_property
    def first_draw(self) -> dict[str, Draw]:
        """RNG -> the first call that draws from it when the file runs (none for a library)."""
        if not self._context.analyses.script.does_work:
            return {}
        found: dict[str, Draw] = {}
        for call, effects in self._run:
            for rng, api in effects.draws:
                if rng not in found:
                    found[rng] = self._draw(call, api)
        return found

    def draws(self, rng: str) -> tuple[Draw, ...]:
        """Every call that draws from ``rng`` when the file runs, in run order (none for a library)."""
        if not self._context.analyses.script.does_work:
            return ()
        return tuple(self._draw(call, api) for call, effects in self._run for api in [effects.draw_of(rng)] if api is not None)

    def unseeded_in_spawned_process(self, rng: str) -> tuple[Draw, CallFact] | None:
        """(the first draw from ``rng``, the call that started its process) in a
        process started fresh (``mp.spawn(main, ...)``) that nothing run in that
        process seeds: the parent's seeds never reach it."""
        order = self._context.analyses.run_order
        if not order.spawned or not self._context.analyses.script.does_work:
            return None
        spawned_run = [(call, effects) for call, effects in self._run if id(call.node) in order.spawned]
        if any(rng in effects.seeds for _, effects in spawned_run):
            return None
        for call, effects in spawned_run:
            api = effects.draw_of(rng)
            if api is not None:
                return self._draw(call, api), order.spawned_by[id(call.node)]
        return None

    @cached_property
    def drawn_before_seeded(self) -> dict[str, tuple[Draw, CallFact]]:
        """RNG -> (first draw, later first seed) when the straight-line path draws before it seeds."""
        late = {}
        for rng in self.first_draw:
            if rng in self.seeded:
                found = self._drawn_before_seeded(rng)
                if found is not None:
                    late[rng] = found
        return late

    def _drawn_before_seeded(self, rng: str) -> tuple[Draw, CallFact] | None:
        """A draw that picks the seed itself (``seed = random.randint(1, 10000)``
        then ``random.seed(seed)``, the DCGAN example's fallback) is not a use, nor
        is building a shuffling DataLoader: its sampler draws the order when the
        loader is iterated, after a seed that follows the construction."""
        draws: list[Draw] = []
        for call, effects in self._run:
            if rng in effects.seeds:
                used = next((d for d in draws if not _feeds(self._context.module, d.call, call)), None)
                return (used, call) if used is not None else None
            api = effects.draw_of(rng)
            if api is not None and not (api == SHUFFLING_LOADER and self._summary.is_known_api(call)):
                draws.append(self._draw(call, api))
        return None

    def _draw(self, call: CallFact, api: str) -> Draw:
        return Draw(call, api, direct=self._summary.is_known_api(call))


def _feeds(module: cst.Module, draw: CallFact, seed: CallFact) -> bool:
    """Whether ``draw``'s result is assigned to a name that ``seed``'s arguments
    read (a trainer that seeds takes the model, not a seed drawn for it)."""
    if seed.qualname in SEEDING_CONSTRUCTORS:
        return False
    finder = _AssignmentOf(draw.node)
    walk(module.body[draw.scope.top_level_index], [finder])
    if not finder.targets:
        return False
    arguments = " ".join(module.code_for_node(arg.value) for arg in seed.node.args)
    return any(re.search(rf"(?<![\w.]){re.escape(target)}(?!\w)", arguments) for target in finder.targets)


class _AssignmentOf(cst.CSTVisitor):
    """Finds the targets (as code) of the assignment whose value is ``value``."""

    def __init__(self, value: cst.CSTNode) -> None:
        super().__init__()
        self.value = value
        self.targets: list[str] = []

    def visit_Assign(self, node: cst.Assign) -> None:
        if node.value is self.value:
            self.targets = [cst.Module([]).code_for_node(t.target) for t in node.targets]
