"""Edits a rule attaches to a finding so that ``detaudit check --fix`` can apply it.

An edit names nodes of the checked module; ``detaudit.static.fix`` applies the
edits of all fixed findings in one libcst transform, so formatting and comments
outside the edited nodes stay byte-for-byte as they were.

A rule passes one edit, or a tuple of edits that stand or fall together, as
``self.report(node, message, fix=...)``.  Edits that need a module imported
name it in ``imports``; the fixer adds ``import <module>`` after the file's
imports unless the file already binds that name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence, Union

import libcst as cst

from detaudit.static.names import NameTable

if TYPE_CHECKING:
    from detaudit.static.facts import CallFact
    from detaudit.static.rule import Rule


@dataclass(frozen=True)
class Replace:
    """Replace ``old`` (a node of the checked module) by ``new``.

    ``safe`` fixes keep the author's intent (turn a hazard off that was turned
    on by a literal); unsafe ones change behaviour a reader may rely on (a
    command-line flag's default) and are applied only with ``--unsafe-fixes``.
    """

    old: cst.CSTNode
    new: cst.CSTNode
    safe: bool = True
    imports: tuple[str, ...] = ()


@dataclass(frozen=True)
class InsertStatement:
    """Insert the one-line statement ``code`` after ``anchor`` (a statement of
    the checked module, in any block), or before it with ``before=True``.

    The same insertion asked for by several findings (three missing-seed rules
    all wanting one seeding call) is made once.
    """

    anchor: cst.BaseStatement
    code: str
    before: bool = False
    imports: tuple[str, ...] = ()
    safe: bool = True


Edit = Union[Replace, InsertStatement]


def edits_of(fix: Edit | Sequence[Edit] | None) -> tuple[Edit, ...]:
    """The edits of a ``RuleHit.fix`` (one edit, several, or none)."""
    if fix is None:
        return ()
    if isinstance(fix, (Replace, InsertStatement)):
        return (fix,)
    return tuple(fix)


def same_quotes_string(original: cst.BaseExpression, value: str) -> cst.SimpleString:
    """A string literal holding ``value`` in the quote style of ``original``."""
    quote = '"'
    if isinstance(original, cst.SimpleString):
        quote = original.quote
    return cst.SimpleString(f"{quote}{value}{quote}")


def wrapped_in_call(node: cst.BaseExpression, function: str) -> cst.Call:
    """``function(node)``, e.g. ``sorted(os.listdir(d))``."""
    return cst.Call(func=cst.parse_expression(function), args=[cst.Arg(node)])


def with_keyword_arguments(call: cst.Call, arguments: Sequence[tuple[str, cst.BaseExpression]]) -> cst.Call:
    """``call`` with ``keyword=value`` arguments appended in the call's own layout:
    a one-line call stays on one line; in a call with one argument per line each
    new argument gets its own line, a trailing comma stays trailing, and a
    comment after the last argument stays on its line."""
    args = list(call.args)
    new_args = [cst.Arg(value, keyword=cst.Name(name), equal=_equal_like(args[-1]) if args else _TIGHT_EQUAL) for name, value in arguments]
    if not args:
        return call.with_changes(args=new_args)
    last = args[-1]
    separator = _separator(call, args)
    if _is_multiline_comma(last.comma):
        # the last argument keeps its comma (and comment); the new last one gets a bare one before ")"
        closing = last.comma.whitespace_after
        kept = last.comma.with_changes(whitespace_after=closing.with_changes(last_line=_next_line_indent(separator, call)))
        trailing = last.comma.with_changes(whitespace_after=closing.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[]))
    elif isinstance(last.whitespace_after_arg, cst.ParenthesizedWhitespace):
        # no trailing comma, ")" on its own line: the line break (and comment) stays after the old last argument
        closing = last.whitespace_after_arg
        last = last.with_changes(whitespace_after_arg=cst.SimpleWhitespace(""))
        kept = cst.Comma(whitespace_after=closing.with_changes(last_line=_next_line_indent(separator, call)))
        trailing = cst.MaybeSentinel.DEFAULT
        new_args[-1] = new_args[-1].with_changes(
            whitespace_after_arg=closing.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])
        )
    else:
        kept, trailing = separator, last.comma
    new_args = [arg.with_changes(comma=separator) for arg in new_args[:-1]] + [new_args[-1].with_changes(comma=trailing)]
    return call.with_changes(args=[*args[:-1], last.with_changes(comma=kept), *new_args])


def _separator(call: cst.Call, args: list[cst.Arg]) -> cst.Comma:
    """The comma between two arguments in this call's layout, without comments."""
    if len(args) > 1 and isinstance(args[-2].comma, cst.Comma):
        comma = args[-2].comma
    elif _is_multiline_comma(args[-1].comma) or isinstance(args[-1].whitespace_after_arg, cst.ParenthesizedWhitespace):
        return cst.Comma(whitespace_after=cst.ParenthesizedWhitespace(indent=True, last_line=_argument_indent(call)))
    else:
        return cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if _is_multiline_comma(comma):
        comma = comma.with_changes(whitespace_after=comma.whitespace_after.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[]))
    return comma


