"""What the seeding rules share: the base of the missing-seed rules (one per
global RNG), the seeding fix (where a seeding call goes, and which call), how a
draw is named in messages, and what the draw-based rules say about scripts that
never train.
"""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.apis import FIX_DEFAULT_SEED, NUMPY, PYTHON, RNG_LABELS, RNGS, SEEDING_FUNCTIONS, TORCH
from detaudit.static.analyses.rng_apis import DATA_ORDER_DRAWS
from detaudit.static.analyses.seeding import Draw
from detaudit.static.engine.facts import CallFact
from detaudit.static.engine.names import NameTable
from detaudit.static.engine.walk import child_nodes
from detaudit.static.fixes.code import FixCode, seeding_code
from detaudit.static.fixes.edits import InsertStatement, is_import_line, setup_position
from detaudit.static.rule import Rule

SEEDING_EXAMPLES = {TORCH: "torch.manual_seed(SEED)", NUMPY: "np.random.seed(SEED)", PYTHON: "random.seed(SEED)"}


# -- fixes -------------------------------------------------------------------------
#
# A seeding call goes at module level, right after the imports and before the
# code that draws: it then runs once per process, never once per call of a
# function that builds a model.


def seeding_fix(
    rule: Rule, before: CallFact, rngs: frozenset[str], *, safe: bool = True
) -> InsertStatement | tuple[InsertStatement, ...] | None:
    """Seed ``rngs`` before ``before`` runs, right after the imports: with a
    seed-everything helper of a library the file imports, else right after the
    file's own seeding helper (defined above that point), else with the
    seeding calls of the fix style (``fixes.code.seeding_code``)."""
    module = rule.context.module
    use_index = before.scope.top_level_index
    anchor, before_anchor = setup_position(module, use_index)
    insertion_index = module.body.index(anchor) + (0 if before_anchor else 1)
    if _library_seeding_call(module, insertion_index) is None:
        helper = _own_seeding_helper(rule, rngs, use_index)
        if helper is not None:
            index, name = helper
            if index >= insertion_index:
                anchor, before_anchor = module.body[index], False
            return InsertStatement(anchor, f"{name}({FIX_DEFAULT_SEED})", before=before_anchor, safe=safe)
    code = seeding_call(rule, rngs, insertion_index)
    if code is None:
        return None
    return tuple(InsertStatement(anchor, line, before=before_anchor, imports=code.imports, safe=safe) for line in code.lines)


def seeding_call(rule: Rule, rngs: frozenset[str], available_before: int) -> FixCode | None:
    """Code seeding ``rngs`` that can run before the module-level statement
    ``available_before``: a library's seed-everything helper the file imports,
    the file's own seeding helper, else the fix style's seeding calls, which
    also seed the other global RNGs the file imports and never seeds (as a
    seed-everything helper would)."""
    library = _library_seeding_call(rule.context.module, available_before)
    if library is not None:
        return FixCode((f"{library}({FIX_DEFAULT_SEED})",))
    helper = _own_seeding_helper(rule, rngs, available_before)
    if helper is not None:
        return FixCode((f"{helper[1]}({FIX_DEFAULT_SEED})",))
    unseeded = set(RNGS) - set(rule.analyses.seeding.seeded)
    # spelled with the names bound where the code goes: ``from random import *`` above it
    # binds ``random`` to a function, whatever a later ``import random`` binds
    above = _bindings_above(rule.context.module, available_before)
    code = seeding_code(rngs, above, rule.context.fix_style, also=unseeded)
    if code is not None and any(rule.facts.names.is_bound(module) for module in code.imports):
        return None  # the fixer adds no import for a name the file binds further down
    return code


def _bindings_above(module: cst.Module, index: int) -> dict[str, str]:
    """What the imports of the module-level statements above ``index`` bind (also
    inside ``try``/``if`` blocks, not inside functions or classes)."""
    table = NameTable()
    stack = list(reversed(module.body[:index]))
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            table.add_import(node)
        elif not isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            stack.extend(reversed(child_nodes(node)))
    return table.bindings()


