"""Gradient flow: where no parameter's gradient can pass.

Some ops are nondeterministic only in their backward (bilinear ``interpolate``,
reflect ``pad``, ``gather``, adaptive pooling: atomicAdd on CUDA).  That
backward runs only when a gradient flows through the op towards a parameter;
on input images, data-pipeline tensors and constant tables it never runs.  This
analysis says, for a call site and the tensor it works on, why no gradient can
pass there, or None when one may (a module's ``forward`` and what it calls, a
loss on predictions: the usual case).

A gradient cannot pass:

- **where autograd is off**: inside ``with torch.no_grad():`` /
  ``inference_mode()`` and in functions decorated with them, and on what such
  a block computed, used after it (``with torch.no_grad(): out = model(x)``
  then ``F.interpolate(out, ...)``);
- **in evaluation**: a function that puts a model in eval mode and runs no
  backward pass (no ``.backward()``, ``.step()``, ``.train()``,
  ``torch.autograd.grad``): a validation or test loop;
- **in the data pipeline**: methods of dataset and loader classes (a
  ``torch.utils.data.Dataset`` subclass, or a class that is not an
  ``nn.Module`` and serves items or batches through ``__getitem__`` /
  ``__iter__``), collate functions (passed as ``collate_fn=``) and transforms
  (named in a ``Compose([...])`` or ``Lambda(...)``);
- **in functions only called from such places** (every call site in the file is
  one of them), or only where the caller detaches the result (``f(x).detach()``,
  or ``z = f(x)`` with ``z = z.detach()`` as the next statement: NeRF's
  hierarchical sampling); for a function nested in another, its calls in the enclosing
  function, made by its name or through a local name it was assigned to,
  alone or in a dispatch table (``fn = [basic, mirrored][level]; fn(x)``);
- **on input data before it enters a model**: outside a module's methods, a
  parameter or loop variable resized on its way into a model the function was
  handed (``inp = F.interpolate(samples, ...); model(inp)``);
- **on a batch a data loader yields**: in ``for images, target in loader:``,
  the loop's names, their items and fields (``batch["cond"]``), moved, cast or
  resized (multi-scale training resizes inputs and targets alike), unless the
  loop asks for their gradient (``images.requires_grad_()``, adversarial
  training);
- **on tensors that carry no gradient**: registered buffers (``self.x`` after
  ``register_buffer("x", ...)``), tensors built from constants (``torch.arange``,
  ``torch.tensor`` without ``requires_grad=True``), detached or integer tensors
  (``.detach()``, ``.long()``), one-tensor functions of those
  (``F.softmax(x)``), names assigned only such values in the function, and
  parameters of file-local functions that every call site passes such a value.

A module-level function's callers are looked for in the whole project (its
other files that mention the function's name, through the project index,
star imports included):
called only where no gradient flows, or a private one (``_crop``) called
nowhere, it passes none (a public one may be called by the project's users);
called anywhere a gradient may flow (a training loss on a generator's output),
it may.  Where a mention is not a call (the function passed on, stored in a
registry, named in a config file), or the project cannot be read, only this
file's calls decide.  Methods are decided from this file alone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst

from detaudit.knowledge.apis import DATA_API_ALIASES, DATALOADER
from detaudit.static.engine.facts import CallFact, FileFacts, Scope
from detaudit.static.engine.names import callee_name
from detaudit.static.engine.walk import child_nodes, iter_nodes, walk

if TYPE_CHECKING:
    from detaudit.static.context import FileContext

#: Context managers and decorators under which autograd records nothing.
NO_GRAD_CONTEXTS = frozenset(
    {"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.inference_mode",
     "torch.autograd.grad_mode.no_grad", "torch.autograd.grad_mode.inference_mode"}
)

#: Bases that make a class a dataset (its methods run on data, not parameters).
DATASET_BASES = frozenset(
    {"torch.utils.data.Dataset", "torch.utils.data.IterableDataset", "torch.utils.data.TensorDataset",
     "torch.utils.data.dataset.Dataset", "torch.utils.data.dataset.IterableDataset"}
)
#: Methods through which a non-module class serves items or batches.
DATA_SERVING_METHODS = ("__getitem__", "__iter__", "__next__")
#: Bases that make a class a module (its methods may carry gradients): ``torch.nn.*`` and Lightning's.
MODULE_BASE_PREFIXES = ("torch.nn.", "lightning.", "pytorch_lightning.")
#: Callables whose arguments are transforms (``transforms.Compose([...])``, ``transforms.Lambda(f)``).
TRANSFORM_HOLDERS = ("Compose", "Lambda", "RandomApply", "RandomChoice", "RandomOrder")
COLLATE_KEYWORD = "collate_fn"

#: torch factories that build a tensor from constants or shapes: no gradient unless ``requires_grad=True``.
CONSTANT_TENSOR_FACTORIES = frozenset(
    f"torch.{name}"
    for name in ("tensor", "as_tensor", "from_numpy", "zeros", "ones", "full", "empty", "arange", "linspace",
                 "logspace", "eye", "zeros_like", "ones_like", "full_like", "empty_like", "randint", "randperm")
)
#: Tensor methods whose result carries no gradient (detached, or an integer/boolean dtype).
GRADLESS_METHODS = frozenset(
    {"detach", "long", "int", "short", "byte", "char", "bool", "argmax", "argmin", "argsort", "nonzero"}
)
#: Tensor methods that keep their receiver's gradient-ness (device and layout moves, views, repeats).
GRADIENT_PRESERVING_METHODS = frozenset(
    {"to", "cuda", "cpu", "float", "double", "half", "bfloat16", "view", "reshape", "unsqueeze", "squeeze",
     "clone", "contiguous", "expand", "expand_as", "permute", "transpose", "flatten", "type_as",
     "repeat", "repeat_interleave", "tile", "flip", "roll"}
)
#: Functions that resize, pad or flip a tensor without parameters: applied to a batch, the result is still data.
DATA_SIDE_TRANSFORMS = frozenset(
    {"torch.nn.functional.interpolate", "torch.nn.functional.upsample", "torch.nn.functional.upsample_bilinear",
     "torch.nn.functional.upsample_nearest", "torch.nn.functional.pad", "torch.flip", "torch.roll"}
)
#: Functions of one tensor that keep its gradient-ness: ``x = F.softmax(x, dim=1)`` is as gradient-free as ``x`` was.
GRADIENT_PRESERVING_FUNCTIONS = DATA_SIDE_TRANSFORMS | frozenset(
    f"{module}.{name}"
    for module in ("torch", "torch.nn.functional")
    for name in ("softmax", "log_softmax", "sigmoid", "tanh", "relu", "normalize")
)
#: Methods that leave evaluation: a function calling one of them may train (``model.train()``, ``loss.backward()``).
EVALUATION_ENDERS = frozenset({"train", "backward", "manual_backward", "step"})
#: Functions that run a backward pass.
AUTOGRAD_CALLS = frozenset({"torch.autograd.backward", "torch.autograd.grad"})
#: Wrappers of an iterable whose items are the wrapped iterable's (``enumerate(loader)``, ``tqdm(loader)``).
ITERATION_WRAPPERS = frozenset({"enumerate", "zip", "iter", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "itertools.islice"})
_MAX_DEPTH = 6


@dataclass
class _Function:
    """What the gradient analysis needs to know about one file-local function."""

    node: cst.FunctionDef
    owner: str | None  # the class a method belongs to
    assignments: dict[str, list[cst.BaseExpression]] = field(default_factory=dict)
    #: names bound as ``for`` targets (loop variables: their values come from the iterable)
    loop_targets: set[str] = field(default_factory=set)
    #: value node id -> the name it is assigned to
    target_of: dict[int, str] = field(default_factory=dict)
    #: ids of the values assigned inside a ``no_grad()`` block (computed without a gradient)
    assigned_without_grad: set[int] = field(default_factory=set)


class _Assignments(cst.CSTVisitor):
    def __init__(self, function: _Function, is_no_grad_block: Callable[[cst.With], bool]) -> None:
        super().__init__()
        self.function = function
        self.is_no_grad_block = is_no_grad_block
        self.no_grad_depth = 0

    def visit_With(self, node: cst.With) -> None:
        self.no_grad_depth += self.is_no_grad_block(node)

    def leave_With(self, original_node: cst.With) -> None:
        self.no_grad_depth -= self.is_no_grad_block(original_node)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            names = _names_in(target.target)
            for name in names:
                self.function.assignments.setdefault(name, []).append(node.value)
            if isinstance(target.target, cst.Name):
                self.function.target_of[id(node.value)] = target.target.value
            if names and self.no_grad_depth:
                self.function.assigned_without_grad.add(id(node.value))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.target, cst.Name):
            self.function.assignments.setdefault(node.target.value, []).append(node.value)

    def visit_For(self, node: cst.For) -> None:
        for name in _names_in(node.target):
            self.function.loop_targets.add(name)


def _names_in(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _names_in(element.value)]
    return []


class GradFlow:
    """Where no parameter's gradient can pass in one file (``FileAnalyses.grad_flow``)."""

    def __init__(
        self,
        facts: FileFacts,
        source: str | None = None,
        project_callers: "Callable[[str], list[tuple[GradFlow, CallFact]] | None] | None" = None,
    ) -> None:
        self.facts = facts
        self._source = source
        self._project_callers = project_callers
        self._external: dict[str, list[tuple[GradFlow, CallFact]] | None] = {}
        self._functions: dict[str, _Function] = {}
        self._verdicts: dict[str, str | None] = {}
        self._nested_verdicts: dict[str, str | None] = {}  # "enclosing.nested" -> verdict
        self._deciding: set[str] = set()
        self._buffers: frozenset[str] | None = None
        self._pipeline_names: frozenset[str] | None = None
        self._class_kinds: dict[str, str | None] = {}
        self._loop_bodies: dict[int, _LoopBody] = {}
        self._calls_by_function: dict[str | None, list[CallFact]] | None = None

    # -- the question ------------------------------------------------------------

    def blocked(self, call: CallFact, operand: cst.BaseExpression | None = None) -> str | None:
        """Why no parameter's gradient can pass through ``call`` (applied to
        ``operand``), or None when one may."""
        function = self._defining_function(call.scope.function)
        return (
            self._no_grad_block(call.scope)
            or self._nested_verdict(call.scope.function, function)
            or self._function_verdict(function)
            or (self._gradless(operand, function, 0) if operand is not None else None)
            or self._input_before_a_model(call, operand, function)
            or (self._loader_batch(call, operand) if operand is not None else None)
        )

    def evaluating(self, call: CallFact) -> str | None:
        """Why ``call`` runs in evaluation code, or None: inside a no_grad() block,
        or in a function that puts a model in eval mode and never steps."""
        function = self._defining_function(call.scope.function)
        if self._no_grad_block(call.scope):
            return "inside a no_grad()/inference_mode() block"
        if function is not None and self._evaluates(function):
            return f"{function.rpartition('.')[2]}() evaluates"
        return None

    def _loader_batch(self, call: CallFact, operand: cst.BaseExpression) -> str | None:
        """``for images, target in loader: target = F.interpolate(target, ...)``:
        what a data loader yields never requires a gradient."""
        name = self._batch_source(operand)
        if name is None:
            return None
        for loop in reversed(call.scope.conditions):
            if isinstance(loop, cst.For) and self._iterates_loader(loop.iter) and self._batch_name(name, loop, 0):
                return f"`{name}` is a batch from a data loader: data, without a gradient"
        return None

    def _iterates_loader(self, iterable: cst.BaseExpression) -> bool:
        """A DataLoader, or a name saying it is one (``train_loader``, ``self.val_dataloader``),
        possibly wrapped (``enumerate(loader)``, ``tqdm(loader)``)."""
        while isinstance(iterable, cst.Call):
            callee = self.facts.names.resolve(iterable.func) or (iterable.func.value if isinstance(iterable.func, cst.Name) else None)
            if DATA_API_ALIASES.get(callee, callee) == DATALOADER:
                return True
            if callee not in ITERATION_WRAPPERS or not iterable.args:
                return False
            iterable = iterable.args[0].value
        name = iterable.attr.value if isinstance(iterable, cst.Attribute) else iterable.value if isinstance(iterable, cst.Name) else ""
        if "loader" in name.lower():
            return True
        assigned = self.facts.simple_assignments.get(name, []) if isinstance(iterable, cst.Name) else []
        return bool(assigned) and all(
            isinstance(value, cst.Call) and DATA_API_ALIASES.get(resolved := self.facts.names.resolve(value.func), resolved) == DATALOADER
            for value in assigned
        )

    def _batch_name(self, name: str, loop: cst.For, depth: int) -> bool:
        """``name`` holds only what ``loop`` (over a loader) yields: bound by its target,
        or assigned in its body from such names, their items, moves and resizes."""
        if depth > _MAX_DEPTH:
            return False
        body = self._loop_bodies.get(id(loop))
        if body is None:
            body = self._loop_bodies[id(loop)] = _LoopBody.of(loop)  # the tree outlives this analysis: ids stay unique
        if name in body.gradient_requested:
            return False
        bound = name in _names_in(loop.target)
        sources = [self._batch_source(value) for value in body.assignments.get(name, [])]
        if None in sources:
            return False
        others = [source for source in sources if source != name]
        if not bound and not others:
            return False
        return all(self._batch_name(source, loop, depth + 1) for source in others)

    def _batch_source(self, value: cst.BaseExpression) -> str | None:
        """The name a value is taken from when it is that name's item, field, move or
        data-side resize (``batch["image"]``, ``x.cuda()``, ``F.interpolate(x, ...)``)."""
        while True:
            if isinstance(value, cst.Name):
                return value.value
            if isinstance(value, (cst.Subscript, cst.Attribute)):
                value = value.value
            elif isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in GRADIENT_PRESERVING_METHODS | GRADLESS_METHODS:
                value = value.func.value  # moved, viewed or cast (``target.long()``): still the batch
            elif isinstance(value, cst.Call) and self.facts.names.resolve(value.func) in DATA_SIDE_TRANSFORMS and value.args:
                value = value.args[0].value
            else:
                return None

    def _input_before_a_model(self, call: CallFact, operand: cst.BaseExpression | None, function: str | None) -> str | None:
        """``def multi_scale(samples, model): inp = F.interpolate(samples, ...); model(inp)``:
        outside a module's methods, an input (a parameter or loop variable never
        reassigned) resized or padded on its way into a model the function was
        handed carries no parameter gradient."""
        if function is None or not isinstance(operand, cst.Name):
            return None
        local = self._function(function)
        if local.owner is not None and self._class_kind(local.owner) == "module":
            return None  # a module's input may be the previous layer's output
        name = operand.value
        if _parameter_position(local.node, name) is None and name not in local.loop_targets:
            return None
        if any(not self._derives_from(value, name) for value in local.assignments.get(name, [])):
            return None
        result = local.target_of.get(id(call.node))
        if result is None:
            return None
        models = {p.name.value for p in (*local.node.params.posonly_params, *local.node.params.params)}
        for site in self.facts.calls:
            callee = site.node.func
            if (
                isinstance(callee, cst.Name)
                and callee.value in models
                and self._defining_function(site.scope.function) == function
                and any(isinstance(arg.value, cst.Name) and arg.value.value == result for arg in site.node.args)
            ):
                return f"`{name}` is input data, resized on its way into `{callee.value}`"
        return None

    # -- contexts ----------------------------------------------------------------

    def _no_grad_block(self, scope: Scope) -> str | None:
        for condition in scope.conditions:
            if isinstance(condition, cst.With) and self._is_no_grad_block(condition):
                return "inside a no_grad()/inference_mode() block"
        return None

    def _is_no_grad_block(self, block: cst.With) -> bool:
        return any(self._is_no_grad(item.item) for item in block.items)

    def _is_no_grad(self, node: cst.BaseExpression) -> bool:
        callee = node.func if isinstance(node, cst.Call) else node
        return self.facts.names.resolve(callee) in NO_GRAD_CONTEXTS

    def _defining_function(self, scope_function: str | None) -> str | None:
        """The file-level function or method (``Net.forward``) a scope sits in; a
        nested function counts as part of the function that defines it."""
        if scope_function is None:
            return None
        parts = scope_function.split(".")
        for end in range(len(parts), 0, -1):
            name = ".".join(parts[:end])
            if name in self.facts.functions:
                return name
        return None

    def _function(self, name: str) -> _Function:
        found = self._functions.get(name)
        if found is None:
            owner = name.rpartition(".")[0] or None
            found = _Function(self.facts.functions[name], owner if owner in self.facts.classes else None)
            walk(found.node, [_Assignments(found, self._is_no_grad_block)])  # read-only: libcst's visit would rebuild the function
            self._functions[name] = found
        return found

    def _function_verdict(self, name: str | None) -> str | None:
        if name is None:
            return None
        if name in self._verdicts:
            return self._verdicts[name]
        if name in self._deciding:
            return None  # recursion: decided by the other call sites
        self._deciding.add(name)
        try:
            verdict = self._decide_function(name)
        finally:
            self._deciding.discard(name)
        self._verdicts[name] = verdict
        return verdict

    def _decide_function(self, name: str) -> str | None:
        function = self._function(name)
        short = name.rpartition(".")[2]
        if any(self._is_no_grad(decorator.decorator) for decorator in function.node.decorators):
            return f"{short}() is decorated with no_grad()/inference_mode()"
        if function.owner is not None:
            kind = self._class_kind(function.owner)
            if kind == "data":
                return f"{function.owner} serves data (a dataset or loader class): its tensors carry no parameter gradient"
            if function.owner in self._data_pipeline_names():
                return f"{function.owner} is a transform of the data pipeline"
        elif short in self._data_pipeline_names():
            return f"{short}() is a collate function or transform of the data pipeline"
        if self._evaluates(name):
            return f"{short}() evaluates: it puts a model in eval mode and never calls backward()"
        sites = self._call_sites(name, function)
        reasons = [self._site_verdict(site) for site in sites]
        external = self._external_sites(short, sites) if function.owner is None else None
        if external is not None:
            reasons += [flow._site_verdict(site) for flow, site in external]
            if not reasons and short.startswith("_"):
                return f"{short}() is called nowhere in the project"  # a private helper: dead code
        if reasons and all(reasons):
            return f"{short}() is only called where no gradient flows ({reasons[0]})"
        return None

    def _site_verdict(self, site: CallFact) -> str | None:
        """Why no gradient flows where the call ``site`` (of this file) is made, or None."""
        function = self._defining_function(site.scope.function)
        return self._no_grad_block(site.scope) or self._function_verdict(function) or self._result_detached(site, function)

    def _result_detached(self, site: CallFact, function: str | None) -> str | None:
        """``f(x).detach()``, or ``y = f(x)`` with ``y = y.detach()`` as the very next
        statement: nothing ``f`` computed reaches a loss, so no gradient flows back into it."""
        if function is None:
            return None
        node = self._function(function).node
        for candidate in iter_nodes(node):
            if (
                type(candidate) is cst.Call
                and type(candidate.func) is cst.Attribute
                and candidate.func.value is site.node
                and candidate.func.attr.value == "detach"
            ):
                return "its result is detached where it is called"
        name = self._function(function).target_of.get(id(site.node))
        if name is None:
            return None
        for body in _statement_bodies(node):
            for statement, following in zip(body, body[1:]):
                if _assigns(statement, name, lambda value: value is site.node) and _assigns(
                    following, name, lambda value: _is_detach_of(value, name)
                ):
                    return f"its result `{name}` is detached right after the call"  # ``name = name.detach()...``
        return None

    def _external_sites(self, short: str, sites: list[CallFact]) -> list[tuple["GradFlow", CallFact]] | None:
        """The calls of this file's module-level function ``short`` in the project's
        other files (with the analysis of the file each is in); None when they are not
        known: no project view, or the function is named here other than in calls."""
        if self._project_callers is None or self._source is None:
            return None
        if short not in self._external:
            # its definition and its calls are all the file says of it (a word count: a comment or
            # string naming it leaves the question to this file's calls, the safe side)
            known = len(re.findall(rf"\b{re.escape(short)}\b", self._source)) == len(sites) + 1
            self._external[short] = self._project_callers(short) if known else None
        return self._external[short]

    def _evaluates(self, name: str) -> bool:
        """The function calls ``model.eval()``, never ``.train()``, and runs no
        backward pass (``loss.backward()``, ``accelerator.backward(loss)``,
        ``torch.autograd.grad``): a validation or test loop."""
        if self._calls_by_function is None:
            self._calls_by_function = {}
            for call in self.facts.calls:
                self._calls_by_function.setdefault(self._defining_function(call.scope.function), []).append(call)
        methods = {call.method for call in self._calls_by_function.get(name, ()) if call.method is not None}
        qualnames = {call.qualname for call in self._calls_by_function.get(name, ())}
        return (
            "eval" in methods
            and not methods & EVALUATION_ENDERS
            and not qualnames & AUTOGRAD_CALLS
        )

    def _nested_verdict(self, scope_function: str | None, enclosing: str | None) -> str | None:
        """For code in a function nested in the file-level function ``enclosing``
        (``infer.mirrored``): why no gradient flows through it, when every call
        that can reach the nested function is made where none does."""
        if scope_function is None or enclosing is None or scope_function == enclosing:
            return None
        nested = scope_function[len(enclosing) + 1 :].partition(".")[0]
        key = f"{enclosing}.{nested}"
        if key not in self._nested_verdicts:
            sites = self._nested_call_sites(enclosing, nested)
            reasons = [self._no_grad_block(site.scope) for site in sites or ()]
            self._nested_verdicts[key] = (
                f"{nested}() is only called where no gradient flows ({reasons[0]})" if sites and all(reasons) else None
            )
        return self._nested_verdicts[key]

    def _nested_call_sites(self, enclosing: str, nested: str) -> list[CallFact] | None:
        """The calls in ``enclosing`` that can run its nested function ``nested``:
        by its name, or through a local name assigned it directly or in a
        list, tuple or dict literal (subscripted or not).  None when the
        function escapes otherwise (passed on, returned, stored elsewhere)."""
        parents = _parents(self.facts.functions[enclosing])  # id(node) -> (node, its parent)
        callers: set[str] = {nested}
        for node, parent in parents.values():
            if not (isinstance(node, cst.Name) and node.value == nested):
                continue
            if isinstance(parent, cst.FunctionDef) and parent.name is node:
                continue  # its definition
            if isinstance(parent, cst.Call) and parent.func is node:
                continue  # a call by its name
            holder = node
            if isinstance(parent, (cst.Element, cst.DictElement)) and parent.value is node:
                holder = parents[id(parent)][1]  # the literal
                subscript = parents[id(holder)][1]
                if isinstance(subscript, cst.Subscript) and subscript.value is holder:
                    holder = subscript
            assigned = parents[id(holder)][1]
            if not (isinstance(assigned, cst.Assign) and assigned.value is holder):
                return None
            for target in assigned.targets:
                if not isinstance(target.target, cst.Name):
                    return None
                callers.add(target.target.value)
        sites = []
        for call in self.facts.calls:
            func = call.node.func
            if isinstance(func, cst.Subscript):
                func = func.value
            if isinstance(func, cst.Name) and func.value in callers and self._defining_function(call.scope.function) == enclosing:
                sites.append(call)
        return sites

    def _call_sites(self, name: str, function: _Function) -> list[CallFact]:
        """Calls of a file-local function by its name, or of a method through ``self.``/``cls.``."""
        short = name.rpartition(".")[2]
        sites = []
        for call in self.facts.calls:
            func = call.node.func
            if function.owner is None:
                if isinstance(func, cst.Name) and func.value == short and not self.facts.names.is_bound(short):
                    sites.append(call)
            elif (
                isinstance(func, cst.Attribute)
                and func.attr.value == short
                and isinstance(func.value, cst.Name)
                and func.value.value in ("self", "cls")
                and (call.scope.function or "").startswith(function.owner + ".")
            ):
                sites.append(call)
        return sites

    # -- classes and the data pipeline -------------------------------------------

    def _class_kind(self, name: str) -> str | None:
        """``"data"`` for a dataset or loader class, ``"module"`` for an ``nn.Module``, else None."""
        if name in self._class_kinds:
            return self._class_kinds[name]
        self._class_kinds[name] = None  # a cycle of bases decides nothing
        node = self.facts.classes[name]
        kind = None
        for base in node.bases:
            qualname = self.facts.names.resolve(base.value)
            qualname = DATA_API_ALIASES.get(qualname, qualname)
            local = base.value.value if isinstance(base.value, cst.Name) and base.value.value in self.facts.classes else None
            if qualname in DATASET_BASES:
                kind = "data"
            elif qualname is not None and qualname.startswith(MODULE_BASE_PREFIXES):
                kind = "module"
            elif local is not None:
                kind = self._class_kind(local)
            if kind is not None:
                break
        if kind is None and any(f"{name}.{method}" in self.facts.functions for method in DATA_SERVING_METHODS):
            kind = "data"
        self._class_kinds[name] = kind
        return kind

    def _data_pipeline_names(self) -> frozenset[str]:
        """Names of functions and classes the file hands to the data pipeline:
        ``collate_fn=f``, ``Compose([Resize(), MyTransform()])``, ``Lambda(f)``."""
        if self._pipeline_names is None:
            found: set[str] = set()
            for call in self.facts.calls:
                collate = call.value_node(COLLATE_KEYWORD)
                if isinstance(collate, cst.Name):
                    found.add(collate.value)
                callee = (call.qualname or call.method or "").rpartition(".")[2]
                if callee in TRANSFORM_HOLDERS:
                    for arg in call.node.args:
                        elements = arg.value.elements if isinstance(arg.value, (cst.List, cst.Tuple)) else [arg]
                        for element in elements:
                            value = element.value
                            value = value.func if isinstance(value, cst.Call) else value
                            if isinstance(value, cst.Name):
                                found.add(value.value)
            self._pipeline_names = frozenset(found)
        return self._pipeline_names

    # -- tensors -----------------------------------------------------------------

    def _registered_buffers(self) -> frozenset[str]:
        """Names given to ``register_buffer`` (also through an alias such as
        ``register_buffer = lambda name, val: self.register_buffer(name, val.float())``)."""
        if self._buffers is None:
            names = set()
            for call in self.facts.calls:
                callee = call.method or (call.node.func.value if isinstance(call.node.func, cst.Name) else None)
                if callee == "register_buffer":
                    value = self.facts.evaluate(call.value_node("name", 0))
                    if isinstance(value.value, str):
                        names.add(value.value)
            self._buffers = frozenset(names)
        return self._buffers

    def _gradless(self, node: cst.BaseExpression, function: str | None, depth: int) -> str | None:
        """Why the tensor ``node`` (an expression in ``function``) carries no gradient, or None."""
        if depth > _MAX_DEPTH:
            return None
        if isinstance(node, cst.Attribute):
            if isinstance(node.value, cst.Name) and node.value.value == "self" and node.attr.value in self._registered_buffers():
                return f"self.{node.attr.value} is a registered buffer"
            return None
        if isinstance(node, cst.Call):
            qualname = self.facts.names.resolve(node.func)
            if qualname in GRADIENT_PRESERVING_FUNCTIONS and node.args:
                return self._gradless(node.args[0].value, function, depth + 1)
            if qualname in CONSTANT_TENSOR_FACTORIES:
                wants_grad = any(a.keyword is not None and a.keyword.value == "requires_grad" and not self.facts.evaluate(a.value).falsy for a in node.args)
                return None if wants_grad else f"{qualname}() builds a tensor without a gradient"
            if isinstance(node.func, cst.Attribute):
                method = node.func.attr.value
                if method in GRADLESS_METHODS:
                    return f".{method}() gives a tensor without a gradient"
                if method in GRADIENT_PRESERVING_METHODS:
                    return self._gradless(node.func.value, function, depth + 1)
            return None
        if isinstance(node, cst.Name):
            if function is not None:
                return self._gradless_name(node.value, function, depth)
            assigned = self.facts.simple_assignments.get(node.value)
            if assigned and len(assigned) == 1:
                return self._gradless(assigned[0], None, depth + 1)
        return None

    def _derives_from(self, value: cst.BaseExpression, name: str) -> bool:
        """``x.to(device)``, ``x.float().cuda()``, ``F.softmax(x, dim=1)``: the value is
        ``name`` moved, viewed or transformed without adding a parameter."""
        while True:
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in GRADIENT_PRESERVING_METHODS:
                value = value.func.value
            elif isinstance(value, cst.Call) and value.args and self.facts.names.resolve(value.func) in GRADIENT_PRESERVING_FUNCTIONS:
                value = value.args[0].value
            else:
                return isinstance(value, cst.Name) and value.value == name

    def _gradless_name(self, name: str, function: str, depth: int) -> str | None:
        local = self._function(function)
        if name in local.loop_targets:
            return None
        values = local.assignments.get(name, [])
        # ``x = x.to(device)`` keeps what ``x`` was; every other value must be gradless itself
        other = [v for v in values if not self._derives_from(v, name)]
        position = _parameter_position(local.node, name)
        if position is None and not other:
            return None  # a global or a closure variable: not followed
        reasons = []
        for value in other:
            reason = (
                f"`{name}` is computed inside a no_grad()/inference_mode() block"
                if id(value) in local.assigned_without_grad
                else self._gradless(value, function, depth + 1)
            )
            if reason is None:
                return None
            reasons.append(reason)
        if position is None:
            return reasons[0]
        sites = self._call_sites(function, local)
        offset = 1 if local.owner is not None else 0  # ``self`` is not passed at a method's call site
        external = self._external_sites(function, sites) if local.owner is None else None
        everywhere = [(self, site) for site in sites] + (external or [])
        if not everywhere:
            return None
        for flow, site in everywhere:
            passed = site.value_node(name, position - offset)
            if passed is None or flow._gradless(passed, flow._defining_function(site.scope.function), depth + 1) is None:
                return None
        return f"every call of {function.rpartition('.')[2]}() passes `{name}` a tensor without a gradient"


@dataclass
class _LoopBody:
    """Assignments in a ``for`` loop's body, and the names it asks gradients of."""

    assignments: dict[str, list[cst.BaseExpression]] = field(default_factory=dict)
    gradient_requested: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, loop: cst.For) -> "_LoopBody":
        found = cls()
        for node, _ in _parents(loop.body).values():
            if isinstance(node, cst.Assign):
                for target in node.targets:
                    if isinstance(target.target, cst.Name):
                        found.assignments.setdefault(target.target.value, []).append(node.value)
                    elif isinstance(target.target, cst.Attribute) and target.target.attr.value == "requires_grad":
                        found.gradient_requested.update(_names_in(target.target.value))
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "requires_grad_":
                found.gradient_requested.update(_names_in(node.func.value))
        return found


class ProjectCallers:
    """Where the project's other files call a module-level function of the checked
    file, each call with the gradient analysis of its file (read through the
    project index; each file read is a dependency of the checked file's result)."""

    def __init__(self, context: "FileContext") -> None:
        self._context = context
        self._flows: dict[Path, GradFlow] = {}

    def __call__(self, function: str) -> list[tuple[GradFlow, CallFact]] | None:
        """None when a file mentions ``function`` other than by calls that resolve."""
        index = self._context.project
        here = Path(os.path.abspath(self._context.path))
        files = index.locator.files_mentioning(function, here)
        if files is None:
            return None
        found = []
        for path in files:
            summary = index.summary(path)
            digest = index.digest(path)
            if summary is None or summary.tree is None or digest is None:
                return None
            self._context.dependencies[str(path)] = digest
            calls = [call for call in summary.facts.calls if callee_name(call.node.func) == function]
            if summary.name_mentions[function] != len(calls):
                return None  # passed on or stored: it may be called where this cannot see
            flow = self._flows.get(path)
            if flow is None:
                flow = self._flows[path] = GradFlow(summary.facts)
            for call in calls:
                qualname = call.qualname
                if qualname is None and type(call.node.func) is cst.Name:  # ``from helpers import *``
                    qualname = index.star_imported(function, summary.facts.names.star_modules, path)
                if qualname is None:
                    return None  # ``obj.function(...)`` on something unknown: it may be this one
                located = index.module_of(qualname, path)
                if located is not None and Path(os.path.abspath(located[0])) == here and located[1] == function:
                    found.append((flow, call))
        return found