def _next_line_indent(separator: cst.Comma, call: cst.Call) -> cst.SimpleWhitespace:
    if _is_multiline_comma(separator):
        return separator.whitespace_after.last_line
    return _argument_indent(call)


def _is_multiline_comma(comma: cst.Comma | cst.MaybeSentinel) -> bool:
    return isinstance(comma, cst.Comma) and isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace)


def _argument_indent(call: cst.Call) -> cst.SimpleWhitespace:
    """The indentation of the first argument when it sits on its own line."""
    whitespace = call.whitespace_before_args
    if isinstance(whitespace, cst.ParenthesizedWhitespace):
        return whitespace.last_line
    return cst.SimpleWhitespace("    ")


#: ``a=1`` (libcst's default spelling is ``a = 1``)
_TIGHT_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def _equal_like(argument: cst.Arg) -> cst.AssignEqual:
    """``=`` spaced like the neighbouring keyword argument's (``a=1`` or ``a = 1``)."""
    return argument.equal if isinstance(argument.equal, cst.AssignEqual) else _TIGHT_EQUAL


def insert_before_first_use(module: cst.Module, use_index: int, code: str, *, imports: tuple[str, ...] = (), safe: bool = True) -> InsertStatement:
    """Insert setup code (a seeding call) that must run before the module-level
    statement ``module.body[use_index]``: right after the last module-level
    import above that statement, else right before it."""
    anchor, before = setup_position(module, use_index)
    return InsertStatement(anchor, code, before=before, imports=imports, safe=safe)


def setup_position(module: cst.Module, use_index: int) -> tuple[cst.BaseStatement, bool]:
    """(anchor, before) of ``insert_before_first_use``."""
    for index in range(min(use_index, len(module.body)) - 1, -1, -1):
        if is_import_line(module.body[index]):
            return module.body[index], False
    return module.body[use_index], True


def is_import_line(statement: cst.CSTNode) -> bool:
    """A line of nothing but imports (``import a; from b import c``)."""
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


# -- ready-made fixes the rules share ---------------------------------------------------
#
# Seeding and determinism calls go at module level, right after the imports and
# before the code that needs them: they then run once per process, never once per
# call of a function that builds a model.


def seeding_fix(rule: "Rule", before: "CallFact", rngs: frozenset[str], *, safe: bool = True) -> InsertStatement:
    """Seed ``rngs`` before ``before`` runs, right after the imports: with a
    seed-everything helper of a library the file imports, else right after the
    file's own seeding helper (defined above that point), else with
    ``detaudit.seed_everything(0)``."""
    from detaudit.knowledge.apis import FIX_DEFAULT_SEED

    module = rule.context.module
    use_index = before.scope.top_level_index
    anchor, before_anchor = setup_position(module, use_index)
    insertion_index = _index_of(module, anchor) + (0 if before_anchor else 1)
    if _library_seeding_call(module, insertion_index) is None:
        helper = _own_seeding_helper(rule, rngs, use_index)
        if helper is not None:
            index, name = helper
            if index >= insertion_index:
                anchor, before_anchor = module.body[index], False
            return InsertStatement(anchor, f"{name}({FIX_DEFAULT_SEED})", before=before_anchor, safe=safe)
    code, imports = seeding_call(rule, rngs, insertion_index)
    return InsertStatement(anchor, code, before=before_anchor, imports=imports, safe=safe)


