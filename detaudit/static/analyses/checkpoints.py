"""Resume checkpoints: what a file saves to continue training from, and the training state it keeps elsewhere.

A resume checkpoint is a dict that holds an optimizer's state, handed to
``torch.save`` or to a save helper (any callee whose name says ``save``:
``save_checkpoint(state, is_best)``, ``utils.save_on_master(to_save, path)``,
``accelerator.save``).  The dict is read where it is written: a literal or
``dict(...)`` at the save, or a name bound to one earlier in the same scope,
with the items assigned to it (``ckpt["scaler"] = ...``, ``ckpt.update(...)``)
before the save.  A save helper of a project module that builds the dict
from its parameters (MAE's ``misc.save_model(args, epoch, model, optimizer,
loss_scaler)``) is read through the project index: its dict is the
checkpoint, and whatever the call passes counts as saved (the helper may put
it under its parameter's name).  A dict whose contents are not all in sight
(``**state`` spread into it, or the name handed to another call before the
save: a helper may add to it) is no checkpoint here: rules stay quiet about
what they cannot read.  A weights-only save (``torch.save(model.state_dict(),
path)``) holds no optimizer state and is not a resume checkpoint.

The training state that should go with it is found as the file builds it:
LR schedulers (``torch.optim.lr_scheduler.*``, timm's, and
``get_*_schedule*``/``create_scheduler``/``build_scheduler``-style builders)
and GradScalers (``torch.amp``/``torch.cuda.amp``, timm's ``NativeScaler``),
each under the dotted name it is assigned to, with the calls made on it, and
the draws a run keeps making while it trains.  These are read in this file
only: an object a project module builds, a dict a helper of another file adds
to, or a draw inside a project helper is not seen.

The load side is read for one question: does a resume put back the weights
and not the optimizer's state?  A load of ``torch.load``'s result into a model
is a resume when it reads the run's position back from the checkpoint
(``checkpoint['epoch']``), runs under a ``resume`` option or in a function
named for resuming; the optimizer counts as restored when its
``load_state_dict`` is called or a load/resume helper is handed it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Iterator

import libcst as cst

from detaudit.knowledge.apis import RANDOM_SAMPLER
from detaudit.static.analyses.helpers import helper_calls
from detaudit.static.analyses.rng_apis import (
    SHUFFLING_LOADER,
    TORCH_RANDOM_TRANSFORM_PREFIXES,
    TORCH_RANDOM_TRANSFORMS,
    api_effects,
    initialises_weights,
)
from detaudit.static.engine.facts import CallFact, Scope
from detaudit.static.engine.names import callee_name, dotted_name
from detaudit.static.engine.walk import child_nodes

if TYPE_CHECKING:
    from detaudit.static.context import FileContext

#: Callees that save, by the last part of their name (lower case): ``torch.save``,
#: ``save_checkpoint``, ``save_on_master``, ``self.save``.  Image and figure writers
#: and model exporters never receive a dict holding optimizer state.
_SAVE_WORD = "save"

#: Calls that read the global RNG states (what a checkpoint holds to continue the draws).
RNG_STATE_GETTERS = frozenset(
    {"torch.get_rng_state", "torch.random.get_rng_state", "torch.cuda.get_rng_state", "torch.cuda.get_rng_state_all",
     "torch.cuda.random.get_rng_state", "torch.cuda.random.get_rng_state_all", "numpy.random.get_state",
     "random.getstate"}
)
#: Words that show RNG state saved: in a key (``"rng_state"``, ``"torch_random"``), in a name
#: the checkpoint reads (``rng_states``), in a callee (a project's ``get_rng_state()``
#: helper, a generator's ``get_state()``).
_RNG_KEY_WORDS = ("rng", "random")
_RNG_NAME_WORDS = ("rng",)
_RNG_CALLEE_WORDS = ("rng",)
_RNG_STATE_METHODS = frozenset({"get_state", "getstate"})

#: LR schedulers: torch's and timm's classes, and builders named for what they build
#: (``get_linear_schedule_with_warmup``, ``get_cosine_schedule_with_warmup``,
#: ``transformers.get_scheduler``, timm's ``create_scheduler``, Swin's ``build_scheduler``).
SCHEDULER_NAMESPACES = ("torch.optim.lr_scheduler.", "timm.scheduler.")
_SCHEDULER_BUILDER = re.compile(r"^(get|create|build|make)_\w*schedul")
#: Where torch's schedulers take ``last_epoch`` positionally (``StepLR(optimizer, step, gamma, last_epoch)``).
LAST_EPOCH_POSITIONS = {
    "StepLR": 3, "MultiStepLR": 3, "CosineAnnealingLR": 3, "LambdaLR": 2, "MultiplicativeLR": 2, "ExponentialLR": 2,
}
#: Schedulers whose ``step(value)`` passes a metric, not the epoch to set the rate for.
METRIC_STEPPED_SCHEDULERS = frozenset({"ReduceLROnPlateau", "PlateauLRScheduler"})

#: Gradient scalers for mixed precision: their loss scale is state.
GRAD_SCALERS = frozenset(
    {"torch.cuda.amp.GradScaler", "torch.amp.GradScaler", "torch.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler",
     "torch.amp.grad_scaler.GradScaler", "timm.utils.NativeScaler", "timm.utils.cuda.NativeScaler"}
)

#: Functions a training run calls once per step or per sample (their draws repeat).
PER_STEP_FUNCTIONS = frozenset({"forward", "__getitem__", "__iter__", "__call__", "training_step", "train_step"})

#: Kinds of training state kept outside the model and optimizer.
SCHEDULER, GRAD_SCALER = "LR scheduler", "GradScaler"

_TORCH_LOAD, _TORCH_SAVE = "torch.load", "torch.save"
#: Keys of a loaded checkpoint that give the run's position back (``checkpoint['epoch']``).
_POSITION_WORDS = ("epoch", "step", "iter")
#: Callees that, handed the optimizer, put its state back (``load_checkpoint(path, model, optimizer)``).
_RESTORING_WORDS = ("load", "resume", "restore")


@dataclass(frozen=True)
class Checkpoint:
    """A dict holding optimizer state, saved by ``save``."""

    save: CallFact
    #: its keys and values as written, and the items added to it before the save
    contents: tuple[cst.CSTNode, ...]
    keys: frozenset[str]  # literal string keys and ``dict(key=...)`` keywords
    #: every dotted name its contents read, with each prefix (``self.scaler.state_dict`` gives
    #: ``self``, ``self.scaler``, ``self.scaler.state_dict``)
    names: frozenset[str]
    #: calls in its contents: the resolved callee, else the dotted callee as written
    callees: frozenset[str]

    def mentions(self, name: str) -> bool:
        """The contents read the object ``name`` (``scheduler``, or ``self.scheduler``
        read as ``scheduler`` elsewhere)."""
        last = name.rpartition(".")[2]
        return name in self.names or any(n.rpartition(".")[2] == last for n in self.names)

    def has_key_with(self, *words: str) -> bool:
        return any(word in key.lower() for key in self.keys for word in words)


@dataclass(frozen=True)
class TrainingState:
    """A stateful training object the file builds: an LR scheduler or a GradScaler."""

    kind: str  # SCHEDULER or GRAD_SCALER
    name: str  # the dotted name it is assigned to
    built: cst.Call
    callee: str  # its builder, as resolved or written
    #: the calls made on it (``scheduler.step()``, ``scaler.scale(loss)``, ``loss_scaler(loss, ...)``)
    uses: tuple[CallFact, ...]
    #: its state is put back by construction or loaded from elsewhere: ``load_state_dict``
    #: called on it, ``last_epoch=`` passed or assigned, a step given the epoch
    restored: bool
    #: ``enabled=`` known false: a scaler that does nothing and keeps no state
    disabled: bool


@dataclass(frozen=True)
class WeightsOnlyResume:
    """A resume that puts back a model's weights and never its optimizer's state."""

    load: CallFact  # ``model.load_state_dict(...)`` of what ``torch.load`` read
    evidence: str  # why this load continues a run rather than starting from pretrained weights
    optimizer: str  # the stateful optimizer the file steps (its name as assigned)
    optimizer_kind: str  # its builders' last name parts: ``Adam``, ``Adam or SGD``, ``build_optimizer``
    #: where the fix starts: the weights-only save (a dict literal or the save call) when the file
    #: saves no optimizer state, else None (the state is saved; the load leaves it out)
    weights_save: cst.CSTNode | None


class Checkpoints:
    """The resume checkpoints and training state of one checked file (``FileAnalyses.checkpoints``)."""

    def __init__(self, context: "FileContext") -> None:
        self._context = context
        self._facts = context.facts

    # -- checkpoints -----------------------------------------------------------

    @cached_property
    def saved(self) -> tuple[Checkpoint, ...]:
        """Every dict holding optimizer state that the file saves, in source order; a
        dict saved at several places (``last.pt`` and ``best.pt``) once, at its first save."""
        found, seen = [], set()
        for call in self._facts.calls:
            if not _is_save(call):
                continue
            argument = call.value_node(None, 0)
            contents = self._contents(argument, call) if argument is not None else None
            passed: list[cst.BaseExpression] = []
            if contents is None:
                contents = self._helper_contents(call)
                passed = [arg.value for arg in call.node.args]
            if not contents or id(contents[0][0]) in seen:
                continue
            seen.add(id(contents[0][0]))
            checkpoint = self._checkpoint(call, contents, passed)
            if self._holds_optimizer_state(checkpoint):
                found.append(checkpoint)
        return tuple(found)

    def _contents(self, value: cst.BaseExpression, save: CallFact) -> list[tuple[cst.CSTNode, cst.CSTNode]] | None:
        """The keys and values of the dict ``value`` is, or None when it is no dict
        whose whole contents are in sight."""
        if isinstance(value, (cst.Dict, cst.Call)):
            return _dict_items(value, self._facts.names.resolve)
        if isinstance(value, cst.Name):
            scope = self._scope_of(save)
            return _bound_dict(scope, value.value, save.node, self._facts.names.resolve) if scope is not None else None
        return None

    def _helper_contents(self, call: CallFact) -> Items | None:
        """The dict a save helper of a project module builds and saves from its
        parameters (``misc.save_model(args, epoch, model, optimizer, loss_scaler)``
        whose body saves ``{'optimizer': optimizer.state_dict(), ...}``)."""
        if call.qualname is None:
            return None
        found = helper_calls(self._context, call, ("state_dict",))
        located = self._context.project.module_of(call.qualname, self._context.path) if found is not None else None
        if found is None or located is None:
            return None
        facts, calls = found
        function = facts.functions.get(located[1])
        for inner in calls:
            argument = inner.value_node(None, 0) if _is_save(inner) else None
            if argument is None:
                continue
            if isinstance(argument, (cst.Dict, cst.Call)):
                items = _dict_items(argument, facts.names.resolve)
            elif isinstance(argument, cst.Name) and function is not None:
                items = _bound_dict(function, argument.value, inner.node, facts.names.resolve)
            else:
                items = None
            if items:
                return items
        return None

    def _checkpoint(self, save: CallFact, items: Items, passed: list[cst.BaseExpression]) -> Checkpoint:
        """``passed``: what the call gives a save helper of another module; the
        objects it names may be in the helper's dict under its parameter names."""
        keys, names, callees = set(), set(), set()
        for key, _ in items:
            if isinstance(key, cst.Name):  # ``dict(key=...)``
                keys.add(key.value)
            else:
                literal = self._facts.evaluate(key).value
                if isinstance(literal, str):
                    keys.add(literal)
        for node in (n for part in [*(p for pair in items for p in pair), *passed] for n in _nodes(part)):
            if isinstance(node, (cst.Name, cst.Attribute)):
                name = dotted_name(node)
                if name is not None:
                    names.add(name)
            elif isinstance(node, cst.Call):
                callee = self._facts.names.resolve(node.func) or dotted_name(node.func)
                if callee is not None:
                    callees.add(callee)
        return Checkpoint(save, tuple(part for pair in items for part in pair), frozenset(keys), frozenset(names), frozenset(callees))

    def _holds_optimizer_state(self, checkpoint: Checkpoint) -> bool:
        """A key naming an optimizer, or the state of an object the file builds as
        an optimizer (or names as one: ``optimizer``, ``opt_g``)."""
        if checkpoint.has_key_with("optim"):
            return True
        for callee in checkpoint.callees:
            owner, _, method = callee.rpartition(".")
            if method == "state_dict" and (self._is_optimizer(owner) or "optim" in owner.rpartition(".")[2].lower()):
                return True
        return False

    def _is_optimizer(self, name: str) -> bool:
        for value in self._assignments.get(name, ()):
            callee = self._facts.names.resolve(value.func) or dotted_name(value.func) or ""
            namespace, _, last = callee.rpartition(".")
            if (namespace == "torch.optim" and last[:1].isupper()) or "optim" in last.lower():
                return True
        return False

    def rng_state_saved(self, checkpoint: Checkpoint) -> bool:
        """The checkpoint holds some RNG state: a getter's result (called in it, or
        assigned to a name it reads), or a key or name that says so."""
        if checkpoint.has_key_with(*_RNG_KEY_WORDS) or any(self._reads_rng_state(c) for c in checkpoint.callees):
            return True
        for name in checkpoint.names:
            if any(word in name.rpartition(".")[2].lower() for word in _RNG_NAME_WORDS):
                return True
            for value in self._assignments.get(name, ()):
                callee = self._facts.names.resolve(value.func) or dotted_name(value.func)
                if callee is not None and self._reads_rng_state(callee):
                    return True
        return False

    @staticmethod
    def _reads_rng_state(callee: str) -> bool:
        last = callee.rpartition(".")[2].lower()
        return callee in RNG_STATE_GETTERS or last in _RNG_STATE_METHODS or any(word in last for word in _RNG_CALLEE_WORDS)

    # -- what repeats while training ------------------------------------------------

    def repeats(self, call: CallFact) -> bool:
        """``call`` runs again and again in a run: in a loop, in a per-step method
        (``forward``, ``__getitem__``), or in a function of this file called in a loop."""
        if _in_loop(call.scope):
            return True
        function = call.scope.function
        if function is None:
            return False
        last = function.rpartition(".")[2]
        if last in PER_STEP_FUNCTIONS:
            return True
        return any(_in_loop(c.scope) and callee_name(c.node.func) == last for c in self._facts.calls)

    def repeats_beside(self, call: CallFact, save: CallFact) -> bool:
        """``call`` runs again and again in the loop that saves with ``save``: in a
        loop of the same function, in a function called in a loop there, or in a
        per-step method (``forward``, ``__getitem__``).  Draws repeated elsewhere
        (a hyperparameter search in another function) are no part of that run."""
        function = call.scope.function
        if function is not None and function.rpartition(".")[2] in PER_STEP_FUNCTIONS:
            return True
        if function == save.scope.function:
            return _in_loop(call.scope)
        last = (function or "").rpartition(".")[2]
        return function is not None and any(
            _in_loop(c.scope) and c.scope.function == save.scope.function and callee_name(c.node.func) == last
            for c in self._facts.calls
        )

    def draws_while_training(self, rng: str, save: CallFact) -> tuple[tuple[CallFact, str], ...]:
        """(call, drawing API) for each draw from ``rng`` that a run of this file keeps
        making while it trains and saves with ``save``: dropout layers, shuffling
        loaders and random samplers (each epoch), random transforms (each sample),
        and other draws of known APIs repeated beside the save (``repeats_beside``)
        outside ``__init__``.  Weight initialisation and one-off draws
        (``random_split``, a seed drawn at start-up) are left out, and so are draws
        behind an option that is off by default (``if opt.multi_scale:``); project
        helpers are not followed."""
        imports_torch = self._facts.imports_module("torch")
        summary = self._context.analyses.rng_effects
        found = []
        for call in self._facts.calls:
            if summary.off_by_default(call) is not None:
                continue
            effects = api_effects(call, self._facts, imports_torch)
            api = effects.draw_of(rng) if effects is not None else None
            if api is None:
                continue
            if "dropout" in api.lower():
                if _dropout_probability_zero(call, api, self._facts):
                    continue
            elif api in (SHUFFLING_LOADER, RANDOM_SAMPLER) or api in TORCH_RANDOM_TRANSFORMS or api.startswith(TORCH_RANDOM_TRANSFORM_PREFIXES):
                pass
            elif initialises_weights(api) or not self.repeats_beside(call, save) or (call.scope.function or "").endswith("__init__"):
                continue
            found.append((call, api))
        return tuple(found)

    def reseeded_while_training(self, rng: str) -> bool:
        """A seeding call for ``rng`` repeats (``torch.manual_seed(seed + epoch)`` in
        the epoch loop): its state is put back by construction at every resume point."""
        imports_torch = self._facts.imports_module("torch")
        for call in self._facts.calls:
            effects = api_effects(call, self._facts, imports_torch)
            if effects is not None and rng in effects.seeds and self.repeats(call):
                return True
        return False

    # -- training state ----------------------------------------------------------

    @cached_property
    def training_state(self) -> tuple[TrainingState, ...]:
        """The LR schedulers and GradScalers the file builds and assigns to a name."""
        found = []
        for name, values in self._assignments.items():
            for value in values:
                callee = self._facts.names.resolve(value.func) or dotted_name(value.func)
                kind = _kind_of(callee)
                if kind is not None:
                    found.append(self._state(kind, name, value, callee))
                    break
        return tuple(found)

    def _state(self, kind: str, name: str, built: cst.Call, callee: str) -> TrainingState:
        uses, restored = [], False
        for call in self._facts.calls:
            func = call.node.func
            receiver = dotted_name(func.value) if isinstance(func, cst.Attribute) else None
            if receiver == name:
                uses.append(call)
                if call.method == "load_state_dict":
                    restored = True
                elif call.method == "step" and call.node.args and not callee.endswith(tuple(METRIC_STEPPED_SCHEDULERS)):
                    restored = restored or kind == SCHEDULER  # ``scheduler.step(epoch)`` sets the rate from the epoch
            elif dotted_name(func) == name:
                uses.append(call)  # ``loss_scaler(loss, optimizer)``
        position = LAST_EPOCH_POSITIONS.get(callee.rpartition(".")[2]) if callee.startswith(SCHEDULER_NAMESPACES) else None
        last_epoch = _argument(built, "last_epoch", position)
        if last_epoch is not None and not self._facts.evaluate(last_epoch).is_(-1):
            restored = True
        if f"{name}.last_epoch" in self._assigned_attributes:
            restored = True
        enabled = _keyword(built, "enabled")
        disabled = enabled is not None and self._facts.evaluate(enabled).falsy
        return TrainingState(kind, name, built, callee, tuple(uses), restored, disabled)

    # -- resumes -------------------------------------------------------------------

    @cached_property
    def weights_only_resumes(self) -> tuple[WeightsOnlyResume, ...]:
        """Loads of a checkpoint into a model that continue a run (the epoch or step
        is read back from it, or it runs under a ``resume`` option) in a training
        file that steps a stateful optimizer and never loads that optimizer's state
        (``optimizer.load_state_dict``, or a load/resume helper handed the optimizer)."""
        if self._context.analyses.training is None:
            return ()
        optimizers = self._stateful_optimizers()
        if not optimizers or self._optimizer_restored(optimizers):
            return ()
        name, kinds = next(iter(optimizers.items()))
        found = []
        for call in self._facts.calls:
            if call.method != "load_state_dict" or self._is_training_object(_receiver(call)):
                continue
            source = self._loaded_checkpoint(call.value_node("state_dict", 0))
            if source is None:
                continue
            evidence = self._resume_evidence(call, source)
            if evidence is not None:
                found.append(
                    WeightsOnlyResume(call, evidence, name, " or ".join(kinds), None if self.saved else self._weights_save())
                )
        return tuple(found)

    def _stateful_optimizers(self) -> dict[str, list[str]]:
        """Name -> builders (last name part) of the optimizers the file builds that
        keep state between steps: any but plain SGD without momentum."""
        found: dict[str, list[str]] = {}
        for name, values in self._assignments.items():
            for value in values:
                callee = self._facts.names.resolve(value.func) or dotted_name(value.func) or ""
                namespace, _, last = callee.rpartition(".")
                if not ((namespace == "torch.optim" and last[:1].isupper()) or "optim" in last.lower()):
                    continue
                if last == "SGD":
                    momentum = _argument(value, "momentum", 2)
                    if momentum is None or self._facts.evaluate(momentum).is_(0, 0.0):
                        continue
                if last not in found.setdefault(name, []):
                    found[name].append(last)
        return found

    def _optimizer_restored(self, optimizers: dict[str, list[str]]) -> bool:
        for call in self._facts.calls:
            receiver = _receiver(call) or ""
            if call.method == "load_state_dict" and (receiver in optimizers or "optim" in receiver.rpartition(".")[2].lower()):
                return True
            callee = (callee_name(call.node.func) or "").lower()
            if any(word in callee for word in _RESTORING_WORDS) and any(
                dotted_name(arg.value) in optimizers for arg in call.node.args
            ):
                return True  # ``load_checkpoint(path, model, optimizer)``
        return False

    def _is_training_object(self, name: str | None) -> bool:
        """An optimizer, LR scheduler or GradScaler: not a model whose weights are loaded."""
        if name is None:
            return False
        last = name.rpartition(".")[2].lower()
        return "optim" in last or any(state.name == name for state in self.training_state) or any(
            word in last for word in ("sched", "scaler")
        )

    def _loaded_checkpoint(self, value: cst.BaseExpression | None) -> str | None:
        """What a ``load_state_dict`` argument was read from: ``torch.load(...)`` itself
        (``""``), or the name bound to it (``checkpoint`` of ``checkpoint['model']``)."""
        while isinstance(value, cst.Subscript):
            value = value.value
        if isinstance(value, cst.Call) and self._facts.names.resolve(value.func) == _TORCH_LOAD:
            return ""
        name = dotted_name(value) if value is not None else None
        if name is not None and any(
            self._facts.names.resolve(call.func) == _TORCH_LOAD for call in self._assignments.get(name, ())
        ):
            return name
        return None

    def _resume_evidence(self, load: CallFact, checkpoint: str) -> str | None:
        for condition in load.scope.conditions:
            if isinstance(condition, (cst.If, cst.While)) and "resum" in self._context.module.code_for_node(condition.test).lower():
                test = " ".join(self._context.module.code_for_node(condition.test).split())
                return f"it runs under `if {test}`"
        if "resum" in (load.scope.function or "").lower():
            return f"it runs in {load.scope.function}()"
        position = self._position_keys.get(checkpoint) if checkpoint else None
        if position is not None:
            return f"it reads the run's position back: `{checkpoint}[{position!r}]`"
        return None

    @cached_property
    def _position_keys(self) -> dict[str, str]:
        """Name -> a key naming a training position (epoch, step, iteration) read from it."""
        found: dict[str, str] = {}
        for node in _nodes(self._context.module):
            if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
                key = self._facts.evaluate(node.slice[0].slice.value).value
                name = dotted_name(node.value)
                if isinstance(key, str) and name is not None and any(word in key.lower() for word in _POSITION_WORDS):
                    found.setdefault(name, key)
        return found

    def _weights_save(self) -> cst.CSTNode | None:
        """The first save of weights without optimizer state: where that state must
        be added (the dict it saves, when bound in sight; else the save call)."""
        for call in self._facts.calls:
            if not _is_save(call) or call.qualname != _TORCH_SAVE:
                continue
            argument = call.value_node("obj", 0)
            if isinstance(argument, cst.Name):
                scope = self._scope_of(call)
                bound = _bound_dict_node(scope, argument.value, call.node) if scope is not None else None
                return bound or call.node
            return call.node
        return None

    # -- the file's assignments, read once -----------------------------------------

    @cached_property
    def _assignments(self) -> dict[str, list[cst.Call]]:
        """Name or dotted target -> the calls assigned to it, in source order."""
        return self._read[0]

    @cached_property
    def _assigned_attributes(self) -> frozenset[str]:
        return self._read[1]

    @cached_property
    def _read(self) -> tuple[dict[str, list[cst.Call]], frozenset[str]]:
        assignments: dict[str, list[cst.Call]] = {}
        attributes: set[str] = set()
        for node in _statements(self._context.module):
            if isinstance(node, (cst.Assign, cst.AugAssign)):
                for target in node.targets if isinstance(node, cst.Assign) else [node]:
                    for name in _target_names(target.target):
                        if "." in name:
                            attributes.add(name)
                        if isinstance(node.value, cst.Call) and isinstance(node, cst.Assign):
                            assignments.setdefault(name, []).append(node.value)
        return assignments, frozenset(attributes)

    def _scope_of(self, save: CallFact) -> cst.CSTNode | None:
        """The body a save call's names are bound in: its function's, or the module's;
        None in a lambda (nothing is bound there)."""
        if save.scope.in_lambda:
            return None
        if save.scope.function is None:
            return self._context.module
        top = self._context.module.body[save.scope.top_level_index]
        stack: list[tuple[cst.CSTNode, cst.CSTNode | None]] = [(top, None)]
        while stack:
            node, function = stack.pop()
            if node is save.node:
                return function
            inner = node if isinstance(node, cst.FunctionDef) else function
            stack.extend((child, inner) for child in child_nodes(node))
        return None


