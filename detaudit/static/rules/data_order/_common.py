"""Following an unordered value through a scope: what unordered-file-listing
(DET031) and set-iteration-order (DET032) share.

Both rules follow an *unordered value* (a directory listing, a set of strings)
through one function at a time, in source order, and report it when its order
is kept: indexed, enumerated, returned, stored, appended to a list, passed on.
It is not reported when it is sorted (``sorted(x)``, ``x.sort()``), or only used
in ways that ignore order (``in``, ``len``, ``set``, truthiness, a loop that only
has side effects).  The walk is local and linear: only scopes that contain an
unordered value are walked, once, with a map from each name to what it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import libcst as cst

from detaudit.static.analyses.execution import blocks, header, statements
from detaudit.static.analyses.strings import is_string_expression, is_string_iterable
from detaudit.static.engine.names import dotted_name
from detaudit.static.engine.walk import child_nodes
from detaudit.static.rule import Rule

#: Consumers whose result does not depend on the order of their argument.
ORDER_INSENSITIVE_CALLS = frozenset(
    {"sorted", "set", "frozenset", "len", "any", "all", "sum", "min", "max", "bool", "print",
     "collections.Counter", "natsort.natsorted", "natsort.os_sorted", "natsort.humansorted",
     "natsort.realsorted", "numpy.sort", "os.path.exists", "os.path.isdir", "os.path.isfile"}
)

#: Wrappers that keep their argument's order (the order-dependent use is further out):
#: a progress bar iterates what it wraps.
ORDER_PRESERVING_CALLS = frozenset(
    {"list", "tuple", "iter", "map", "filter", "reversed", "dict.fromkeys", "itertools.chain",
     "itertools.islice", "tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm"}
)

#: Consumers that turn an iteration order into data: positions, first match, text.
ORDER_CAPTURING_CALLS = frozenset({"enumerate", "zip", "next", "random.shuffle", "random.choice"})

# -- following an unordered value through a scope ---------------------------------


@dataclass(frozen=True)
class Unordered:
    """An unordered value being followed."""

    what: str  # how the message names it: "os.listdir()", "the set of strings"
    report_at: cst.CSTNode  # where the fix goes
    ordered: bool  # already a sequence (a listing) or still a set
    fix: object = None
    walk: bool = False  # an ``os.walk``-style generator of (dir, dirs, files)


_APPENDING_METHODS = frozenset({"append", "extend", "insert", "appendleft"})
SET_ADDING_METHODS = frozenset({"add", "update"})


class ScopeFlow:
    """Follows unordered values through one scope's statements, in execution order
    (nested functions and classes are scopes of their own)."""

    def __init__(self, rule: "OrderRule", returns_order_free: bool = False) -> None:
        self.rule = rule
        self.returns_order_free = returns_order_free
        self.facts = rule.facts
        self.pending: dict[str, Unordered] = {}  # dotted name -> what it holds
        self.empty_sets: dict[str, cst.CSTNode] = {}  # ``x = set()`` waiting for string elements
        self.string_names: set[str] = set()
        self._rebinds: list[tuple[str, Unordered]] = []

    def run(self, body) -> None:
        for statement in statements(body):
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                continue  # scopes of their own
            if isinstance(statement, cst.For):
                self._for(statement)
                continue
            for node in header(statement):
                self._walk(node, [statement])
        for name, value in self.pending.items():
            if "." in name and value.ordered:  # stored on an object and never sorted in this scope
                self.rule.found(value, f"stored in `{name}` in that order")

    # The walk: a node's parents are passed down so each use can be classified.
    def _walk(self, node: cst.CSTNode, parents: list[cst.CSTNode]) -> None:
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return
        if isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            self._assignment(node, parents)
            return
        if isinstance(node, cst.Assert):
            single = _asserted_single(node.test)
            if single is not None:
                self.pending.pop(single, None)  # one element has no order
        value = self._value_of(node)
        if value is not None:
            self._classify(value, node, parents)
            if isinstance(node, cst.Name | cst.Attribute):
                return
        parents.append(node)
        for child in child_nodes(node):
            self._walk(child, parents)
        parents.pop()

    def _value_of(self, node: cst.CSTNode) -> Unordered | None:
        if isinstance(node, (cst.Name, cst.Attribute)):
            name = dotted_name(node)
            return self.pending.get(name) if name is not None else None
        return self.rule.source(node, self)

    def _assignment(self, node, parents: list[cst.CSTNode]) -> None:
        parents.append(node)
        if node.value is not None:
            self._walk(node.value, parents)
        parents.pop()
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        for target in targets:
            name = dotted_name(target)
            if name is not None and not isinstance(node, cst.AugAssign):
                self.pending.pop(name, None)
                self.empty_sets.pop(name, None)
                self.string_names.discard(name)
                if isinstance(node.value, cst.Call) and self.facts.names.resolve(node.value.func) == "set" and not node.value.args:
                    self.empty_sets[name] = node.value
                elif node.value is not None and self._holds_strings(node.value):
                    self.string_names.add(name)
        for name, value in self._rebinds:
            self.pending[name] = value
        self._rebinds.clear()

    def _holds_strings(self, value: cst.BaseExpression) -> bool:
        """A string, or strings to iterate (``text.split()``, ``list(set(words))``): a
        name holding either iterates strings, which is what a set built from it holds."""
        names = frozenset(self.string_names)
        if is_string_expression(value, self.facts, names):
            return True
        return isinstance(value, cst.Call) and is_string_iterable(value, self.facts, names)

    def _for(self, node: cst.For) -> None:
        """A loop's iterable, then what its target binds (its body is walked next)."""
        self._walk(node.iter, [node])
        if isinstance(node.target, cst.Name) and is_string_iterable(node.iter, self.facts, frozenset(self.string_names)):
            self.string_names.add(node.target.value)
        self.rule.loop_targets(node, self)

    # -- classification of one use ---------------------------------------------

    def _classify(self, value: Unordered, node: cst.CSTNode, parents: list[cst.CSTNode]) -> None:
        """Follow ``node`` (holding ``value``) outwards to the use that decides."""
        child = node
        for index in range(len(parents) - 1, -1, -1):
            parent = parents[index]
            if isinstance(parent, (cst.Arg, cst.Element, cst.StarredElement, cst.CompFor)):
                # the iterable of a nested ``for`` (``[p for ext in exts for p in d.glob(ext)]``) feeds the outer one
                if isinstance(parent, cst.CompFor) and child is not parent.iter and child is not parent.inner_for_in:
                    return  # used in a comprehension's condition
            elif isinstance(parent, cst.Attribute):
                call = parents[index - 1] if index > 0 else None
                if child is parent.value and isinstance(call, cst.Call) and call.func is parent:
                    self._method(value, parent.attr.value, parent.value, call)
                return  # other attributes (``.name`` of a DirEntry, ...) are single elements
            elif isinstance(parent, cst.Call) and index > 0 and _enumerated_loop(parent, parents[index - 1], self.facts):
                self._loop(value, parents[index - 1])  # the count is never read: a plain loop over the value
                return
            else:
                value = self._step(value, child, parent)
                if value is None:
                    return
            child = parent

    def _step(self, value: Unordered, child: cst.CSTNode, parent: cst.CSTNode) -> Unordered | None:
        """What using ``child`` inside ``parent`` does: a new value to follow
        outwards, or None when the use is decided (reported, sorted or harmless)."""
        if isinstance(parent, cst.Call):
            return self._call(value, child, parent)
        if isinstance(parent, cst.Subscript):
            if value.ordered and child is parent.value:
                self.rule.found(value, "indexed")
            return None
        if isinstance(parent, (cst.ListComp, cst.GeneratorExp, cst.DictComp)):
            return self.rule.materialised(value, parent)
        if isinstance(parent, cst.BinaryOperation):
            return value if isinstance(parent.operator, (cst.Add, cst.BitOr)) else None
        if isinstance(parent, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            targets = [t.target for t in parent.targets] if isinstance(parent, cst.Assign) else [parent.target]
            for target in targets:
                name = dotted_name(target)
                if name is not None:
                    self._rebinds.append((name, value))
            return None
        if isinstance(parent, cst.For):
            self._loop(value, parent)
            return None
        if isinstance(parent, (cst.Return, cst.Yield)):
            if value.ordered and not (self.returns_order_free and isinstance(parent, cst.Return)):
                self.rule.found(value, "returned" if isinstance(parent, cst.Return) else "yielded")
            return None
        return None  # comparisons (``in``), tests, f-strings, unpacking: order does not matter

    def _call(self, value: Unordered, child: cst.CSTNode, call: cst.Call) -> Unordered | None:
        """The value is an argument of ``call``."""
        if child is call.func:
            return None
        receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
        method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
        callee = self.facts.names.resolve(call.func)
        label = callee or dotted_name(call.func) or method or "a call"
        if callee in ORDER_INSENSITIVE_CALLS:
            return None
        if callee in ORDER_PRESERVING_CALLS:
            return self.rule.materialised(value, call)
        if callee == "next" and value.walk:
            return None  # the first step of a walk is the top directory itself
        if callee in ORDER_CAPTURING_CALLS or method == "join":
            self.rule.found(self.rule.materialised(value, call), f"passed to `{label}`")
            return None
        if method in _APPENDING_METHODS and value.ordered:
            self._collect_into(receiver, value)
            return None
        if method in SET_ADDING_METHODS or not value.ordered:
            return None  # a set handed over as a container keeps no order
        self.rule.found(value, f"passed to `{label}`")
        return None

    def _method(self, value: Unordered, method: str, receiver: cst.BaseExpression, call: cst.Call) -> None:
        """A method of the value itself: ``files.sort()``, ``names.pop()``."""
        if method == "sort":
            name = dotted_name(receiver)
            if name is not None:
                self.pending.pop(name, None)
        elif method == "pop" and not value.ordered:
            self.rule.found(replace(value, report_at=call), "an arbitrary element is taken with `pop()`")

    def _collect_into(self, receiver: cst.BaseExpression, value: Unordered) -> None:
        name = dotted_name(receiver)
        if name is not None:
            self.pending.setdefault(name, value)

    def _loop(self, value: Unordered, loop: cst.For) -> None:
        """A loop over the value keeps its order if it appends or yields."""
        value = self.rule.materialised(value, loop)
        if _sorts_a_loop_target(loop):
            return  # ``for root, dirs, files in os.walk(d): dirs.sort()`` fixes the walk order
        for node in _loop_body_nodes(loop):
            if isinstance(node, cst.Yield):
                self.rule.found(value, "yielded by a loop")
                return
            if (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in _APPENDING_METHODS
            ):
                self._collect_into(node.func.value, value)


def _enumerated_loop(call: cst.Call, loop: cst.CSTNode, facts) -> bool:
    """``for i, item in enumerate(values):`` whose body never reads ``i``."""
    if not (isinstance(loop, cst.For) and loop.iter is call and facts.names.resolve(call.func) == "enumerate"):
        return False
    target = loop.target
    if not (isinstance(target, cst.Tuple) and len(target.elements) == 2 and isinstance(target.elements[0].value, cst.Name)):
        return False
    count = target.elements[0].value.value
    return not any(isinstance(node, cst.Name) and node.value == count for node in _loop_body_nodes(loop))


def _asserted_single(test: cst.BaseExpression) -> str | None:
    """The name ``assert len(name) == 1`` says holds exactly one element."""
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
        return None
    target = test.comparisons[0]
    if not isinstance(target.operator, cst.Equal) or not (isinstance(target.comparator, cst.Integer) and target.comparator.value == "1"):
        return None
    call = test.left
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == "len" and len(call.args) == 1:
        return dotted_name(call.args[0].value)
    return None


def _sorts_a_loop_target(loop: cst.For) -> bool:
    if not isinstance(loop.target, cst.Tuple):
        return False
    targets = {dotted_name(e.value) for e in loop.target.elements}
    return any(
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "sort"
        and dotted_name(node.func.value) in targets
        for node in _loop_body_nodes(loop)
    )


def _loop_body_nodes(loop: cst.For):
    """The nodes of a loop body, not entering nested functions."""
    stack: list[cst.CSTNode] = [loop.body]
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            stack.extend(child_nodes(node))


class OrderRule(Rule):
    """Marks the scopes that hold an unordered value during the shared walk and
    follows the value through those scopes (only) in ``finish``."""

    def __init__(self, context) -> None:
        super().__init__(context)
        self._scopes: list[cst.CSTNode] = [context.module]
        self._marked: dict[int, cst.CSTNode] = {}
        self._reported: set[int] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scopes.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._scopes.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._scopes.append(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._scopes.pop()

    def _mark(self) -> None:
        scope = self._scopes[-1]
        self._marked[id(scope)] = scope

    def finish(self) -> None:
        for scope in self._marked.values():
            # ``dir()`` sorts what ``__dir__`` returns
            returns_order_free = isinstance(scope, cst.FunctionDef) and scope.name.value == "__dir__"
            ScopeFlow(self, returns_order_free).run(scope.body if isinstance(scope, cst.Module) else blocks(scope)[0].statements)

    def found(self, value: Unordered, use: str) -> None:
        if id(value.report_at) in self._reported:
            return
        self._reported.add(id(value.report_at))
        self.report(value.report_at, self.message(value, use), fix=value.fix)

    # -- what subclasses define ---------------------------------------------------
    def source(self, node: cst.CSTNode, flow: ScopeFlow) -> Unordered | None:
        raise NotImplementedError

    def materialised(self, value: Unordered, node: cst.CSTNode) -> Unordered:
        """The value once its order is fixed into a sequence at ``node``: a call or
        comprehension that iterates it, or the ``for`` loop that does."""
        return value

    def loop_targets(self, loop: cst.For, flow: ScopeFlow) -> None:
        """Names a loop over a source binds to further unordered values."""

    def message(self, value: Unordered, use: str) -> str:
        raise NotImplementedError
