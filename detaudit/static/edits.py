"""Edits a rule attaches to a finding so that ``detaudit check --fix`` can apply it.

An edit names nodes of the checked module; ``detaudit.static.fix`` applies the
edits of all fixed findings in one libcst transform, so formatting and comments
outside the edited nodes stay byte-for-byte as they were.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def same_quotes_string(original: cst.BaseExpression, value: str) -> cst.SimpleString:
    """A string literal holding ``value`` in the quote style of ``original``."""
    quote = '"'
    if isinstance(original, cst.SimpleString):
        quote = original.quote
    return cst.SimpleString(f"{quote}{value}{quote}")
