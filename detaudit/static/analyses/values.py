"""The values settings receive through parameters and configs, never running code.

``cudnn.benchmark = cudnn_benchmark`` means little until one knows the
parameter defaults to ``True``; ``cudnn.benchmark = config.CUDNN.BENCHMARK``
until one reads the project's config module.  This analysis resolves such an
expression to the value a default run gives it, and says where that value was
written (``StaticValue.origin``):

- a parameter of the enclosing function: its default, when no call in the file
  passes the parameter (a call that passes another value, or one that cannot be
  read, leaves the value unknown); a config parameter every call passes the same
  object (``main(opt)`` with ``opt = opts().parse()``) reads that object;
- a flag parsed in a project module (``args = get_args()``, ``opts().parse()``,
  ``TrainOptions().parse()``: a module that calls ``parse_args()``, with the
  flags it and the project modules it imports define): the flag's default;
- ``not``, ``and``, ``or`` of such values, as Python evaluates them (one side
  known to decide is enough: ``unknown and False`` is False);
- an attribute chain on a config object: module-level assignments of a project
  module (yacs ``_C.CUDNN.BENCHMARK = True``, re-exported through ``from .default
  import _C as config`` or a ``get_cfg_defaults()`` that returns it), dataclass
  field defaults (the object built in the file, or a parameter annotated with
  the class, as Hydra structured configs are), and the YAML files a
  ``@hydra.main(config_path=..., config_name=...)`` function or an
  ``OmegaConf.load("literal.yaml")`` names (composed from the config's
  ``defaults`` list; read with PyYAML when it is installed, skipped otherwise).

Project and config modules are read with Python's ``ast`` (no libcst tree is
kept for them); each file is read once per content hash, and named as a
dependency of the checked file's result.  A value a run may override (a config
merged from a file given on the command line) is still the default: findings
name it as such.  Anything not resolved stays unknown, so rules stay quiet.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import libcst as cst

from detaudit.static.engine.facts import UNKNOWN, ArgparseFlag, CallFact, Scope, StaticValue
from detaudit.static.engine.names import dotted_name

if TYPE_CHECKING:
    from detaudit.static.context import FileContext

#: Decorators that make a class a dataclass (its fields' defaults are its values).
_DATACLASS_DECORATORS = frozenset({"dataclass", "dataclasses.dataclass", "pydantic.dataclasses.dataclass"})
#: Calls that load a YAML config from a path.
_YAML_LOADERS = frozenset({"omegaconf.OmegaConf.load"})
_HYDRA_MAIN = frozenset({"hydra.main"})
#: Calls that build the object a config node's ``_target_`` names, with the node's options.
_HYDRA_INSTANTIATE = frozenset({"hydra.utils.instantiate", "hydra.utils.call"})
#: How deep re-exports and nested configs are followed.
_MAX_DEPTH = 6


@dataclass
class _ConfigModule:
    """What a module's top level says about config values (read with ``ast``)."""

    path: Path
    #: dotted target ("_C.CUDNN.BENCHMARK") -> (value, line); None when assigned twice
    assignments: dict[str, tuple[ast.expr, int] | None] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)  # local name -> qualified (relative keeps its dots)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    #: functions that return a module-level name (``def get_cfg_defaults(): return _C.clone()``)
    returns: dict[str, str] = field(default_factory=dict)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base is not None else None
    return None


def _returned_name(function: ast.FunctionDef) -> str | None:
    last = function.body[-1] if function.body else None
    if not isinstance(last, ast.Return) or last.value is None:
        return None
    value = last.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "clone" and not value.args:
        value = value.func.value  # yacs: ``return _C.clone()``
    return value.id if isinstance(value, ast.Name) else None


@lru_cache(maxsize=256)
def _config_module(path: Path, digest: str) -> _ConfigModule | None:
    """The config facts of a project module (``digest`` keys the cache to its content)."""
    try:
        return _read_config_module(path, path.read_bytes())
    except OSError:
        return None


