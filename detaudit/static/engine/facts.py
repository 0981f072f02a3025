"""Facts about one file, collected in the engine's single tree walk.

Rules rarely look at raw syntax: they read normalised facts.  Every spelling of
"set this backend flag" (assignment, tuple assignment, ``setattr``, the
``flags(...)`` context managers) becomes one ``SettingWrite``; every call
becomes a ``CallFact`` with its callee resolved through the import table; every
``add_argument`` becomes an ``ArgparseFlag`` so values read from the command
line evaluate to the flag's default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import libcst as cst

from detaudit.knowledge.backend_settings import backend_settings
from detaudit.static.engine.names import NameTable


@dataclass(frozen=True)
class StaticValue:
    """What the linter knows about an expression's value without running it.

    ``flag`` names the argparse option whose *default* produced ``value``;
    ``origin`` says where a value that came from elsewhere was found (a
    parameter's default, a config file's line): such values are defaults a run
    may override, so fixes of them are never safe.
    """

    known: bool
    value: Any = None
    flag: str | None = None
    origin: str | None = None

    def is_(self, *candidates: Any) -> bool:
        return self.known and any(
            self.value is c if isinstance(c, bool) or c is None else self.value == c for c in candidates
        )

    @property
    def truthy(self) -> bool:
        """Known and truthy (``True``, a non-empty string, ``1``)."""
        return self.known and bool(self.value)

    @property
    def falsy(self) -> bool:
        return self.known and not self.value

    @property
    def from_default(self) -> bool:
        """The value is a default (of a flag, a parameter, a config) rather than written here."""
        return self.flag is not None or self.origin is not None

    def describe(self) -> str:
        text = repr(self.value)
        if self.origin:
            return f"{text} ({self.origin})"
        return f"{text} (the default of --{self.flag.replace('_', '-')})" if self.flag else text


UNKNOWN = StaticValue(False)


@dataclass(frozen=True)
class Scope:
    """Where a statement sits: enclosing function, enclosing conditions."""

    function: str | None  # dotted for methods: "Net.__init__"
    conditions: tuple[cst.CSTNode, ...]  # enclosing If/For/While/Try/With nodes, outermost first
    in_main_guard: bool
    top_level_index: int  # index of the enclosing module-level statement
    #: inside a ``lambda``: runs only if and when the lambda is called
    in_lambda: bool = False

    @property
    def at_module_level(self) -> bool:
        return self.function is None

    @property
    def straight_line(self) -> bool:
        """Runs unconditionally when its function (or the module) runs."""
        return not any(not isinstance(c, cst.With) for c in self.conditions)


@dataclass
class CallFact:
    node: cst.Call
    qualname: str | None  # resolved callee, e.g. "torch.manual_seed"
    method: str | None  # attribute name for ``obj.method(...)`` calls
    order: int  # source order within the file
    scope: Scope
    #: keyword arguments passed as a literal dictionary: ``Trainer(**{"benchmark": True})``, or
    #: ``Trainer(**cfg)`` where ``cfg`` is assigned one dict literal (or ``dict(...)``) before
    unpacked: dict[str, cst.BaseExpression] = field(default_factory=dict)

    def argument(self, keyword: str | None = None, position: int | None = None) -> cst.Arg | None:
        """The argument passed by ``keyword`` or at ``position`` (0-based)."""
        positional = 0
        for arg in self.node.args:
            if arg.keyword is not None:
                if keyword is not None and arg.keyword.value == keyword:
                    return arg
            elif arg.star:
                position = None  # positions after *args are unknown
            else:
                if position is not None and positional == position:
                    return arg
                positional += 1
        return None

    def value_node(self, keyword: str | None = None, position: int | None = None) -> cst.BaseExpression | None:
        arg = self.argument(keyword, position)
        if arg is None and keyword is not None:
            return self.unpacked.get(keyword)
        return arg.value if arg is not None else None

    @property
    def has_star_args(self) -> bool:
        return any(arg.star for arg in self.node.args)


@dataclass
class SettingWrite:
    target: str  # qualified attribute, e.g. "torch.backends.cudnn.benchmark"
    value: cst.BaseExpression | None  # None when the value cannot be pointed at
    node: cst.CSTNode  # where a finding goes
    order: int
    scope: Scope
    via: str  # "assign", "setattr" or "flags"
    target_node: cst.CSTNode | None = None  # the assigned attribute (for fixes of the value)


@dataclass
class EnvironmentWrite:
    """``os.environ[NAME] = value`` and its other spellings (``os.environ.setdefault``,
    ``os.environ.update``, ``os.putenv``), for variables named by a literal."""

    name: str
    value: cst.BaseExpression | None
    node: cst.CSTNode
    order: int
    scope: Scope


@dataclass
class ArgparseFlag:
    dest: str
    default: StaticValue
    node: cst.Call


@dataclass
class FileFacts:
    names: NameTable = field(default_factory=NameTable)
    calls: list[CallFact] = field(default_factory=list)
    settings: list[SettingWrite] = field(default_factory=list)
    flags: dict[str, ArgparseFlag] = field(default_factory=dict)
    functions: dict[str, cst.FunctionDef] = field(default_factory=dict)
    classes: dict[str, cst.ClassDef] = field(default_factory=dict)
    #: names assigned exactly once to a value, for evaluating ``x = args.seed; ...x``
    simple_assignments: dict[str, list[cst.BaseExpression]] = field(default_factory=dict)
    has_main_guard: bool = False
    environment: list[EnvironmentWrite] = field(default_factory=list)

    # -- queries rules use ---------------------------------------------------

    def calls_to(self, *qualnames: str) -> Iterator[CallFact]:
        wanted = set(qualnames)
        return (c for c in self.calls if c.qualname in wanted)

    def settings_of(self, *targets: str) -> Iterator[SettingWrite]:
        wanted = set(targets)
        return (s for s in self.settings if s.target in wanted)

    def environment_writes(self, *names: str) -> Iterator[EnvironmentWrite]:
        wanted = set(names)
        return (w for w in self.environment if w.name in wanted)

    def imports_module(self, prefix: str) -> bool:
        return any(q == prefix or q.startswith(prefix + ".") for q in self.names.bindings().values())

    def evaluate(self, node: cst.BaseExpression | None, _depth: int = 0) -> StaticValue:
        """Evaluate literals, ``not``, ``bool()``/``int()``/``str()``, comparisons
        of known values, and argparse values (their defaults)."""
        if node is None or _depth > 8:
            return UNKNOWN
        if isinstance(node, cst.Name):
            if node.value in ("True", "False", "None"):
                return StaticValue(True, {"True": True, "False": False, "None": None}[node.value])
            assigned = self.simple_assignments.get(node.value)
            if assigned and len(assigned) == 1:
                return self.evaluate(assigned[0], _depth + 1)
            return UNKNOWN
        if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
            value = node.evaluated_value
            return StaticValue(True, value) if value is not None else UNKNOWN
        if isinstance(node, (cst.Integer, cst.Float)):
            return StaticValue(True, node.evaluated_value)
        if isinstance(node, cst.UnaryOperation):
            inner = self.evaluate(node.expression, _depth + 1)
            if not inner.known:
                return UNKNOWN
            if isinstance(node.operator, cst.Not):
                return StaticValue(True, not inner.value, inner.flag)
            if isinstance(node.operator, cst.Minus) and isinstance(inner.value, (int, float)):
                return StaticValue(True, -inner.value, inner.flag)
            return UNKNOWN
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and len(node.args) == 1:
            converter = {"bool": bool, "int": int, "float": float, "str": str}.get(node.func.value)
            inner = self.evaluate(node.args[0].value, _depth + 1)
            if converter is None or not inner.known:
                return UNKNOWN
            try:
                return StaticValue(True, converter(inner.value), inner.flag)
            except (TypeError, ValueError):
                return UNKNOWN
        if isinstance(node, cst.Attribute) and node.attr.value in self.flags:
            return self.flags[node.attr.value].default
        if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
            return self._compare(node, _depth)
        return UNKNOWN

    def _compare(self, node: cst.Comparison, depth: int) -> StaticValue:
        left = self.evaluate(node.left, depth + 1)
        target = node.comparisons[0]
        right = self.evaluate(target.comparator, depth + 1)
        if not (left.known and right.known):
            return UNKNOWN
        flag = left.flag or right.flag
        op = target.operator
        if isinstance(op, (cst.Is, cst.Equal)):
            return StaticValue(True, left.value == right.value, flag)
        if isinstance(op, (cst.IsNot, cst.NotEqual)):
            return StaticValue(True, left.value != right.value, flag)
        return UNKNOWN


def _is_main_guard(test: cst.BaseExpression) -> bool:
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
        return False
    sides = [test.left, test.comparisons[0].comparator]
    names = {s.value for s in sides if isinstance(s, cst.Name)}
    strings = {s.evaluated_value for s in sides if isinstance(s, cst.SimpleString)}
    return names == {"__name__"} and strings == {"__main__"}


#: calls that set a process environment variable (``os.environ[...] =`` is an assignment)
_ENVIRONMENT_SETTERS = frozenset({"os.environ.setdefault", "os.environ.update", "os.putenv"})

_CONDITIONAL_NODES = (cst.If, cst.For, cst.While, cst.Try, cst.With, cst.ExceptHandler)


class FactCollector(cst.BatchableCSTVisitor):
    """Fills a ``FileFacts`` during the engine's shared walk (always first in the batch)."""

    def __init__(self, facts: FileFacts, module: cst.Module) -> None:
        super().__init__()
        self.facts = facts
        self._functions: list[str] = []
        self._classes: list[str] = []
        self._enclosing: list[str] = []  # class and function names, outermost first
        self._lambda_depth = 0
        self._conditions: list[cst.CSTNode] = []
        self._outer_conditions: list[list[cst.CSTNode]] = []  # saved while inside a def
        self._main_guard_depth = 0
        self._top_index = {id(stmt): i for i, stmt in enumerate(module.body)}
        self._current_top = 0
        self._order = 0
        # Module-level imports bind names for code above them too (functions
        # defined before the import run after it).
        for stmt in module.body:
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, (cst.Import, cst.ImportFrom)):
                        facts.names.add_import(small)

    # -- scope tracking ------------------------------------------------------

    def _scope(self) -> Scope:
        return Scope(
            function=".".join(self._enclosing) if self._functions else None,
            conditions=tuple(self._conditions),
            in_main_guard=self._main_guard_depth > 0,
            top_level_index=self._current_top,
            in_lambda=self._lambda_depth > 0,
        )

    def _next_order(self) -> int:
        self._order += 1
        return self._order

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._enter_top(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._enter_top(node)
        qualified = ".".join([*self._classes, node.name.value]) if not self._functions else None
        if qualified is not None:
            self.facts.functions.setdefault(qualified, node)
        self._functions.append(node.name.value)
        self._enclosing.append(node.name.value)
        self._outer_conditions.append(self._conditions)
        self._conditions = []

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._functions.pop()
        self._enclosing.pop()
        self._conditions = self._outer_conditions.pop()

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self._lambda_depth += 1

    def leave_Lambda(self, original_node: cst.Lambda) -> None:
        self._lambda_depth -= 1

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._enter_top(node)
        if not self._functions:
            self.facts.classes.setdefault(".".join([*self._classes, node.name.value]), node)
        self._classes.append(node.name.value)
        self._enclosing.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._classes.pop()
        self._enclosing.pop()

    def _enter_top(self, node: cst.CSTNode) -> None:
        index = self._top_index.get(id(node))
        if index is not None:
            self._current_top = index

    def _enter_condition(self, node: cst.CSTNode) -> None:
        self._enter_top(node)
        self._conditions.append(node)

    def _leave_condition(self, node: cst.CSTNode) -> None:
        self._conditions.pop()

    def visit_If(self, node: cst.If) -> None:
        self._enter_condition(node)
        if _is_main_guard(node.test) and not self._functions:
            self.facts.has_main_guard = True
            self._main_guard_depth += 1
            self._conditions.pop()  # the main guard is the script's straight-line path

    def leave_If(self, original_node: cst.If) -> None:
        if _is_main_guard(original_node.test) and not self._functions:
            self._main_guard_depth -= 1
        else:
            self._leave_condition(original_node)

    def visit_If_orelse(self, node: cst.If) -> None:
        if _is_main_guard(node.test) and not self._functions:
            # the else branch of a main guard runs only on import
            self._main_guard_depth -= 1
            self._conditions.append(node)

    def leave_If_orelse(self, node: cst.If) -> None:
        if _is_main_guard(node.test) and not self._functions:
            self._conditions.pop()
            self._main_guard_depth += 1

    # libcst's batched walk keeps only methods whose own __name__ is visit_*/leave_*,
    # so each hook is spelled out rather than aliased.
    def visit_For(self, node: cst.For) -> None:
        self._enter_condition(node)

    def leave_For(self, original_node: cst.For) -> None:
        self._leave_condition(original_node)

    def visit_While(self, node: cst.While) -> None:
        self._enter_condition(node)

    def leave_While(self, original_node: cst.While) -> None:
        self._leave_condition(original_node)

    def visit_Try(self, node: cst.Try) -> None:
        self._enter_condition(node)

    def leave_Try(self, original_node: cst.Try) -> None:
        self._leave_condition(original_node)

    def visit_With(self, node: cst.With) -> None:
        self._enter_condition(node)

    def leave_With(self, original_node: cst.With) -> None:
        self._leave_condition(original_node)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        self._enter_condition(node)

    def leave_ExceptHandler(self, original_node: cst.ExceptHandler) -> None:
        self._leave_condition(original_node)

    # -- facts ----------------------------------------------------------------

    def visit_Import(self, node: cst.Import) -> None:
        self.facts.names.add_import(node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.facts.names.add_import(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        for target in node.targets:
            self._assign(target.target, value, node)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._assign(node.target, node.value, node)

    def _assign(self, target: cst.BaseExpression, value: cst.BaseExpression | None, statement: cst.CSTNode) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            values = value.elements if isinstance(value, (cst.Tuple, cst.List)) else None
            for i, element in enumerate(target.elements):
                if isinstance(element, cst.StarredElement):
                    return
                item = values[i].value if values is not None and i < len(values) else None
                self._assign(element.value, item, statement)
            return
        if isinstance(target, cst.Name):
            if value is not None:
                self.facts.simple_assignments.setdefault(target.value, []).append(value)
                # ``cudnn = torch.backends.cudnn`` makes ``cudnn`` an alias
                resolved = self.facts.names.resolve(value) if isinstance(value, (cst.Name, cst.Attribute)) else None
                if resolved is not None and "." in resolved and not self.facts.names.is_bound(target.value):
                    self.facts.names.bind(target.value, resolved)
            return
        if isinstance(target, cst.Subscript):
            self._environment_subscript(target, value, statement)
            return
        if isinstance(target, cst.Attribute):
            qualified = self.facts.names.resolve(target)
            if qualified is not None:
                self.facts.settings.append(
                    SettingWrite(qualified, value, statement, self._next_order(), self._scope(), "assign", target)
                )

    def _unpacked_keywords(self, node: cst.Call) -> dict[str, cst.BaseExpression]:
        """Keyword arguments a call passes through ``**`` a literal dictionary."""
        found: dict[str, cst.BaseExpression] = {}
        for arg in node.args:
            if arg.star != "**":
                continue
            value = arg.value
            if isinstance(value, cst.Name):
                assigned = self.facts.simple_assignments.get(value.value)
                value = assigned[0] if assigned and len(assigned) == 1 else None
            if isinstance(value, cst.Dict):
                for element in value.elements:
                    if isinstance(element, cst.DictElement):
                        key = self.facts.evaluate(element.key).value
                        if isinstance(key, str):
                            found[key] = element.value
            elif isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "dict":
                found.update({a.keyword.value: a.value for a in value.args if a.keyword is not None})
        return found

    def visit_Call(self, node: cst.Call) -> None:
        facts = self.facts
        qualname = facts.names.resolve(node.func)
        method = node.func.attr.value if isinstance(node.func, cst.Attribute) else None
        call = CallFact(node, qualname, method, self._next_order(), self._scope(), self._unpacked_keywords(node))
        facts.calls.append(call)
        if qualname == "setattr" and len(node.args) == 3:
            owner = facts.names.resolve(node.args[0].value)
            attribute = facts.evaluate(node.args[1].value)
            if owner is not None and isinstance(attribute.value, str):
                facts.settings.append(
                    SettingWrite(f"{owner}.{attribute.value}", node.args[2].value, node, call.order, call.scope, "setattr")
                )
        elif qualname is not None and qualname.endswith(".flags"):
            self._flags_context(call, qualname[: -len(".flags")])
        elif qualname in _ENVIRONMENT_SETTERS:
            self._environment_call(call)
        elif method == "add_argument":
            self._argparse_flag(call)
        elif method == "set_defaults":
            for arg in node.args:
                if arg.keyword is not None and arg.keyword.value in facts.flags:
                    facts.flags[arg.keyword.value].default = self._flag_value(arg.keyword.value, arg.value)

    def _environment_subscript(
        self, target: cst.Subscript, value: cst.BaseExpression | None, statement: cst.CSTNode
    ) -> None:
        if len(target.slice) != 1 or self.facts.names.resolve(target.value) != "os.environ":
            return
        index = target.slice[0].slice
        if isinstance(index, cst.Index):
            name = self.facts.evaluate(index.value).value
            self._environment_write(name, value, statement, self._next_order(), self._scope())

    def _environment_call(self, call: CallFact) -> None:
        pairs: list[tuple[object, cst.BaseExpression | None]] = []
        if call.qualname == "os.environ.update":
            for arg in call.node.args:
                if arg.keyword is not None:
                    pairs.append((arg.keyword.value, arg.value))
                elif not arg.star and isinstance(arg.value, cst.Dict):
                    pairs += [
                        (self.facts.evaluate(e.key).value, e.value)
                        for e in arg.value.elements
                        if isinstance(e, cst.DictElement)
                    ]
        else:  # setdefault(key, value) / putenv(key, value)
            pairs.append((self.facts.evaluate(call.value_node("key", 0)).value, call.value_node("value", 1)))
        for name, value in pairs:
            self._environment_write(name, value, call.node, call.order, call.scope)

    def _environment_write(
        self, name: object, value: cst.BaseExpression | None, node: cst.CSTNode, order: int, scope: Scope
    ) -> None:
        if isinstance(name, str):
            self.facts.environment.append(EnvironmentWrite(name, value, node, order, scope))

    def _flags_context(self, call: CallFact, namespace: str) -> None:
        known = backend_settings().namespaces.get(namespace)
        for position, name in enumerate(known.flags if known is not None else ()):
            value = call.value_node(name, position)
            if value is not None:
                self.facts.settings.append(
                    SettingWrite(f"{namespace}.{name}", value, call.argument(name, position), call.order, call.scope, "flags")
                )

    def _argparse_flag(self, call: CallFact) -> None:
        options = [
            a.value.evaluated_value
            for a in call.node.args
            if a.keyword is None and isinstance(a.value, cst.SimpleString)
        ]
        dest_arg = call.value_node("dest")
        dest = self.facts.evaluate(dest_arg).value if dest_arg is not None else None
        if dest is None:
            long_options = [o for o in options if isinstance(o, str) and o.startswith("--")]
            chosen = long_options[0] if long_options else (options[0] if options else None)
            if not isinstance(chosen, str):
                return
            dest = chosen.lstrip("-").replace("-", "_")
        action = self.facts.evaluate(call.value_node("action"))
        default_node = call.value_node("default")
        if default_node is not None:
            default = self.facts.evaluate(default_node)
            default = StaticValue(default.known, default.value, dest)
        elif action.is_("store_true"):
            default = StaticValue(True, False, dest)
        elif action.is_("store_false"):
            default = StaticValue(True, True, dest)
        elif action.is_("store_const", "append", "count", "extend", "append_const"):
            default = StaticValue(True, None, dest)
        else:
            default = StaticValue(True, None, dest)  # argparse's default default
        self.facts.flags[dest] = ArgparseFlag(dest, default, call.node)

    def _flag_value(self, dest: str, node: cst.BaseExpression) -> StaticValue:
        value = self.facts.evaluate(node)
        return StaticValue(value.known, value.value, dest)