def seed_by_default_fix(rule: "Rule", condition: cst.If, seeding: "CallFact", rngs: frozenset[str]) -> Replace | None:
    """Give ``condition`` (an ``if`` that keeps the call ``seeding`` off by
    default) an ``else`` that seeds ``rngs`` with the default seed.  Unsafe: a
    flag's default decided, and default runs change from unseeded to seeded."""
    if condition.orelse is not None:
        return None
    code, imports = seeding_call(rule, rngs, seeding.scope.top_level_index)
    seeded_otherwise = cst.Else(body=cst.IndentedBlock(body=[cst.parse_statement(code)]))
    return Replace(condition, condition.with_changes(orelse=seeded_otherwise), safe=False, imports=imports)


def seeding_call(rule: "Rule", rngs: frozenset[str], available_before: int) -> tuple[str, tuple[str, ...]]:
    """(code, imports) of a call seeding ``rngs`` that can run before the
    module-level statement ``available_before``: a library's seed-everything
    helper the file imports, the file's own seeding helper, else detaudit's."""
    from detaudit.knowledge.apis import FIX_DEFAULT_SEED, FIX_MODULE, FIX_SEEDING_CALL

    library = _library_seeding_call(rule.context.module, available_before)
    if library is not None:
        return f"{library}({FIX_DEFAULT_SEED})", ()
    helper = _own_seeding_helper(rule, rngs, available_before)
    if helper is not None:
        return f"{helper[1]}({FIX_DEFAULT_SEED})", ()
    return f"{FIX_SEEDING_CALL}({FIX_DEFAULT_SEED})", (FIX_MODULE,)


def _library_seeding_call(module: cst.Module, available_before: int) -> str | None:
    """How the file spells a library's seed-everything helper (``L.seed_everything``)
    with the names its module-level imports above ``available_before`` bind."""
    from detaudit.knowledge.apis import RNGS, SEEDING_FUNCTIONS

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


def _own_seeding_helper(rule: "Rule", rngs: frozenset[str], defined_before: int) -> tuple[int, str] | None:
    """(index, name) of a module-level function defined above ``defined_before``
    that seeds ``rngs`` from its one required argument."""
    from detaudit.static.project import ModuleSummary

    module = rule.context.module
    summary = None
    for index, statement in enumerate(module.body[:defined_before]):
        if not (isinstance(statement, cst.FunctionDef) and _takes_one_seed(statement)):
            continue
        summary = summary or ModuleSummary(rule.facts, rule.context.path, None, rule.context.project)
        if rngs <= summary.function_effects(statement.name.value).seeds:
            return index, statement.name.value
    return None


def _takes_one_seed(function: cst.FunctionDef) -> bool:
    parameters = function.params
    required = [p for p in parameters.params if p.default is None]
    return len(parameters.posonly_params) == 0 and len(required) == 1 and parameters.params[0].default is None


def determinism_fix(rule: "Rule", before: "CallFact") -> InsertStatement:
    """``detaudit.enable_determinism()`` right after the file's first seeding
    call that runs before ``before`` (in the same block), else after the imports.

    Unsafe: in strict mode a nondeterministic op without a deterministic
    implementation then raises, which changes what the program does."""
    from detaudit.knowledge.apis import FIX_DETERMINISM_CALL, FIX_MODULE
    from detaudit.static.project import ModuleSummary

    code, imports = f"{FIX_DETERMINISM_CALL}()", (FIX_MODULE,)
    facts = rule.facts
    summary = ModuleSummary(facts, rule.context.path, None, rule.context.project)
    for call in facts.calls:
        if call.order >= before.order:
            break
        if call.scope.function not in (None, before.scope.function) or not call.scope.straight_line:
            continue
        statement = statement_holding(rule, call)
        if statement is not None and summary.call_effects(call).seeds:
            return InsertStatement(statement, code, imports=imports, safe=False)
    return insert_before_first_use(rule.context.module, before.scope.top_level_index, code, imports=imports, safe=False)


