"""Edit primitives: what a rule attaches to a finding so that ``detaudit check --fix`` can apply it.

An edit names nodes of the checked module; ``detaudit.static.fixes.apply`` applies the
edits of all fixed findings in one libcst transform, so formatting and comments
outside the edited nodes stay byte-for-byte as they were.  The fix for a
hazard (what to seed, where, with which call) is written next to the rule
that reports it, from these primitives.

A rule passes one edit, or a tuple of edits that stand or fall together, as
``self.report(node, message, fix=...)``.  Edits that need a module imported
name it in ``imports``; the fixer adds ``import <module>`` after the file's
imports unless the file already binds that name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence, Union

import libcst as cst


@dataclass(frozen=True)
class Replace:
    """Replace ``old`` (a node of the checked module) by ``new``.

    ``safe`` fixes keep the author's intent (turn a hazard off that was turned
    on by a literal); unsafe ones change behaviour a reader may rely on (a
    command-line flag's default) and are applied only with ``--unsafe-fixes``.

    ``stale_comment``: words (lower case) that, in the comment ending the line
    of the statement holding ``old``, show the comment describes what the edit
    undoes (``allow_tf32 = True  # allow tf32 on matmul``): that comment is
    dropped with the fix, since it would be wrong next to the new value.
    """

    old: cst.CSTNode
    new: cst.CSTNode
    safe: bool = True
    imports: tuple[str, ...] = ()
    stale_comment: frozenset[str] = frozenset()


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


def comment_words(text: str) -> frozenset[str]:
    """The lower-case words of a comment or a dotted name (``allow_tf32`` is
    ``allow`` and ``tf32``), to match ``Replace.stale_comment`` against."""
    return frozenset(re.findall(r"[a-z0-9]+", text.lower()))


#: Why code turns a reproducibility hazard on; a comment giving that reason is
#: wrong once the fix turns it off.
_SPEED_WORDS = frozenset({"fast", "faster", "fastest", "speed", "speedup", "speeds", "perf", "performance", "throughput"})


def setting_comment_words(setting: str, old_value: str) -> frozenset[str]:
    """``Replace.stale_comment`` of a fix that changes the setting ``setting``
    (a dotted name) away from ``old_value`` (as code): a comment naming the
    setting (``# allow tf32 on matmul``), its old value or the speed it was
    for is wrong once the fix changes it.  (Words of the module path, such as
    ``torch`` or ``backends``, name no setting and are left out.)"""
    return comment_words(setting.rpartition(".")[2]) | comment_words(old_value) | _SPEED_WORDS


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
