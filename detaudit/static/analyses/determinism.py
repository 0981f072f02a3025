"""Determinism state: does a file ask for deterministic algorithms, and how?

The one place that decides "does this file enable deterministic algorithms?";
the determinism rules, compile-autotune and nondeterministic-op read it.  Which
calls switch determinism, with which arguments, is data in
``detaudit.knowledge.apis.DETERMINISM_SWITCHES`` and (for torch's own switches,
its debug modes and the libraries' ``deterministic`` settings) in the settings
table, ``knowledge/backend_settings.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

import libcst as cst

from detaudit.knowledge.apis import DETERMINISM_SWITCHES, LIGHTNING_TRAINER, TRAINER_DEFAULTS_ARGUMENTS, DeterminismSwitch
from detaudit.knowledge.backend_settings import backend_settings
from detaudit.static.analyses.helpers import helper_calls, project_helper_named
from detaudit.static.engine.facts import UNKNOWN, CallFact, FileFacts, Scope, SettingWrite, StaticValue
from detaudit.static.engine.walk import child_nodes

if TYPE_CHECKING:
    from detaudit.static.analyses.values import Values
    from detaudit.static.context import FileContext

#: How an argument is read: its value in a default run (``Values.evaluate``)
Evaluate = Callable[[cst.BaseExpression | None, Scope], StaticValue]

# -- what the settings table says about the switches read here ------------------------
_SETTINGS = backend_settings()
#: Writes that make one library pick deterministic kernels (cudnn/mkldnn ``deterministic``).
LIBRARY_DETERMINISM_SETTINGS = frozenset(
    attribute for s in _SETTINGS.in_hazard("deterministic-kernels") for attribute in s.attributes
)
#: The debug-mode setter, and each of its modes -> (deterministic algorithms on, warn only).
_DEBUG_MODE = next(w for w in _SETTINGS["deterministic-algorithms"].writers if w.values)
_DEBUG_MODE_WARNS = dict(next(w for w in _SETTINGS["deterministic-warn-only"].writers if w.write == _DEBUG_MODE.write).values)
DETERMINISTIC_DEBUG_MODES = {mode: (on, _DEBUG_MODE_WARNS[mode]) for mode, on in _DEBUG_MODE.values}


#: What a module's text must mention for its helpers to be read for switches: each
#: switch's own name, but not ``deterministic`` (detaudit's context manager), a word
#: model code uses everywhere.
_SWITCH_NAMES = frozenset(name.rpartition(".")[2] for name in DETERMINISM_SWITCHES) - {"deterministic"}


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
    #: the call sits in a branch a default run does not take
    off_by_default: bool = False

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

    #: the ``if``s that keep requests or library settings from a default run, with their test's value
    off_by_default: list[tuple[cst.If, StaticValue]] = field(default_factory=list)
    #: ``id()`` of the library settings' nodes that a default run does not reach
    settings_off_by_default: set[int] = field(default_factory=set)

    @property
    def addressed(self) -> bool:
        """The author made a choice about determinism that a default run makes (on,
        off or through a helper).  A seeding helper whose ``deterministic`` is left
        at its default off (``transformers.set_seed(seed)``) makes none, and a
        switch only an option turns on (``if args.seed is not None:
        cudnn.deterministic = True``) leaves default runs without one."""
        return bool(
            any(r.explicit or r.turns_on for r in self.requests if not r.off_by_default)
            or any(id(write.node) not in self.settings_off_by_default for write in self.library_settings)
            or self.mentions_helper
        )


def analyse(facts: FileFacts, values: "Values | None" = None, context: "FileContext | None" = None) -> DeterminismState:
    """What the file's calls and settings say about deterministic algorithms
    (arguments read through ``values`` when given: parameter and config defaults;
    with ``context``, what the project helpers it calls switch, through the project index)."""
    evaluate: Evaluate = values.evaluate if values is not None else (lambda node, scope: facts.evaluate(node))
    state = DeterminismState(library_settings=list(facts.settings_of(*LIBRARY_DETERMINISM_SETTINGS)))
    for write in state.library_settings:
        if _note_off_by_default(lambda test: evaluate(test, write.scope), state, write.scope.conditions, write.node):
            state.settings_off_by_default.add(id(write.node))
    not_helpers: set[str] = set()
    for call in facts.calls:
        switch = DETERMINISM_SWITCHES.get(call.qualname) if call.qualname else None
        found: list[DeterminismRequest] = []
        if switch is not None:
            found = [_switch_request(evaluate, call, switch)]
        elif call.qualname in TRAINER_DEFAULTS_ARGUMENTS:
            found = [_trainer_defaults_request(evaluate, call)]
        elif call.qualname == _DEBUG_MODE.write:
            found = [_debug_mode_request(facts, call)]
        elif values is not None and (built := values.instantiated(call)) is not None:
            found = [_instantiated_request(evaluate, call, *built)]
        else:
            found = _project_helper_requests(context, call, not_helpers) if context is not None else []
            if not found and _names_determinism(call):
                state.mentions_helper = True
        found = [request for request in found if request is not None]
        if found:
            off = _note_off_by_default(lambda test: evaluate(test, call.scope), state, call.scope.conditions, call.node)
            state.requests += [replace(request, off_by_default=off) for request in found]
    return state


def _note_off_by_default(
    evaluate: Callable[[cst.BaseExpression], StaticValue], state: DeterminismState, conditions, node: cst.CSTNode
) -> bool:
    """Whether ``node`` sits in a branch of an ``if`` that a default run does not take
    (``if args.seed is not None:`` with ``--seed`` defaulting to None, ``if args.cuda
    and args.cuda_deterministic:`` with the flag parsed in a project module); such
    ifs are noted."""
    for condition in conditions:
        if type(condition) is not cst.If:
            continue
        value = evaluate(condition.test)
        if value.known and bool(value.value) == _contains(condition.orelse, node):
            if all(known is not condition for known, _ in state.off_by_default):
                state.off_by_default.append((condition, value))
            return True
    return False


def _contains(tree: cst.CSTNode | None, node: cst.CSTNode) -> bool:
    if tree is None:
        return False
    stack = [tree]
    while stack:
        current = stack.pop()
        if current is node:
            return True
        stack.extend(child_nodes(current))
    return False


def _project_helper_requests(context: "FileContext", call: CallFact, not_helpers: set[str]) -> list[DeterminismRequest]:
    """The switches a project helper of another module makes (``not_helpers``: callees
    already found not to be one, so that each is looked up once per file)."""
    if call.qualname is None or call.qualname in not_helpers:
        return []
    helper = helper_calls(context, call, _SWITCH_NAMES)
    if helper is None:
        not_helpers.add(call.qualname)
        return []
    return _helper_requests(call, *helper)


def _trainer_defaults_request(evaluate: Evaluate, call: CallFact) -> DeterminismRequest | None:
    """``LightningCLI(trainer_defaults={"deterministic": True})``: the Trainer it builds
    gets that option unless the command line or its config file says otherwise."""
    node = trainer_default(call, LIGHTNING_TRAINER.argument or "")
    return _request(evaluate, call, LIGHTNING_TRAINER, node, explicit=True) if node is not None else None


def _helper_requests(call: CallFact, helper_facts: FileFacts, body: list[CallFact]) -> list[DeterminismRequest]:
    """A project helper of another module that switches deterministic algorithms
    (``utils.setup_determinism()`` calling ``torch.use_deterministic_algorithms(True)``):
    the request is the helper's call, here."""
    requests = []
    for inner in body:
        switch = DETERMINISM_SWITCHES.get(inner.qualname) if inner.qualname else None
        request = _switch_request(lambda node, scope: helper_facts.evaluate(node), inner, switch) if switch is not None else None
        if request is not None:
            enabled = request.enabled
            if enabled.known:
                enabled = StaticValue(True, enabled.value, enabled.flag, f"passed to {inner.qualname} inside {call.qualname}")
            requests.append(DeterminismRequest(call, switch, enabled, request.warn_only, request.explicit, None))
    return requests


