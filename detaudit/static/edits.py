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
from typing import Sequence, Union

import libcst as cst


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
    new argument gets its own line, and a trailing comma stays trailing."""
    args = list(call.args)
    if not args:
        new_args = [cst.Arg(value, keyword=cst.Name(name), equal=_TIGHT_EQUAL) for name, value in arguments]
        return call.with_changes(args=new_args)
    last = args[-1]
    # the separator between existing arguments, reused between the new ones
    separator = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else None
    if separator is None:
        separator = last.comma if _is_multiline_comma(last.comma) else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        if _is_multiline_comma(separator):
            separator = separator.with_changes(
                whitespace_after=separator.whitespace_after.with_changes(last_line=_argument_indent(call))
            )
    trailing = last.comma  # a trailing comma (and the newline before ")") moves to the new last argument
    new_args = [cst.Arg(value, keyword=cst.Name(name), equal=_equal_like(last), comma=separator) for name, value in arguments]
    new_args[-1] = new_args[-1].with_changes(comma=trailing)
    return call.with_changes(args=[*args[:-1], last.with_changes(comma=separator), *new_args])


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
    for index in range(min(use_index, len(module.body)) - 1, -1, -1):
        if is_import_line(module.body[index]):
            return InsertStatement(module.body[index], code, imports=imports, safe=safe)
    return InsertStatement(module.body[use_index], code, before=True, imports=imports, safe=safe)


def is_import_line(statement: cst.CSTNode) -> bool:
    """A line of nothing but imports (``import a; from b import c``)."""
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )
