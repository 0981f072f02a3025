"""A fast read-only walk over a libcst tree that calls libcst-style hooks.

libcst's own ``visit`` serves transformers too, so it rebuilds every node on
the way (about half the cost of the parse, measured on torch's sources); the
static pass only reads.  This walk reads child fields directly (about a tenth of
that) and calls, on every visitor, the same hooks libcst would:
``visit_<Node>``/``leave_<Node>`` and the attribute hooks
``visit_<Node>_<field>``/``leave_<Node>_<field>``.  Like libcst's batched
walk, return values of hooks are ignored.  It is iterative, so deeply nested
code cannot exhaust Python's recursion limit.  A visitor whose hook raises is
left out of the rest of the walk and the others go on (``on_error``), so one
rule's bug never costs the other rules their findings.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from collections import Counter
from typing import Callable, Iterable, Sequence

import libcst as cst

#: Formatting-only nodes: no hook in detaudit looks at them.
_FORMATTING = (
    cst.BaseParenthesizableWhitespace,
    cst.Comment,
    cst.EmptyLine,
    cst.Newline,
    cst.TrailingWhitespace,
    cst.LeftParen,
    cst.RightParen,
    cst.Comma,
    cst.Semicolon,
    # tokens that hold only whitespace
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
    cst.Colon,
    cst.AssignEqual,
    cst.Dot,
)

#: Dataclass field order differs from source order for these; walk them as the
#: code reads (decorators first, the conditional expression's body before its test).
_SOURCE_ORDER = {
    cst.FunctionDef: ("decorators", "name", "params", "returns", "body"),
    cst.ClassDef: ("decorators", "name", "bases", "keywords", "body"),
    cst.IfExp: ("body", "test", "orelse"),
    cst.Arg: ("keyword", "value"),
    cst.ExceptHandler: ("type", "name", "body"),
    cst.ExceptStarHandler: ("type", "name", "body"),
    cst.Parameters: ("posonly_params", "posonly_ind", "params", "star_arg", "kwonly_params", "star_kwarg"),
}

_fields_of: dict[type, tuple[str, ...]] = {}


def _child_fields(cls: type) -> tuple[str, ...]:
    fields = _fields_of.get(cls)
    if fields is None:
        names = [f.name for f in dataclasses.fields(cls)]
        ordered = _SOURCE_ORDER.get(cls, ())
        fields = _fields_of[cls] = (*ordered, *(n for n in names if n not in ordered))
    return fields


def _may_hold_node(annotation) -> bool:
    """Whether a field declared as ``annotation`` can hold a node the walk enters
    (what is not a class, such as a forward reference, is taken as one that can)."""
    if annotation in (str, type(None)) or typing.get_origin(annotation) is typing.Literal:
        return False
    arguments = typing.get_args(annotation)
    if arguments:
        return any(_may_hold_node(argument) for argument in arguments)
    if not isinstance(annotation, type):
        return True
    if issubclass(annotation, cst.CSTNode):
        return not issubclass(annotation, _FORMATTING)
    return not issubclass(annotation, (str, bool, int, float, enum.Enum))


_node_fields_of: dict[type, frozenset[str]] = {}


def _node_fields(cls: type) -> frozenset[str]:
    """The fields of ``cls`` that can hold a node the walk enters (not whitespace,
    commas, parentheses): the walk reads only those."""
    fields = _node_fields_of.get(cls)
    if fields is None:
        fields = _node_fields_of[cls] = frozenset(f.name for f in dataclasses.fields(cls) if _may_hold_node(f.type))
    return fields


class _EnteredTypes(dict):
    """Per concrete type: is it a node the walk enters?  Looked up as ``enters[cls]``,
    a plain dict lookup after the first time (isinstance on libcst's abstract
    bases goes through abc and dominated the walk's cost)."""

    def __missing__(self, cls: type) -> bool:
        entered = self[cls] = issubclass(cls, cst.CSTNode) and not issubclass(cls, _FORMATTING)
        return entered


_enters = _EnteredTypes()


_ordered_node_fields_of: dict[type, tuple[str, ...]] = {}


def _ordered_node_fields(cls: type) -> tuple[str, ...]:
    """The fields of ``cls`` that can hold a node the walk enters, in source order."""
    fields = _ordered_node_fields_of.get(cls)
    if fields is None:
        node_fields = _node_fields(cls)
        fields = _ordered_node_fields_of[cls] = tuple(f for f in _child_fields(cls) if f in node_fields)
    return fields


_reversed_node_fields_of: dict[type, tuple[str, ...]] = {}


def _reversed_node_fields(cls: type) -> tuple[str, ...]:
    fields = _reversed_node_fields_of.get(cls)
    if fields is None:
        fields = _reversed_node_fields_of[cls] = tuple(reversed(_ordered_node_fields(cls)))
    return fields


class _Worth(dict):
    """Per concrete type, for one walk: is a node of it worth entering?  Not when
    no visitor hooks it and it holds nothing the walk enters (a ``Name``, a
    literal: nearly half of a tree's nodes), so such nodes are never put on
    the stack.  Looked up as ``worth[cls]``, a plain dict lookup after the first
    time; dropping a visitor only removes hooks, so an answer never goes stale
    in the direction that matters."""

    def __init__(self, hooks: "_Hooks") -> None:
        super().__init__()
        self._hooks = hooks

    def __missing__(self, cls: type) -> bool:
        worth = self[cls] = _enters[cls] and any(self._hooks.of(cls))
        return worth


class _Hooks:
    """The visitors' hooks per node class, looked up once per class and walk."""

    def __init__(self, visitors: Sequence[object]) -> None:
        self._visitors = list(visitors)
        self._types = tuple(type(v) for v in self._visitors)
        self.by_class: dict[type, tuple[tuple, tuple, tuple[tuple[str, tuple, tuple], ...]]] = {}

    def drop(self, visitor: object) -> None:
        """Leave ``visitor`` out of every later lookup."""
        self._visitors = [v for v in self._visitors if v is not visitor]
        self._types = tuple(type(v) for v in self._visitors)
        self.by_class.clear()

    def of(self, cls: type) -> tuple[tuple, tuple, tuple[tuple[str, tuple, tuple], ...]]:
        """The class's visit and leave hooks, and the fields to walk, last first,
        each with its attribute hooks (on the way in, on the way out)."""
        hooks = self.by_class.get(cls)
        if hooks is None:
            visit, leave, fields = _plan(self._types, cls)
            visitors = self._visitors

            def bound(pairs: tuple[tuple[int, str], ...]) -> tuple:
                return tuple(getattr(visitors[i], name) for i, name in pairs) if pairs else ()

            hooks = self.by_class[cls] = (
                bound(visit), bound(leave), tuple((field, bound(enter), bound(exit_)) for field, enter, exit_ in fields)
            )
        return hooks


_Pairs = tuple[tuple[int, str], ...]  # (position of a visitor, the name of its hook)
#: (visitor classes, node class) -> which visitor has which hook: the same for every walk
#: with visitors of those classes (about 650 walks a repository: checks, the index, sub-walks)
_plans: dict[tuple[tuple[type, ...], type], tuple[_Pairs, _Pairs, tuple[tuple[str, _Pairs, _Pairs], ...]]] = {}


def _plan(types: tuple[type, ...], cls: type) -> tuple[_Pairs, _Pairs, tuple[tuple[str, _Pairs, _Pairs], ...]]:
    plan = _plans.get((types, cls))
    if plan is None:
        name = cls.__name__

        def pairs(hook: str) -> _Pairs:
            return tuple((i, hook) for i, visitor_class in enumerate(types) if hook in _hook_names(visitor_class))

        node_fields = _node_fields(cls)
        fields = []
        for field in reversed(_child_fields(cls)):
            enter, exit_ = pairs(f"visit_{name}_{field}"), pairs(f"leave_{name}_{field}")
            if enter or exit_ or field in node_fields:
                fields.append((field, enter, exit_))
        plan = _plans[(types, cls)] = (pairs(f"visit_{name}"), pairs(f"leave_{name}"), tuple(fields))
    return plan


def _is_stub(method) -> bool:
    """libcst's visitor base classes define every hook as a marked no-op."""
    return getattr(method, "_is_no_op", False)


_hook_names_of: dict[type, frozenset[str]] = {}


def _hook_names(visitor_class: type) -> frozenset[str]:
    """The hooks a visitor class really defines (looked up once per class, not per walk)."""
    names = _hook_names_of.get(visitor_class)
    if names is None:
        names = _hook_names_of[visitor_class] = frozenset(
            name
            for name in dir(visitor_class)
            if name.startswith(("visit_", "leave_")) and not _is_stub(getattr(visitor_class, name))
        )
    return names


#: ``tick`` is called after this many nodes
TICK_EVERY = 4096


def walk(
    module: cst.CSTNode,
    visitors: Iterable[object],
    on_error: Callable[[object, Exception], None] | None = None,
    tick: Callable[[], None] | None = None,
) -> None:
    """Walk ``module`` in source order, calling every visitor's hooks.

    Without ``on_error`` an exception in a hook ends the walk.  With it, the
    visitor whose hook raised is told about (``on_error(visitor, error)``) and
    left out from then on; the walk goes on for the others.  RecursionError
    always ends the walk: it says the tree is too deep, not that a visitor is
    wrong.  ``tick`` is called every TICK_EVERY nodes (a time budget's check:
    what it raises ends the walk)."""
    hooks = _Hooks(visitors)
    stopped: set[int] = set()  # ids of visitors left out after an error

    def call(methods: list, node: cst.CSTNode) -> None:
        for method in methods:
            if stopped and id(method.__self__) in stopped:
                continue
            try:
                method(node)
            except RecursionError:
                raise
            except Exception as error:
                if on_error is None:
                    raise
                visitor = method.__self__
                stopped.add(id(visitor))
                hooks.drop(visitor)
                on_error(visitor, error)

    # items are nodes to enter, or (node, hooks) pairs to call on the way back up
    stack: list = [module]
    countdown = TICK_EVERY
    hooks_of, worth = hooks.by_class, _Worth(hooks)  # local names: this loop runs once per node
    while stack:
        item = stack.pop()
        cls = type(item)
        if cls is tuple:
            call(item[1], item[0])
            continue
        countdown -= 1
        if not countdown and tick is not None:
            tick()
            countdown = TICK_EVERY
        visit, leave, fields = hooks_of.get(cls) or hooks.of(cls)
        if visit:
            call(visit, item)
        if leave:
            stack.append((item, leave))
        for field, enter, exit_ in fields:
            if exit_:
                stack.append((item, exit_))
            value = getattr(item, field)
            kind = type(value)
            if kind is tuple or kind is list:
                stack.extend([v for v in reversed(value) if worth[type(v)]])
            elif worth[kind]:
                stack.append(value)
            if enter:
                stack.append((item, enter))


def child_nodes(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``node.children`` without the formatting (whitespace, comments, commas,
    parentheses), in source order.  Read from the node's fields: libcst's
    ``children`` runs a visitor that rebuilds the node to collect them, which
    made it the main cost of the rules that walk subtrees by hand."""
    children = []
    for field in _ordered_node_fields(type(node)):
        value = getattr(node, field)
        kind = type(value)
        if kind is tuple or kind is list:
            children.extend([v for v in value if _enters[type(v)]])
        elif _enters[kind]:
            children.append(value)
    return children


def iter_nodes(root: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """Every node under ``root`` (formatting excepted), in source order."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        for field in _reversed_node_fields(type(node)):
            value = getattr(node, field)
            kind = type(value)
            if kind is tuple or kind is list:
                stack.extend([v for v in reversed(value) if _enters[type(v)]])
            elif _enters[kind]:
                stack.append(value)


def name_mentions(tree: cst.CSTNode) -> Counter[str]:
    """How often code in ``tree`` names each name (``name(...)``, ``mod.name``, ``fn = name``),
    leaving out imports, and the names of definitions, parameters and keyword arguments."""
    counts: Counter[str] = Counter()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            continue
        if isinstance(node, cst.Name):
            counts[node.value] += 1
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Param)):
            counts[node.name.value] -= 1  # its own name node is counted below
        elif isinstance(node, cst.Arg) and node.keyword is not None:
            counts[node.keyword.value] -= 1
        stack.extend(child_nodes(node))
    return counts