def _instantiated_request(
    evaluate: Evaluate, call: CallFact, target: str, options: dict[str, StaticValue]
) -> DeterminismRequest | None:
    """``hydra.utils.instantiate(cfg.trainer)`` of a config whose ``_target_`` is a
    determinism switch: the option comes from the config file."""
    switch = DETERMINISM_SWITCHES.get(target)
    if switch is None or switch.argument is None or switch.argument not in options:
        return None
    return _request(evaluate, call, switch, None, explicit=True, enabled=options[switch.argument])


def trainer_default(call: CallFact, option: str) -> cst.BaseExpression | None:
    """The value a call's trainer-defaults dictionary gives ``option`` (a literal key)."""
    defaults = call.value_node(TRAINER_DEFAULTS_ARGUMENTS[call.qualname])
    if not isinstance(defaults, cst.Dict):
        return None
    for element in defaults.elements:
        if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString) and element.key.evaluated_value == option:
            return element.value
    return None


def _switch_request(evaluate: Evaluate, call: CallFact, switch: DeterminismSwitch) -> DeterminismRequest | None:
    if switch.argument is None:
        return _request(evaluate, call, switch, None, explicit=True, enabled=StaticValue(True, True))
    node = call.value_node(switch.argument, switch.position)
    if node is None and switch.default is not None:
        return _request(evaluate, call, switch, None, explicit=False, enabled=StaticValue(True, switch.default))
    if node is None:
        return None  # e.g. Lightning's Trainer() leaves determinism alone by default
    return _request(evaluate, call, switch, node, explicit=True)


def _request(
    evaluate: Evaluate,
    call: CallFact,
    switch: DeterminismSwitch,
    node: cst.BaseExpression | None,
    explicit: bool,
    enabled: StaticValue | None = None,
) -> DeterminismRequest:
    if enabled is None:
        enabled = evaluate(node, call.scope)
    warn_only = StaticValue(True, False)
    if switch.warn_value is not None and enabled.is_(switch.warn_value):
        warn_only = StaticValue(True, True, enabled.flag)
    elif switch.warn_only is not None:
        keyword, position, warn_value = switch.warn_only
        warn_node = call.value_node(keyword, position)
        if warn_node is not None:
            value = evaluate(warn_node, call.scope)
            warn_only = StaticValue(True, value.value == warn_value, value.flag) if value.known else UNKNOWN
    return DeterminismRequest(call, switch, enabled, warn_only, explicit, node)


def _debug_mode_request(facts: FileFacts, call: CallFact) -> DeterminismRequest:
    node = call.value_node(_DEBUG_MODE.argument, _DEBUG_MODE.position)
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