def _receiver(call: CallFact) -> str | None:
    func = call.node.func
    return dotted_name(func.value) if isinstance(func, cst.Attribute) else None


def _bound_dict_node(scope: cst.CSTNode, name: str, save: cst.Call) -> cst.Dict | None:
    """The dict literal last bound to ``name`` before ``save`` in its scope."""
    bound = None
    for node in _scope_nodes(scope):
        if node is save:
            return bound
        if isinstance(node, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == name for t in node.targets):
            bound = node.value if isinstance(node.value, cst.Dict) else None
    return None


def _in_loop(scope: Scope) -> bool:
    return any(isinstance(condition, (cst.For, cst.While)) for condition in scope.conditions)



def _dropout_probability_zero(call: CallFact, api: str, facts) -> bool:
    """``nn.Dropout(0.0)``, ``F.dropout(x, p=0.0)``: a dropout that drops nothing draws nothing."""
    position = 0 if api.rpartition(".")[2][:1].isupper() else 1
    probability = call.value_node("p", position)
    return probability is not None and facts.evaluate(probability).is_(0, 0.0)


def _is_save(call: CallFact) -> bool:
    func = call.node.func
    name = call.method or (func.value if isinstance(func, cst.Name) else None) or (call.qualname or "").rpartition(".")[2]
    return _SAVE_WORD in name.lower()