def _read_config_module(path: Path, source: bytes | str) -> _ConfigModule | None:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    module = _ConfigModule(path)
    for statement in tree.body:
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                name = _dotted(target)
                if name is not None:
                    module.assignments[name] = None if name in module.assignments else (statement.value, statement.lineno)
        elif isinstance(statement, ast.ImportFrom):
            prefix = "." * statement.level + (statement.module or "")
            for alias in statement.names:
                separator = "" if prefix.endswith(".") or not prefix else "."
                module.imports[alias.asname or alias.name] = f"{prefix}{separator}{alias.name}"
        elif isinstance(statement, ast.Import):
            for alias in statement.names:
                module.imports[alias.asname or alias.name.partition(".")[0]] = alias.name if alias.asname else alias.name.partition(".")[0]
        elif isinstance(statement, ast.ClassDef):
            module.classes[statement.name] = statement
        elif isinstance(statement, ast.FunctionDef):
            returned = _returned_name(statement)
            if returned is not None:
                module.returns[statement.name] = returned
    return module


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


class Values:
    """Resolves expressions of one checked file (``FileAnalyses.values``)."""

    def __init__(self, context: "FileContext") -> None:
        self._context = context
        self._facts = context.facts

    def evaluate(self, node: cst.BaseExpression | None, scope: Scope | None = None) -> StaticValue:
        """``facts.evaluate`` first; then a parameter's default or a config value."""
        value = self._facts.evaluate(node)
        if value.known or node is None:
            return value
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            operand = self.evaluate(node.expression, scope)
            return StaticValue(True, not operand.value, operand.flag, operand.origin) if operand.known else UNKNOWN
        if isinstance(node, cst.BooleanOperation):
            return self._boolean(node, scope)
        if isinstance(node, cst.Name) and scope is not None:
            return self._parameter_default(node.value, scope)
        if isinstance(node, cst.Attribute):
            chain = dotted_name(node)
            if chain is not None:
                return self._config_value(chain, scope)
        return UNKNOWN

    def _boolean(self, node: cst.BooleanOperation, scope: Scope | None) -> StaticValue:
        """``a and b`` / ``a or b`` as Python evaluates them; one side known to decide
        it is enough (``unknown and False`` is False)."""
        left, right = self.evaluate(node.left, scope), self.evaluate(node.right, scope)
        deciding = (lambda v: v.falsy) if isinstance(node.operator, cst.And) else (lambda v: v.truthy)
        for side in (left, right):
            if deciding(side):
                return side
        if left.known and right.known:
            return right
        return UNKNOWN

    # -- parameters ---------------------------------------------------------

    def _parameter(self, name: str, scope: Scope | None) -> tuple[str, cst.FunctionDef, cst.Param, int] | None:
        """The enclosing function (its dotted name and node), its parameter ``name``
        and that parameter's position (-1: keyword-only)."""
        if scope is None or scope.function is None:
            return None
        function = self._facts.functions.get(scope.function)
        if function is None:
            return None
        positional = [*function.params.posonly_params, *function.params.params]
        for position, param in enumerate(positional):
            if param.name.value == name:
                return scope.function, function, param, position
        for param in function.params.kwonly_params:
            if param.name.value == name:
                return scope.function, function, param, -1
        return None

    def _parameter_default(self, name: str, scope: Scope) -> StaticValue:
        found = self._parameter(name, scope)
        if found is None or name in self._facts.simple_assignments:
            return UNKNOWN  # rebound somewhere in the file: not the parameter's value for sure
        qualified, function, param, position = found
        if param.default is None:
            return UNKNOWN
        default = self._facts.evaluate(param.default)
        if not default.known or self._overridden(qualified, function, name, position, default):
            return UNKNOWN
        line = self._line_of_def(function)
        where = f"line {line}" if line is not None else "its definition"
        return StaticValue(True, default.value, default.flag, f"the default of parameter {name} of {function.name.value}(), {where}")

    def _overridden(self, qualified: str, function: cst.FunctionDef, name: str, position: int, default: StaticValue) -> bool:
        """Whether a call in the file passes ``name`` another value than ``default``
        (or one that cannot be read, or arguments unpacked from a sequence or dict)."""
        method_shift = 1 if "." in qualified else 0  # ``self`` is not passed by ``obj.method(...)``
        for call in self._facts.calls:
            func = call.node.func
            if isinstance(func, cst.Name) and func.value == function.name.value:
                shift = 0
            elif isinstance(func, cst.Attribute) and func.attr.value == function.name.value:
                shift = method_shift
            else:
                continue
            if call.has_star_args:
                return True
            index = position - shift if position >= shift else None
            passed = call.value_node(name, index)
            if passed is not None and self._facts.evaluate(passed).value != default.value:
                return True
        return False

    def _line_of_def(self, function: cst.FunctionDef) -> int | None:
        text = self._context.source.text
        header = f"def {function.name.value}("
        offset = text.find(header)
        if offset < 0 or text.find(header, offset + 1) >= 0:
            return None
        return text.count("\n", 0, offset) + 1

    # -- configs ------------------------------------------------------------

    def _config_value(self, chain: str, scope: Scope | None) -> StaticValue:
        root, _, attributes = chain.partition(".")
        facts = self._facts
        qualified = facts.names.bindings().get(root)
        if qualified is not None:
            return self._in_module_of(f"{qualified}.{attributes}", self._context.path, 0)
        found = self._parameter(root, scope)
        if found is not None:
            _, function, param, _ = found
            return self._parameter_config(function, param, attributes)
        assigned = facts.simple_assignments.get(root)
        if assigned and len(assigned) == 1 and isinstance(assigned[0], cst.Call):
            return self._built_by(assigned[0], attributes)
        return UNKNOWN

    def _built_by(self, call: cst.Call, attributes: str) -> StaticValue:
        """The value of ``attributes`` on the object ``call`` returns: a dataclass
        instance, a config a project function returns, a loaded YAML file."""
        callee = self._facts.names.resolve(call.func)
        if callee in _YAML_LOADERS and call.args and not call.args[0].keyword:
            path = self._facts.evaluate(call.args[0].value)
            if isinstance(path.value, str):
                for base in (self._context.path.parent, self._context.project_root):
                    if (base / path.value).is_file():
                        return self._yaml_value(Path(os.path.normpath(base / path.value)), attributes.split("."))
            return UNKNOWN
        if "." not in attributes:
            flag = self._project_flags(call).get(attributes)
            if flag is not None:
                return flag.default
        if any(arg.star for arg in call.args):
            return UNKNOWN
        head = attributes.partition(".")[0]
        if any(arg.keyword is not None and arg.keyword.value == head for arg in call.args):
            passed = next(arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == head)
            return self._facts.evaluate(passed) if "." not in attributes else UNKNOWN
        if any(arg.keyword is None for arg in call.args):
            return UNKNOWN  # a positional argument may set the field
        name = dotted_name(call.func)
        if name is None:
            return UNKNOWN
        return self._class_field_default(name, attributes)

    def _passed_object(self, function: cst.FunctionDef, param: cst.Param) -> cst.Call | None:
        """The call that built what every call of ``function`` in the file passes as
        ``param``: ``main(opt)`` with ``opt = opts().parse()`` assigned once."""
        name = function.name.value
        positional = [p.name.value for p in (*function.params.posonly_params, *function.params.params)]
        position = positional.index(param.name.value) if param.name.value in positional else None
        built = None
        for call in self._facts.calls:
            if not (isinstance(call.node.func, cst.Name) and call.node.func.value == name):
                continue
            passed = call.value_node(param.name.value, position)
            if not isinstance(passed, cst.Name):
                return None
            if call.scope.function is None:  # a module-level call passes the module-level name
                assigned = self._module_level_assignments.get(passed.value)
            else:
                assigned = self._facts.simple_assignments.get(passed.value)
            if call.has_star_args or not assigned or len(assigned) != 1 or not isinstance(assigned[0], cst.Call):
                return None
            if built is not None and built is not assigned[0]:
                return None
            built = assigned[0]
        return built

    @cached_property
    def _module_level_assignments(self) -> dict[str, list[cst.BaseExpression]]:
        """Name -> the values module-level code assigns it (the ``__main__`` guard and other
        branches included, function and class bodies not)."""
        found: dict[str, list[cst.BaseExpression]] = {}
        pending: list[cst.CSTNode] = list(self._context.module.body)
        while pending:
            statement = pending.pop()
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if isinstance(small, cst.Assign):
                        for target in small.targets:
                            if isinstance(target.target, cst.Name):
                                found.setdefault(target.target.value, []).append(small.value)
            elif isinstance(statement, (cst.If, cst.Else, cst.For, cst.While, cst.With, cst.Try)):
                body = statement.body
                pending.extend(body.body if isinstance(body, cst.IndentedBlock) else [])
                orelse = getattr(statement, "orelse", None)
                if orelse is not None:
                    pending.append(orelse)
        return found

    def _project_flags(self, call: cst.Call) -> dict[str, ArgparseFlag]:
        """The command-line flags of what ``call`` returns when it parses them in a
        project module: ``get_args()`` of an ``arguments.py`` that calls
        ``parse_args()``, ``opts().parse()``, ``TrainOptions().parse()`` (the flags of
        that module and of the project modules it imports: an options base class)."""
        func = call.func
        builder = func.value.func if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Call) else func
        qualname = self._facts.names.resolve(builder)
        index = self._context.project
        located = index.module_of(qualname, self._context.path) if qualname is not None else None
        summary = index.summary(located[0]) if located is not None else None
        if summary is None or not any(c.method == "parse_args" for c in summary.facts.calls):
            return {}
        flags = {}
        modules = [summary] + [
            index.summary(found[0])
            for imported in set(summary.facts.names.bindings().values())
            for found in [index.module_of(imported, summary.path)]
            if found is not None
        ]
        for module in reversed([m for m in modules if m is not None]):
            digest = index.digest(module.path)
            if digest is not None and module.facts.flags:
                self._context.dependencies[str(module.path)] = digest
            flags.update(module.facts.flags)
        return flags

    def _parameter_config(self, function: cst.FunctionDef, param: cst.Param, attributes: str) -> StaticValue:
        """A config parameter: a Hydra main's composed YAML, or the defaults of the
        dataclass it is annotated with."""
        hydra_main = self._hydra_main_of(function, param.name.value)
        if hydra_main is not None:
            value = self._hydra_value(hydra_main, attributes.split("."))
            if value.known:
                return value
        passed = self._passed_object(function, param)
        if passed is not None:
            return self._built_by(passed, attributes)
        if param.annotation is None:
            return UNKNOWN
        annotation = dotted_name(param.annotation.annotation)
        if annotation is None:
            return UNKNOWN
        return self._class_field_default(annotation, attributes)

    def _class_field_default(self, name: str, attributes: str) -> StaticValue:
        """The default of field ``attributes`` of the config class ``name`` (imported, or of this file)."""
        qualified = self._facts.names.bindings().get(name.partition(".")[0])
        if qualified is not None:
            rest = name.partition(".")[2]
            return self._in_module_of(f"{qualified}.{rest}" if rest else qualified, self._context.path, 0, called=attributes)
        module = self._module(self._context.path)
        if module is not None and name in module.classes:
            return self._field_default(module, module.classes[name], attributes.split("."), 0)
        return UNKNOWN

    @cached_property
    def _own_module(self) -> _ConfigModule | None:
        """The checked file's own classes (read from its text, which may not be on disk)."""
        return _read_config_module(self._context.path, self._context.source.text)

    def _module(self, path: Path) -> _ConfigModule | None:
        if path == self._context.path:
            return self._own_module
        index = self._context.project
        digest = index.digest(path)
        if digest is None:
            return None
        self._context.dependencies[str(path)] = digest
        return _config_module(path, digest)

    def _in_module_of(self, qualname: str, importer: Path, depth: int, called: str | None = None) -> StaticValue:
        """The value of ``qualname`` (as resolved in ``importer``) when it names a
        project module's config; with ``called``, the attribute path ``called`` of
        what calling it returns."""
        if depth > _MAX_DEPTH:
            return UNKNOWN
        located = self._context.project.module_of(qualname, importer)
        if located is None:
            return UNKNOWN
        path, attribute = located
        module = self._module(path)
        if module is None or not attribute:
            return UNKNOWN
        if called is not None:
            if attribute in module.classes:
                return self._field_default(module, module.classes[attribute], called.split("."), depth)
            if attribute in module.returns:
                return self._lookup(module, f"{module.returns[attribute]}.{called}", depth)
            if attribute in module.imports:
                return self._in_module_of(module.imports[attribute], path, depth + 1, called)
            return UNKNOWN
        return self._lookup(module, attribute, depth)

    def _lookup(self, module: _ConfigModule, dotted: str, depth: int) -> StaticValue:
        """``dotted`` ("config.CUDNN.BENCHMARK") in a module's top level."""
        if depth > _MAX_DEPTH:
            return UNKNOWN
        if dotted in module.assignments:
            assigned = module.assignments[dotted]
            if assigned is None:
                return UNKNOWN
            known, value = _literal(assigned[0])
            return StaticValue(True, value, origin=self._origin(module.path, assigned[1])) if known else UNKNOWN
        root, _, rest = dotted.partition(".")
        if not rest:
            return UNKNOWN
        if root in module.imports:
            return self._in_module_of(f"{module.imports[root]}.{rest}", module.path, depth + 1)
        assigned = module.assignments.get(root)
        if assigned is not None:
            value = assigned[0]
            if isinstance(value, ast.Name):  # ``config = _C``
                return self._lookup(module, f"{value.id}.{rest}", depth + 1)
            if isinstance(value, ast.Call) and not value.args and not value.keywords:
                callee = _dotted(value.func)
                if callee in module.classes:
                    return self._field_default(module, module.classes[callee], rest.split("."), depth + 1)
                if callee in module.returns:
                    return self._lookup(module, f"{module.returns[callee]}.{rest}", depth + 1)
        return UNKNOWN

    def _field_default(self, module: _ConfigModule, cls: ast.ClassDef, attributes: list[str], depth: int) -> StaticValue:
        """The default of field ``attributes[0]`` of dataclass ``cls`` (following
        nested dataclass fields for the rest of the path)."""
        if depth > _MAX_DEPTH or not any(
            (_dotted(d.func) if isinstance(d, ast.Call) else _dotted(d)) in _DATACLASS_DECORATORS
            or _dotted_import(module, d) in _DATACLASS_DECORATORS
            for d in cls.decorator_list
        ):
            return UNKNOWN
        head, rest = attributes[0], attributes[1:]
        for statement in cls.body:
            if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.target.id == head):
                continue
            value = statement.value
            if value is None:
                return UNKNOWN
            if isinstance(value, ast.Call) and _dotted(value.func) in ("field", "dataclasses.field"):
                keywords = {k.arg: k.value for k in value.keywords}
                if "default" in keywords:
                    value = keywords["default"]
                elif "default_factory" in keywords and rest:
                    nested = _dotted(keywords["default_factory"])
                    return self._field_default(module, module.classes[nested], rest, depth + 1) if nested in module.classes else UNKNOWN
                else:
                    return UNKNOWN
            if rest:
                return UNKNOWN
            known, literal = _literal(value)
            return StaticValue(True, literal, origin=self._origin(module.path, statement.lineno)) if known else UNKNOWN
        return UNKNOWN

    def _origin(self, path: Path, line: int) -> str:
        try:
            shown = path.resolve().relative_to(self._context.project_root.resolve()).as_posix()
        except ValueError:
            shown = path.name
        return f"the default set at {shown}:{line}"

    # -- YAML ---------------------------------------------------------------

    def instantiated(self, call: CallFact) -> tuple[str, dict[str, StaticValue]] | None:
        """For ``hydra.utils.instantiate(cfg.trainer, ...)`` on a Hydra main's config:
        the class the config node's ``_target_`` names and the options its YAML
        gives (those the call passes itself are left out: they override)."""
        if call.qualname not in _HYDRA_INSTANTIATE or not call.node.args or call.node.args[0].keyword is not None:
            return None
        chain = dotted_name(call.node.args[0].value)
        if chain is None or "." not in chain:
            return None
        root, _, attributes = chain.partition(".")
        found = self._parameter(root, call.scope)
        hydra_main = self._hydra_main_of(found[1], root) if found is not None else None
        located = self._hydra_find(hydra_main, attributes.split(".")) if hydra_main is not None else None
        if located is None or located[0].id != "mapping":
            return None
        node, path = located
        passed = {arg.keyword.value for arg in call.node.args if arg.keyword is not None}
        options = {}
        for key, value in node.value:
            if key.id == "scalar" and value.id == "scalar" and key.value not in passed:
                known, literal = _yaml_scalar(value)
                if known:
                    options[key.value] = StaticValue(True, literal, origin=self._origin(path, value.start_mark.line + 1))
        target = options.pop("_target_", None)
        return (target.value, options) if target is not None and isinstance(target.value, str) else None

    def _hydra_main_of(self, function: cst.FunctionDef, parameter: str) -> cst.Call | None:
        """The ``@hydra.main(...)`` whose config ``parameter`` of ``function`` is: the
        function's own, or that of the Hydra main that calls it with its config."""
        own = self._hydra_decorator(function)
        if own is not None:
            return own
        for call in self._facts.calls:
            if not (isinstance(call.node.func, cst.Name) and call.node.func.value == function.name.value) or call.scope.function is None:
                continue
            caller = self._facts.functions.get(call.scope.function)
            decorator = self._hydra_decorator(caller) if caller is not None else None
            if decorator is None:
                continue
            positional = [p.name.value for p in (*function.params.posonly_params, *function.params.params)]
            index = positional.index(parameter) if parameter in positional else None
            passed = call.value_node(parameter, index)
            caller_parameters = {p.name.value for p in (*caller.params.posonly_params, *caller.params.params)}
            if isinstance(passed, cst.Name) and passed.value in caller_parameters:
                return decorator
        return None

    def _hydra_decorator(self, function: cst.FunctionDef) -> cst.Call | None:
        for decorator in function.decorators:
            if isinstance(decorator.decorator, cst.Call) and self._facts.names.resolve(decorator.decorator.func) in _HYDRA_MAIN:
                return decorator.decorator
        return None

    def _hydra_value(self, decorator: cst.Call, attributes: list[str]) -> StaticValue:
        located = self._hydra_find(decorator, attributes)
        return self._scalar(*located) if located is not None else UNKNOWN

    def _hydra_find(self, decorator: cst.Call, attributes: list[str]) -> tuple[Any, Path] | None:
        def literal(keyword: str) -> object:
            arg = next((a for a in decorator.args if a.keyword is not None and a.keyword.value == keyword), None)
            return self._facts.evaluate(arg.value).value if arg is not None else None

        config_path, config_name = literal("config_path"), literal("config_name")
        if not isinstance(config_path, str) or not isinstance(config_name, str):
            return None
        folder = Path(os.path.normpath(self._context.path.parent / config_path))  # "../configs": named plainly in dependencies
        name = config_name if config_name.endswith((".yaml", ".yml")) else f"{config_name}.yaml"
        return self._yaml_find(folder / name, attributes, folder)

    def _yaml_value(self, path: Path, attributes: list[str]) -> StaticValue:
        located = self._yaml_find(path, attributes)
        return self._scalar(*located) if located is not None else UNKNOWN

    def _scalar(self, node: Any, path: Path) -> StaticValue:
        if node.id != "scalar":
            return UNKNOWN
        known, value = _yaml_scalar(node)
        return StaticValue(True, value, origin=self._origin(path, node.start_mark.line + 1)) if known else UNKNOWN

    def _yaml_find(self, path: Path, attributes: list[str], hydra_folder: Path | None = None) -> tuple[Any, Path] | None:
        """The node at ``attributes`` in the YAML file ``path``, and the file it is in;
        with ``hydra_folder``, the file's ``defaults`` list is composed from that
        folder's config groups (``- trainer: default`` is trainer/default.yaml)."""
        node = _yaml_node(path, self._context.project.digest(path) or "") if path.is_file() else None
        if node is None:
            return None
        self._context.dependencies[str(path)] = self._context.project.digest(path) or ""
        found = _mapping_get(node, attributes)
        if found is not None:
            return found, path
        if hydra_folder is not None and attributes:
            group = _mapping_get(node, ["defaults"])
            for option in getattr(group, "value", None) or []:
                pair = option.value[0] if getattr(option, "id", None) == "mapping" and len(option.value) == 1 else None
                if pair is not None and pair[0].value == attributes[0] and pair[1].id == "scalar":
                    return self._yaml_find(hydra_folder / attributes[0] / f"{pair[1].value}.yaml", attributes[1:])
        return None


