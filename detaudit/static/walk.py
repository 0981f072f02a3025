"""A fast read-only walk over a libcst tree that calls libcst-style hooks.

libcst's own ``visit`` serves transformers too, so it rebuilds every node on
the way (about half the cost of the parse, measured on torch's sources); the
static pass only reads.  This walk reads child fields directly (about a tenth of
that) and calls, on every visitor, the same hooks libcst would:
``visit_<Node>``/``leave_<Node>`` and the attribute hooks
``visit_<Node>_<field>``/``leave_<Node>_<field>``.  Like libcst's batched
walk, return values of hooks are ignored.  It is iterative, so deeply nested
code cannot exhaust Python's recursion limit.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

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
)

#: Dataclass field order differs from source order for these; walk them as the
#: code reads (decorators first, the conditional expression's body before its test).
_SOURCE_ORDER = {
    cst.FunctionDef: ("decorators", "name", "params", "returns", "body"),
    cst.ClassDef: ("decorators", "name", "bases", "keywords", "body"),
    cst.IfExp: ("body", "test", "orelse"),
}

_fields_of: dict[type, tuple[str, ...]] = {}


def _child_fields(cls: type) -> tuple[str, ...]:
    fields = _fields_of.get(cls)
    if fields is None:
        names = [f.name for f in dataclasses.fields(cls)]
        ordered = _SOURCE_ORDER.get(cls, ())
        fields = _fields_of[cls] = (*ordered, *(n for n in names if n not in ordered))
    return fields


#: per concrete type: is it a node the walk enters?  (isinstance on libcst's
#: abstract bases goes through abc and dominated the walk's cost)
_entered: dict[type, bool] = {}


def _enters(cls: type) -> bool:
    entered = _entered.get(cls)
    if entered is None:
        entered = _entered[cls] = issubclass(cls, cst.CSTNode) and not issubclass(cls, _FORMATTING)
    return entered


def _children(value) -> list[cst.CSTNode]:
    kind = type(value)
    if kind is tuple or kind is list:
        return [v for v in value if _enters(type(v))]
    return [value] if _enters(kind) else []


class _Hooks:
    """The visitors' hooks per node class, looked up once per class and walk."""

    def __init__(self, visitors: Sequence[object]) -> None:
        self._visitors = visitors
        self._by_class: dict[type, tuple[list, list, dict[str, tuple[list, list]]]] = {}

    def of(self, cls: type) -> tuple[list, list, dict[str, tuple[list, list]]]:
        hooks = self._by_class.get(cls)
        if hooks is None:
            name = cls.__name__
            visit = [m for v in self._visitors if (m := getattr(v, f"visit_{name}", None)) and not _is_stub(m)]
            leave = [m for v in self._visitors if (m := getattr(v, f"leave_{name}", None)) and not _is_stub(m)]
            attributes: dict[str, tuple[list, list]] = {}
            for field in _child_fields(cls):
                enter = [m for v in self._visitors if (m := getattr(v, f"visit_{name}_{field}", None)) and not _is_stub(m)]
                exit_ = [m for v in self._visitors if (m := getattr(v, f"leave_{name}_{field}", None)) and not _is_stub(m)]
                if enter or exit_:
                    attributes[field] = (enter, exit_)
            hooks = self._by_class[cls] = (visit, leave, attributes)
        return hooks


def _is_stub(method) -> bool:
    """libcst's visitor base classes define every hook as a marked no-op."""
    return getattr(method, "_is_no_op", False)


def walk(module: cst.CSTNode, visitors: Iterable[object]) -> None:
    """Walk ``module`` in source order, calling every visitor's hooks."""
    hooks = _Hooks(list(visitors))
    # items are nodes to enter, or (node, hooks) pairs to call on the way back up
    stack: list = [module]
    while stack:
        item = stack.pop()
        if type(item) is tuple:
            node, methods = item
            for method in methods:
                method(node)
            continue
        visit, leave, attributes = hooks.of(type(item))
        for method in visit:
            method(item)
        if leave:
            stack.append((item, leave))
        for field in reversed(_child_fields(type(item))):
            field_hooks = attributes.get(field)
            if field_hooks is not None and field_hooks[1]:
                stack.append((item, field_hooks[1]))
            stack.extend(reversed(_children(getattr(item, field))))
            if field_hooks is not None and field_hooks[0]:
                stack.append((item, field_hooks[0]))


def iter_nodes(root: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """Every node under ``root`` (formatting excepted), in source order."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        for field in reversed(_child_fields(type(node))):
            stack.extend(reversed(_children(getattr(node, field))))