def _kind_of(callee: str | None) -> str | None:
    if callee is None:
        return None
    if callee in GRAD_SCALERS:
        return GRAD_SCALER
    last = callee.rpartition(".")[2]
    if callee.startswith(SCHEDULER_NAMESPACES) and last[:1].isupper():
        return SCHEDULER
    if _SCHEDULER_BUILDER.match(last.lower()):
        return SCHEDULER
    return None


def _keyword(call: cst.Call, keyword: str) -> cst.BaseExpression | None:
    return next((arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == keyword), None)


def _argument(call: cst.Call, keyword: str, position: int | None) -> cst.BaseExpression | None:
    found = _keyword(call, keyword)
    if found is not None or position is None:
        return found
    positional = [arg for arg in call.args if arg.keyword is None]
    if any(arg.star for arg in positional) or len(positional) <= position:
        return None
    return positional[position].value


def _target_names(target: cst.BaseExpression) -> Iterator[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            if not isinstance(element, cst.StarredElement):
                yield from _target_names(element.value)
        return
    name = dotted_name(target)
    if name is not None:
        yield name


Items = list[tuple[cst.CSTNode, cst.CSTNode]]


def _dict_items(value: cst.BaseExpression, resolve) -> Items | None:
    """The (key, value) pairs of a dict literal or a ``dict(key=value, ...)`` call
    (a keyword's key is its Name); None for anything else, or when something is
    spread into it (``**state``)."""
    if isinstance(value, cst.Dict):
        items: Items = []
        for element in value.elements:
            if not isinstance(element, cst.DictElement):
                return None
            items.append((element.key, element.value))
        return items
    if isinstance(value, cst.Call) and resolve(value.func) == "dict":
        items = []
        for arg in value.args:
            if arg.star:
                return None
            if arg.keyword is not None:
                items.append((arg.keyword, arg.value))
            else:
                inner = _dict_items(arg.value, resolve)
                if inner is None:
                    return None
                items += inner
        return items
    return None


def _bound_dict(scope: cst.CSTNode, name: str, save: cst.Call, resolve) -> Items | None:
    """What ``name`` holds when ``save`` runs, read in source order through its
    scope: the last dict bound to it, with the items added since; None when it is
    bound to something else, spread into, or handed to a call other than a save in between."""
    items: Items | None = None
    for node in _scope_nodes(scope):
        if node is save:
            return items
        if isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            for target in targets:
                if isinstance(target, cst.Name) and target.value == name:
                    if isinstance(node, cst.AugAssign):
                        added = _dict_items(node.value, resolve)
                        items = None if items is None or added is None else items + added
                    else:
                        items = _dict_items(node.value, resolve) if node.value is not None else None
                elif isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name) and target.value.value == name:
                    index = target.slice[0].slice if len(target.slice) == 1 else None
                    items = items + [(index.value, node.value)] if items is not None and isinstance(index, cst.Index) else None
        elif isinstance(node, cst.Call) and items is not None:
            func = node.func
            if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == name:
                if func.attr.value == "update":
                    for arg in node.args:
                        added = [(arg.keyword, arg.value)] if arg.keyword is not None else _dict_items(arg.value, resolve)
                        items = None if added is None or arg.star or items is None else items + added
            elif any(isinstance(arg.value, cst.Name) and arg.value.value == name for arg in node.args):
                callee = dotted_name(func) or ""
                if _SAVE_WORD not in callee.rpartition(".")[2].lower():
                    items = None  # handed over: the callee may add to it
    return None


def _scope_nodes(scope: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The nodes of a function's or the module's body in source order, not entering nested scopes."""
    stack = list(reversed(child_nodes(scope)))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            stack.extend(reversed(child_nodes(node)))


def _statements(root: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every statement under ``root``, nested bodies included, without entering
    expressions (where no assignment statement can be)."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (cst.BaseExpression, cst.BaseSmallStatement)):
            stack.extend(reversed(child_nodes(node)))


def _nodes(root: cst.CSTNode) -> Iterator[cst.CSTNode]:
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child_nodes(node))
