"""Script-ness: how much of a file runs when it is executed.

Rules ask two different questions, so the analysis answers both by name:

- ``does_work``: does executing the file do anything beyond binding names?  A
  main guard, a notebook, or a module-level bare call (``main()``,
  ``print(...)``) or loop makes it a program; a module that only defines
  functions, classes and values (example inputs, registries) is a library, and
  whoever imports it decides about seeds.  The seed rules ask this.
- ``reaches(call)``: does a run of the file as a script execute ``call``?  Yes
  at module level, anywhere in a file with a main guard (the guard calls
  into the file's functions), and in the functions module-level code calls or
  starts as an entry point (``main()``, ``mp.spawn(main, ...)``; see
  ``execution.run_order``).  Rules that look for evidence (an optimiser built,
  a ``.backward()``) or that judge one call (a shuffling DataLoader) ask this.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import libcst as cst

from detaudit.knowledge.apis import TRAINER_CLASSES
from detaudit.static.analyses.execution import ENTRY_POINT_CALLS, Block, Runs, is_line, statements
from detaudit.static.analyses.project import ModuleSummary
from detaudit.static.analyses.rng_apis import trains_here
from detaudit.static.engine.facts import CallFact, FileFacts


@dataclass(frozen=True)
class ScriptAnalysis:
    has_main_guard: bool
    notebook: bool
    #: a bare call or a loop runs at module level (outside ``except`` handlers)
    works_at_module_level: bool
    #: ``id(call.node)`` of every call a run reaches (``execution.run_order``)
    run_calls: frozenset[int] = frozenset()

    @property
    def does_work(self) -> bool:
        """Executing the file does more than bind names: it is a program, not a library."""
        return self.has_main_guard or self.notebook or self.works_at_module_level

    def reaches(self, call: CallFact) -> bool:
        """A run of the file as a script executes ``call`` (module level, or any
        code of a file with a main guard)."""
        return call.scope.at_module_level or self.has_main_guard or id(call.node) in self.run_calls

    def evidence(
        self, calls: Iterable[CallFact], is_evidence: Callable[[CallFact], bool], prefer: Callable[[CallFact], bool] = lambda call: True
    ) -> CallFact | None:
        """The first call satisfying ``is_evidence`` (the first one satisfying
        ``prefer``, if any) when a run reaches some evidence, else None."""
        calls = list(calls)
        # the reached calls first: in a library module they are few, and asking
        # ``is_evidence`` of every call can mean reading project modules
        if not any(is_evidence(call) for call in calls if self.reaches(call)):
            return None
        found = [call for call in calls if is_evidence(call)]
        return next((call for call in found if prefer(call)), found[0])


def training_evidence(facts: FileFacts, script: ScriptAnalysis, project: ModuleSummary) -> tuple[CallFact | None, frozenset[tuple[str, str]]]:
    """The call that makes this file a PyTorch training script (an optimiser
    built, a ``.backward()``, a framework trainer, a project function or class
    whose code trains: ``Trainer(...).run()``) when a run reaches one, else
    None; and the project files read to say so.  Library modules (no main guard
    and no such call at module level) are not scripts: whoever imports them trains."""
    read: set[tuple[str, str]] = set()

    def is_training(call: CallFact) -> bool:
        if trains_here(call, call.method == "backward" and project.uses_torch) or (call.qualname or "") in TRAINER_CLASSES:
            return True
        callee = call.qualname if project.local_target(call) is None else None
        if callee in ENTRY_POINT_CALLS:  # ``Process(target=train)`` with ``from train import train``
            keyword, position, _ = ENTRY_POINT_CALLS[callee]
            target = call.value_node(keyword, position)
            callee = facts.names.resolve(target) if target is not None else None
        elif callee is None:
            callee = _instance_method(facts, call)
        if callee is None or project.index is None:
            return False
        trains, files = project.index.trains(callee, project.path)
        read.update(files)
        return trains

    found = script.evidence(facts.calls, is_training, prefer=lambda call: call.method != "backward")
    return found, frozenset(read)


def _instance_method(facts: FileFacts, call: CallFact) -> str | None:
    """``Trainer(...).run()`` or ``trainer.run()`` with ``trainer = Trainer(...)``
    (assigned once), for an imported ``Trainer``: ``"<Trainer's qualname>.run"``."""
    func = call.node.func
    if call.qualname is not None or type(func) is not cst.Attribute:
        return None
    receiver = func.value
    if type(receiver) is cst.Name:
        assigned = facts.simple_assignments.get(receiver.value)
        receiver = assigned[0] if assigned and len(assigned) == 1 else None
    if type(receiver) is not cst.Call:
        return None
    owner = facts.names.resolve(receiver.func)
    return f"{owner}.{func.attr.value}" if owner is not None else None


def analyse(facts: FileFacts, module: cst.Module, path: Path, run_calls: Callable[[], Iterable[CallFact]]) -> ScriptAnalysis:
    works = any(_is_work(statement) for statement in statements(module.body, enter=_runs_on_the_normal_path))
    return ScriptAnalysis(
        has_main_guard=facts.has_main_guard,
        notebook=path.suffix == ".ipynb",
        works_at_module_level=works,
        # a library (no work at module level) runs nothing: no need to walk its calls
        run_calls=frozenset(id(call.node) for call in run_calls()) if works and not facts.has_main_guard else frozenset(),
    )


def _runs_on_the_normal_path(block: Block) -> bool:
    """Blocks a plain run may execute; loop bodies need no look (a loop is work),
    and code that only handles an exception (``except ImportError: warn(...)``) is
    not what the file is for."""
    return block.runs in (Runs.ALWAYS, Runs.BRANCH)


_LOOPS = frozenset({cst.For, cst.While})
_BARE_CALLS = frozenset({cst.Call, cst.Await})


def _is_work(statement: cst.CSTNode) -> bool:
    if type(statement) in _LOOPS:
        return True
    return is_line(statement) and any(
        type(small) is cst.Expr and type(small.value) in _BARE_CALLS for small in statement.body
    )
