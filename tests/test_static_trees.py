"""Parsing with the cyclic GC kept off the tree (detaudit/static/engine/trees.py)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

import libcst as cst

from detaudit.static.engine.trees import file_scope, parse_module

SOURCE = "import torch\n\ndef f(x):\n    return torch.randn(3) + x\n"


class _Cyclic:
    def __init__(self) -> None:
        self.me = self


def test_inside_a_scope_the_tree_is_frozen_until_the_scope_ends():
    assert gc.get_freeze_count() == 0
    with file_scope():
        module = parse_module(SOURCE)
        assert module.code == SOURCE
        assert module.deep_equals(cst.parse_module(SOURCE))
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_cyclic_garbage_frozen_during_a_scope_is_collected_after_it():
    with file_scope():
        garbage = _Cyclic()
        alive = weakref.ref(garbage)
        del garbage  # a cycle: only the GC can free it, and the parse below freezes it
        parse_module(SOURCE)
        gc.collect()
        assert alive() is not None
    gc.collect()
    assert alive() is None


def test_outside_a_scope_and_in_a_process_that_froze_objects_nothing_is_frozen():
    parse_module(SOURCE)
    assert gc.get_freeze_count() == 0
    kept = [_Cyclic() for _ in range(3)]
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with file_scope():
            parse_module(SOURCE)
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
    del kept


def test_a_failed_parse_inside_a_scope_leaves_the_gc_enabled():
    with file_scope():
        try:
            parse_module("def (:\n")
        except cst.ParserSyntaxError:
            pass
        assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_trees_parsed_without_validation_equal_libcsts_and_validation_comes_back():
    """The parse skips libcst's per-node validation (the parser builds valid nodes
    only): the trees are libcst's own, a failed parse restores the validation
    too, and nodes built by hand (``--fix``) are still validated."""
    sources = sorted((Path(__file__).resolve().parent.parent / "fixtures" / "static").rglob("*.py"))
    assert len(sources) > 20
    for source in sources:
        text = source.read_text(encoding="utf-8")
        try:
            expected = cst.parse_module(text)
        except cst.ParserSyntaxError:
            continue
        assert parse_module(text).deep_equals(expected), source
    with pytest.raises(cst.ParserSyntaxError):
        parse_module("def broken(:\n")
    with pytest.raises(cst.CSTValidationError):
        cst.Name("not a name")
