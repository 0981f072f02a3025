"""Parsing a file into a libcst tree without the cyclic garbage collector
scanning the tree over and over.

A parse allocates a node object per token and more (hundreds of thousands for
a large model file), and every node is a container the cyclic GC tracks:
while the tree is built, and as long as it lives, each collection of an older
generation walks all of it again.  On timm's sources that was about a sixth
of a whole ``detaudit check`` (more than the shared walk and every rule
together).  Yet a libcst tree cannot hold a reference cycle (nodes are
immutable and hold no parent links), so it is freed by reference counting
alone and the GC never has anything to find in it.

So, inside ``file_scope()`` (the check of one file), ``parse_module`` pauses
the GC while libcst builds the tree, then freezes what is alive (moves it to
the GC's permanent generation, which collections skip) and resumes it.  At
the end of the scope everything frozen goes back to the oldest generation,
where it was headed anyway: cyclic garbage that happened to be frozen is
collected as usual, later; nothing is lost.  A process that froze objects of
its own (``gc.freeze()`` before forking workers) is left alone: there the
scope does nothing.

The same function skips libcst's node validation while its parser builds the
tree.  ``CSTNode.__post_init__`` validates every node as it is constructed
(whitespace, parentheses, operator spacing): a check for trees built by hand.
The parser only builds valid trees (libcst's own comment there says the work
could move out of the parse), yet it was a fifth of each parse.  The skip is
taken only while ``__post_init__`` is the function that does nothing but
validate (a libcst that does more there is parsed as it ships); trees built
outside the parse, by ``--fix`` among others, are validated as always.
"""

from __future__ import annotations

import contextlib
import gc
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import libcst as cst

_scopes = 0  # depth of the file_scope() calls that manage freezing


@contextlib.contextmanager
def file_scope() -> Iterator[None]:
    """While this runs, ``parse_module`` keeps new trees out of the GC's scans;
    on exit they are handed back to it."""
    global _scopes
    if _scopes == 0 and gc.get_freeze_count():
        yield  # someone else's frozen objects: unfreezing would hand them back too
        return
    _scopes += 1
    try:
        yield
    finally:
        _scopes -= 1
        if _scopes == 0:
            gc.unfreeze()


def parse_module(text: str) -> "cst.Module":
    """``libcst.parse_module(text)`` without validating the parser's own nodes;
    inside ``file_scope()``, without GC scans of the tree."""
    if not _scopes:
        return _parse_unvalidated(text)
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _parse_unvalidated(text)
    finally:
        gc.freeze()  # the tree, and a failed parse's pieces, wait out the scope in the permanent generation
        if enabled:
            gc.enable()


def _parse_unvalidated(text: str) -> "cst.Module":
    import libcst as cst

    node_class = cst.CSTNode
    validating = node_class.__dict__.get("__post_init__")
    if not _only_validates(validating):
        return cst.parse_module(text)
    node_class.__post_init__ = _no_validation
    try:
        return cst.parse_module(text)
    finally:
        node_class.__post_init__ = validating


def _no_validation(self: object) -> None:
    """Stands in for ``CSTNode.__post_init__`` while the parser builds nodes."""


def _only_validates(method: object) -> bool:
    """``method`` is libcst's ``__post_init__`` as known: one call of ``self._validate()``."""
    code = getattr(method, "__code__", None)
    return code is not None and code.co_names == ("_validate",) and code.co_argcount == 1