def _library_seeding_call(module: cst.Module, available_before: int) -> str | None:
    """How the file spells a library's seed-everything helper (``L.seed_everything``)
    with the names its module-level imports above ``available_before`` bind."""
    imported = NameTable()
    for statement in module.body[:available_before]:
        if is_import_line(statement):
            for small in statement.body:
                imported.add_import(small)
    for function, seeded in SEEDING_FUNCTIONS.items():
        if seeded != frozenset(RNGS):
            continue  # seed-everything helpers only, not torch.manual_seed and the like
        for local, qualified in imported.bindings().items():
            if function == qualified or function.startswith(qualified + "."):
                return f"{local}{function[len(qualified):]}"
    return None


def _own_seeding_helper(rule: Rule, rngs: frozenset[str], defined_before: int) -> tuple[int, str] | None:
    """(index, name) of a module-level function defined above ``defined_before``
    that seeds ``rngs`` from its one required argument."""
    for index, statement in enumerate(rule.context.module.body[:defined_before]):
        if isinstance(statement, cst.FunctionDef) and _takes_one_seed(statement):
            if rngs <= rule.analyses.rng_effects.function_effects(statement.name.value).seeds:
                return index, statement.name.value
    return None


def _takes_one_seed(function: cst.FunctionDef) -> bool:
    parameters = function.params
    required = [p for p in parameters.params if p.default is None]
    return len(parameters.posonly_params) == 0 and len(required) == 1 and parameters.params[0].default is None


def what_draws(rule: Rule, draw: Draw) -> str:
    if draw.direct:
        return f"by `{draw.api}`"
    return f"by `{call_code(rule, draw.call)}`, through `{draw.api}`"


def call_code(rule: Rule, call: CallFact, limit: int = 60) -> str:
    text = " ".join(rule.context.module.code_for_node(call.node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: What every draw-based seed rule says about scripts that never train (one policy, documented once).
NON_TRAINING_SCRIPTS = """

        Scripts that never train (no optimiser, `backward()` or trainer that a run
        reaches) are judged by what can change their output: building layers
        and models is setup there (the weights come from a checkpoint), so only
        their other draws count (sampling noise, a shuffle that writes a
        split).  A library module that defines model or dataset classes and
        never trains is not asked for seeds for its `__main__` smoke test."""


class MissingSeed(Rule):
    """One rule per global RNG: drawn from when the file runs, seeded nowhere."""

    rng: str
    severity = Severity.WARNING

    def finish(self) -> None:
        seeding = self.analyses.seeding
        spawned = seeding.unseeded_in_spawned_process(self.rng)
        if spawned is not None:
            draw, starter = spawned
            self.report(
                draw.call.node,
                f"the {RNG_LABELS[self.rng]} is drawn from here {what_draws(self, draw)} in a process started by "
                f"`{call_code(self, starter, 40)}`: a fresh interpreter that the parent's seeds never reach, and nothing "
                f"it runs seeds it: call `{SEEDING_EXAMPLES[self.rng]}` in the function it starts.",
            )
            return
        draw = seeding.first_draw.get(self.rng)
        if draw is None or self.rng in seeding.seeded:
            return
        if any(self.rng in off.rngs for off in seeding.off_by_default):
            return  # conditional-seed says it better
        self.report(
            draw.call.node,
            f"the {RNG_LABELS[self.rng]} is drawn from here {what_draws(self, draw)}, but nothing in this file "
            f"or the project helpers it calls seeds it: call `{SEEDING_EXAMPLES[self.rng]}` before this point."
            f"{self._data_order(seeding.draws(self.rng))}",
            fix=seeding_fix(self, draw.call, frozenset({self.rng})),
        )

    def _data_order(self, draws: tuple[Draw, ...]) -> str:
        """The data order that follows from the unseeded RNG (shuffling loaders,
        ``random_split``): named here, so the one seed that fixes it is one finding."""
        shuffles = [d for d in draws if d.direct and d.api in DATA_ORDER_DRAWS]
        if not shuffles:
            return ""
        named = ", ".join(f"`{call_code(self, d.call, 40)}`" for d in shuffles[:3])
        more = f" and {len(shuffles) - 3} more" if len(shuffles) > 3 else ""
        return f" It also decides the data order of {named}{more}, which differs per run without it."
