"""The iteration order of a set of strings turned into data order (DET032 set-iteration-order)."""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.static.analyses.strings import is_string_expression, is_string_iterable, is_string_set
from detaudit.static.engine.names import dotted_name
from detaudit.static.fixes.edits import Replace, wrapped_in_call
from detaudit.static.rule import Invalid
from detaudit.static.rules.data_order._common import SET_ADDING_METHODS, OrderRule, ScopeFlow, Unordered


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


class SetIterationOrder(OrderRule):
    code = "DET032"
    name = "set-iteration-order"
    severity = Severity.WARNING
    summary = "The iteration order of a set of strings is turned into data order."
    rationale = """
        Python salts the hash of `str` and `bytes` per process (unless
        PYTHONHASHSEED is fixed before the interpreter starts), so a set of
        strings iterates in a different order in every run.  Turning that order
        into data (`list(labels)`, `enumerate(vocab)`, a class index
        `{c: i for i, c in enumerate(set(names))}`, `" ".join(tags)`, a list
        built by a loop) gives different token ids or class indices per run.
        Sets of ints iterate in a fixed order, so only sets whose elements are
        visibly strings (literals, `str` methods, `split()` words) are reported.
        """
    fix_hint = "Sort before the order matters: `sorted(labels)`, `enumerate(sorted(vocab))`."
    VALID = (
        "import torch\nvocab = set('the cat sat'.split())\nword_to_id = {w: i for i, w in enumerate(sorted(vocab))}\n",
        # membership and size only
        "import torch\nSTOP = {'a', 'the', 'of'}\nwords = [w for w in 'the cat'.split() if w not in STOP]\nn = len(STOP)\n",
        # sets of ints iterate in a fixed order
        "import torch\nids = set([3, 1, 2])\nindex = {c: i for i, c in enumerate(ids)}\n",
        # a loop with side effects only
        "import torch\nfor name in {'a.pt', 'b.pt'}:\n    torch.save({}, name)\n",
        # a vocabulary from split words, sorted before ids are given; its size only
        "import torch\nwords = open('c.txt').read().split()\nvocab = sorted(set(words))\nn = len(set(words))\n"
        "stoi = {w: i for i, w in enumerate(vocab)}\n",
        # dir() sorts what __dir__ returns
        "import torch\ndef __dir__():\n    return list({'load', 'save'} | set(globals()))\n",
        # passed as a membership container
        "import torch\nKEEP = {'weight', 'bias'}\ndef keep(state):\n    return {k: v for k, v in state.items() if k in KEEP}\n",
    )
    INVALID = (
        Invalid("import torch\nlabels = {'cat', 'dog', 'bird'}\nclass_to_idx = {c: i for i, c in enumerate(labels)}\n", line=3, message="enumerate"),
        Invalid(
            "import torch\ntext = open('corpus.txt').read()\nvocab = list(set(text.split()))\nstoi = {w: i for i, w in enumerate(vocab)}\n",
            line=3,
            message="enumerate",
        ),
        Invalid(
            "import torch\nvocab = set()\nfor line in open('corpus.txt'):\n    for word in line.split():\n        vocab.add(word)\nitos = list(vocab)\ntoken = itos[0]\n",
            line=6,
        ),
        Invalid("import torch\ntags = {t.lower() for t in ['A', 'B']}\nheader = ','.join(tags)\n", line=3, message="join"),
        # words split into a list first, then deduplicated through a set
        Invalid(
            "import torch\nsentences = ['i like dog', 'i hate milk']\nword_list = ' '.join(sentences).split()\n"
            "word_list = list(set(word_list))\nword_dict = {w: i for i, w in enumerate(word_list)}\n",
            line=4,
            message="enumerate",
        ),
        Invalid(
            "import torch\ndef vocab(text):\n    words = text.split()\n    return {w: i for i, w in enumerate(set(words))}\n",
            line=4,
            message="enumerate",
        ),
        Invalid("import torch\nnames = frozenset(['x', 'y'])\nfirst = names.pop()\n", line=3, message="pop"),
        Invalid(
            "import torch\ndef build(words):\n    out = []\n    for w in {w.lower() for w in words}:\n        out.append(w)\n    return out\n",
            line=4,
        ),
    )

    # Only scopes that build a set of strings (or an empty set to fill) are walked in finish().
    def visit_Set(self, node: cst.Set) -> None:
        if is_string_set(node, self.facts):
            self._mark()

    def visit_SetComp(self, node: cst.SetComp) -> None:
        if is_string_set(node, self.facts):
            self._mark()

    def visit_Call(self, node: cst.Call) -> None:
        call = self.facts.calls[-1]
        # ``set(words)``: whether ``words`` holds strings only the walk of the scope can tell
        if call.node is node and call.qualname in ("set", "frozenset") and (
            not node.args or isinstance(node.args[0].value, (cst.Name, cst.Attribute)) or is_string_set(node, self.facts)
        ):
            self._mark()

    def source(self, node: cst.CSTNode, flow: ScopeFlow) -> Unordered | None:
        if isinstance(node, (cst.Set, cst.SetComp, cst.Call)) and is_string_set(node, self.facts, frozenset(flow.string_names)):
            # unsafe: a set kept in a name becomes a list (``.add`` no longer works)
            return Unordered("a set of strings", node, ordered=False, fix=sorted_fix(node, safe=False))
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in SET_ADDING_METHODS:
            self._fill_empty_set(node, flow)
        return None

    def _fill_empty_set(self, call: cst.Call, flow: ScopeFlow) -> None:
        """``s = set(); s.add(word)``: the set holds strings once one is added."""
        name = dotted_name(call.func.value)
        if name not in flow.empty_sets or not call.args:
            return
        argument = call.args[0].value
        strings = frozenset(flow.string_names)
        adds_text = (
            is_string_expression(argument, self.facts, strings)
            if call.func.attr.value == "add"
            else is_string_iterable(argument, self.facts, strings)
        )
        if adds_text:
            flow.pending[name] = Unordered("a set of strings", flow.empty_sets.pop(name), ordered=False)

    def materialised(self, value: Unordered, node: cst.CSTNode) -> Unordered:
        if value.ordered:
            return value
        if isinstance(node, cst.For):  # the loop iterates the set itself: sort that, not what built it
            return Unordered(value.what, node.iter, ordered=True, fix=sorted_fix(node.iter))
        return Unordered(value.what, node, ordered=True, fix=sorted_iteration_fix(node))

    def message(self, value: Unordered, use: str) -> str:
        return f"{value.what} iterates in a per-process order (PYTHONHASHSEED), and that order is used ({use}); sort it first."