def statement_holding(rule: "Rule", call: "CallFact") -> cst.SimpleStatementLine | None:
    """The statement that is ``call`` (``f(x)`` or ``y = f(x)``) in the block of
    its function, the module or the main guard; None when it is nested deeper."""
    if call.scope.function is not None:
        function = rule.facts.functions.get(call.scope.function)
        blocks = [function.body.body] if function is not None and isinstance(function.body, cst.IndentedBlock) else []
    else:
        module = rule.context.module
        top = module.body[call.scope.top_level_index] if call.scope.top_level_index < len(module.body) else None
        blocks = [[top]] if top is not None else []
        if isinstance(top, cst.If) and isinstance(top.body, cst.IndentedBlock):
            blocks.append(top.body.body)  # the main guard
    for block in blocks:
        for statement in block:
            if isinstance(statement, cst.SimpleStatementLine) and any(
                getattr(small, "value", None) is call.node for small in statement.body
            ):
                return statement
    return None


def _index_of(module: cst.Module, statement: cst.CSTNode) -> int:
    return next(i for i, s in enumerate(module.body) if s is statement)



def seeded_loader_fix(
    call: "CallFact", generator_parameter: tuple[str, int], worker_init_parameter: tuple[str, int] | None = None
) -> Replace | None:
    """Give a shuffling ``DataLoader`` / ``random_split`` call a seeded
    ``generator=detaudit.make_generator(0)`` (and, for a DataLoader without one,
    ``worker_init_fn=detaudit.seed_worker``).  Parameters are (keyword, position)."""
    from detaudit.knowledge.apis import FIX_DEFAULT_SEED, FIX_GENERATOR_FACTORY, FIX_MODULE, FIX_WORKER_INIT_FN

    if call.has_star_args:
        return None  # ``**options`` may already pass them
    generator = cst.parse_expression(f"{FIX_GENERATOR_FACTORY}({FIX_DEFAULT_SEED})")
    added: list[tuple[str, cst.BaseExpression]] = []
    if worker_init_parameter is not None and call.argument(*worker_init_parameter) is None:
        added.append((worker_init_parameter[0], cst.parse_expression(FIX_WORKER_INIT_FN)))
    existing = call.argument(*generator_parameter)  # ``generator=None``
    new_call = call.node
    if existing is None:
        added.append((generator_parameter[0], generator))
    else:
        new_call = new_call.with_changes(args=[arg.with_changes(value=generator) if arg is existing else arg for arg in new_call.args])
    if added:
        new_call = with_keyword_arguments(new_call, added)
    return Replace(call.node, new_call, imports=(FIX_MODULE,))


def sorted_fix(node: cst.BaseExpression, *, safe: bool = True) -> Replace | None:
    """``sorted(node)``; None for a dict (sorting it would keep only its keys)."""
    if isinstance(node, (cst.Dict, cst.DictComp)):
        return None
    return Replace(node, wrapped_in_call(node, "sorted"), safe=safe)


def sorted_iteration_fix(node: cst.BaseExpression) -> Replace | None:
    """Sort what ``node`` iterates over: ``enumerate(s)`` -> ``enumerate(sorted(s))``,
    ``[f(x) for x in s]`` -> ``[f(x) for x in sorted(s)]``.  None when that is not
    one plain argument or one ``for``."""
    if isinstance(node, cst.Call) and len(node.args) == 1 and not node.args[0].star and node.args[0].keyword is None:
        iterated = node.args[0].value
    elif isinstance(node, (cst.ListComp, cst.GeneratorExp, cst.DictComp, cst.SetComp)) and node.for_in.inner_for_in is None:
        iterated = node.for_in.iter
    else:
        return None
    return Replace(iterated, wrapped_in_call(iterated, "sorted"))