def _dotted_import(module: _ConfigModule, decorator: ast.expr) -> str | None:
    """A decorator's name as imported (``from dataclasses import dataclass as dc``)."""
    name = _dotted(decorator.func if isinstance(decorator, ast.Call) else decorator)
    if name is None:
        return None
    root, _, rest = name.partition(".")
    bound = module.imports.get(root)
    return (f"{bound}.{rest}" if rest else bound) if bound is not None else None


@lru_cache(maxsize=64)
def _yaml_node(path: Path, digest: str) -> Any:
    """The composed YAML tree of ``path`` (with line marks), or None without PyYAML."""
    try:
        import yaml
    except ImportError:
        return None
    try:
        return yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def _mapping_get(node: Any, keys: list[str]) -> Any:
    for key in keys:
        if node is None or node.id != "mapping":
            return None
        node = next((value for name, value in node.value if name.id == "scalar" and name.value == key), None)
    return node


_YAML_TAGS = "tag:yaml.org,2002:"


def _yaml_scalar(node: Any) -> tuple[bool, Any]:
    tag, text = node.tag, node.value
    if "${" in text:
        return False, None  # an OmegaConf interpolation
    if tag == _YAML_TAGS + "bool":
        return True, text.lower() in ("true", "yes", "on")
    if tag == _YAML_TAGS + "int":
        try:
            return True, int(text, 0)
        except ValueError:
            return False, None
    if tag == _YAML_TAGS + "float":
        try:
            return True, float(text)
        except ValueError:
            return False, None
    if tag == _YAML_TAGS + "null":
        return True, None
    if tag == _YAML_TAGS + "str":
        return True, text
    return False, None