def _statement_bodies(root: cst.CSTNode) -> Iterator[Sequence[cst.CSTNode]]:
    """Every block of statements under ``root`` (function bodies, branches, loops), each in order."""
    for node in iter_nodes(root):
        if type(node) is cst.IndentedBlock:
            yield node.body


def _assigns(statement: cst.CSTNode, name: str, value_test: Callable[[cst.BaseExpression], bool]) -> bool:
    """``statement`` is ``name = <value>`` with ``value_test(value)``."""
    if type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1:
        return False
    small = statement.body[0]
    return (
        type(small) is cst.Assign
        and len(small.targets) == 1
        and type(small.targets[0].target) is cst.Name
        and small.targets[0].target.value == name
        and value_test(small.value)
    )


def _is_detach_of(value: cst.BaseExpression, name: str) -> bool:
    """``name.detach()``, or a method chain that starts with it (``name.detach().cpu().numpy()``)."""
    while type(value) is cst.Call and type(value.func) is cst.Attribute:
        receiver = value.func.value
        if value.func.attr.value == "detach" and type(receiver) is cst.Name and receiver.value == name:
            return True
        value = receiver
    return False


def _parents(root: cst.CSTNode) -> dict[int, tuple[cst.CSTNode, cst.CSTNode | None]]:
    """id of every node under ``root`` (formatting excepted) -> (the node, its parent)."""
    parents: dict[int, tuple[cst.CSTNode, cst.CSTNode | None]] = {id(root): (root, None)}
    stack = [root]
    while stack:
        node = stack.pop()
        for child in child_nodes(node):
            parents[id(child)] = (child, node)
            stack.append(child)
    return parents


def _parameter_position(function: cst.FunctionDef, name: str) -> int | None:
    for position, param in enumerate((*function.params.posonly_params, *function.params.params)):
        if param.name.value == name:
            return position
    return None
