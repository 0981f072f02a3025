"""Bitwise comparison of outputs computed at different batch sizes (DET022 batch-size-equality).

The rule looks for an exact comparison (``torch.equal``, ``.equal``,
``assert_close``/``allclose`` with ``atol=0, rtol=0``, ``numpy`` array
equality, ``torch.all(a == b)``) whose two sides are the same call on a batch
and on a part of it: ``f(x)[i]`` (or ``out[i]`` with ``out = f(x)``) against
``f(x[i:i+1])``, or ``f(x)`` against the rows computed one by one,
``torch.cat([f(x[i:i+1]) for i in ...])``.  Both sides must be visible in the
same function, the call must be the same expression, and every argument that
differs must be a slice of the batch's (``f(ids[i:i+1], mask=mask[i:i+1])``);
anything less certain is not reported.  A file that
switches on batch-invariant kernels (the knowledge base's markers:
``set_batch_invariant_mode``, ``VLLM_BATCH_INVARIANT``,
``torch._inductor.config.batch_invariant``...) is testing exactly this on
purpose and is left alone.
"""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.static.rule import Invalid, Rule

_EMPTY_MODULE = cst.Module(body=[])

#: exact comparisons of two arrays: qualified name -> needs zero tolerances
_EXACT_COMPARISONS = {
    "torch.equal": False,
    "numpy.array_equal": False,
    "numpy.testing.assert_array_equal": False,
    "numpy.testing.assert_equal": False,
    "torch.testing.assert_close": True,
    "torch.allclose": True,
    "numpy.allclose": True,
    "numpy.testing.assert_allclose": True,
}
_ALL_OF = ("torch.all", "numpy.all")  # torch.all(a == b)
#: joining per-row results back into a batch: torch.cat([f(x[i:i+1]) for i in ...])
_JOINS = frozenset({"torch.cat", "torch.stack", "torch.concat", "numpy.concatenate", "numpy.stack"})
# what one side of a comparison is, relative to the call that produced it
_SLICED, _WHOLE, _ROWS = "part of the call's result", "the call's result", "the call's results joined row by row"
#: calls that keep what a value holds per sample (device moves, dtype casts, detaching)
_TRANSPARENT_METHODS = frozenset({"cpu", "cuda", "to", "detach", "float", "double", "half", "numpy", "clone", "contiguous"})
#: how a single sample is made a batch of one
_ADD_BATCH_DIM_METHODS = frozenset({"unsqueeze", "view", "reshape"})


def _code(node: cst.CSTNode) -> str:
    return _EMPTY_MODULE.code_for_node(node)


def _is_zero(node: cst.BaseExpression | None) -> bool:
    if isinstance(node, cst.Integer):
        return node.evaluated_value == 0
    if isinstance(node, cst.Float):
        return node.evaluated_value == 0.0
    return False


class _Scope:
    def __init__(self, parent: "_Scope | None") -> None:
        self.parent = parent
        self.assignments: dict[str, list[cst.BaseExpression]] = {}
        self.comparisons: list[tuple[cst.Call, cst.BaseExpression, cst.BaseExpression]] = []

    def value_of(self, name: str) -> cst.BaseExpression | None:
        """What ``name`` was assigned, when it was assigned once (here or in an enclosing function)."""
        scope = self
        while scope is not None:
            values = scope.assignments.get(name)
            if values is not None:
                return values[0] if len(values) == 1 else None
            scope = scope.parent
        return None


class BatchSizeEquality(Rule):
    code = "DET022"
    name = "batch-size-equality"
    severity = Severity.WARNING
    summary = "Outputs computed at different batch sizes are compared bit for bit."
    rationale = """
        A kernel is deterministic for its own shape, not across shapes: matmul,
        convolution and attention kernels choose how to split their reductions
        from the batch size (MKL/oneDNN blocking on CPU, cuBLAS split-K and
        tile heuristics, flash-attention's split-KV on GPU), so `model(x[:1])`
        and `model(x)[:1]` differ in the last bits on most hardware (on torch
        2.13 CPU, `torch.mm` with a 1024x1024 weight from 4 rows on with AVX2,
        from 2 rows on with AVX-512).  Seeds and
        deterministic algorithms do not change that.  An exact comparison across
        batch sizes passes or fails by accident of shape and device, and code
        that relies on it (cached logits, log-probabilities recomputed at
        another batch size in RL) drifts.
        """
    fix_hint = (
        "Compare with a tolerance (`torch.testing.assert_close` with its default tolerances), or compute both "
        "sides at the same batch size; if bitwise equality across batch sizes is required, switch on "
        "batch-invariant kernels and check them with `detaudit run --vary batch`."
    )
    VALID = (
        # a tolerance: kernel-order differences are allowed
        "import torch\n"
        "def test_single_matches_batch(model, x):\n"
        "    torch.testing.assert_close(model(x[:1]), model(x)[:1])\n",
        # both sides at the same batch size: a determinism check, which is fine
        "import torch\n"
        "def test_repeatable(model, x):\n"
        "    assert torch.equal(model(x)[:1], model(x)[:1])\n",
        # different models on the same batch
        "import torch\n"
        "def test_export(model, exported, x):\n"
        "    assert torch.equal(exported(x[:1]), model(x)[:1])\n",
        # batch-invariant kernels are switched on: this is what the file tests
        "import torch\n"
        "from batch_invariant_ops import set_batch_invariant_mode\n"
        "def test_invariant(a, b):\n"
        "    with set_batch_invariant_mode():\n"
        "        assert torch.equal(torch.mm(a[:1], b), torch.mm(a, b)[:1])\n",
        # the part comes from another tensor than the batch
        "import torch\n"
        "def test_holdout(model, x, y):\n"
        "    assert torch.equal(model(x)[:1], model(y[:1]))\n",
        # the name is rebound: which value is compared is not visible
        "import torch\n"
        "def check(model, x):\n"
        "    out = model(x)\n"
        "    out = out.softmax(-1)\n"
        "    one = model(x[:1])\n"
        "    assert torch.equal(one, out[:1])\n",
    )
    INVALID = (
        Invalid(
            "import torch\n"
            "class TestClassifier:\n"
            "    def test_first_row(self):\n"
            "        logits = self.model(self.images)\n"
            "        assert logits[0:1].equal(self.model(self.images[0:1]))\n",
            line=5,
        ),
        Invalid(
            "import torch\n"
            "def test_single_matches_batch(model, x):\n"
            "    assert torch.equal(model(x[:1]), model(x)[:1])\n",
            line=3,
            message="`model` runs on the batch `x` and on part of it",
        ),
        Invalid(
            "import torch\n"
            "def test_rows(model, x):\n"
            "    batched = model(x)\n"
            "    for i in range(len(x)):\n"
            "        single = model(x[i].unsqueeze(0))\n"
            "        torch.testing.assert_close(single, batched[i : i + 1], atol=0, rtol=0)\n",
            line=6,
        ),
        Invalid(
            "import torch\n"
            "def test_mm(a, b):\n"
            "    out1 = torch.mm(a[:1], b)\n"
            "    out2 = torch.mm(a, b)[:1]\n"
            "    assert (out1 == out2).all()\n",
            line=5,
        ),
        Invalid(
            "import torch\n"
            "def test_generate_is_batch_invariant(lm, ids, mask):\n"
            "    together = lm.generate(ids, attention_mask=mask, max_new_tokens=8)\n"
            "    one_by_one = torch.cat(\n"
            "        [lm.generate(ids[r : r + 1], attention_mask=mask[r : r + 1], max_new_tokens=8) for r in range(len(ids))]\n"
            "    )\n"
            "    assert torch.equal(together, one_by_one)\n",
            line=7,
        ),
        Invalid(
            "import numpy as np\n"
            "import torch\n"
            "def check(policy, obs):\n"
            "    logits = policy(obs).logits.cpu().numpy()\n"
            "    first = policy(obs[:1]).logits.cpu().numpy()\n"
            "    np.testing.assert_array_equal(first, logits[:1])\n",
            line=6,
        ),
    )

    def __init__(self, context) -> None:
        super().__init__(context)
        self._scope = _Scope(None)
        source = context.source.text
        from detaudit.knowledge.batch_ops import load_batch_ops_table

        self._invariant_on = any(marker in source for marker in load_batch_ops_table().invariance_markers())

    # -- the walk: assignments and exact comparisons, per function -----------------
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scope = _Scope(self._scope)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._check(self._scope)
        self._scope = self._scope.parent

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if isinstance(target.target, cst.Name):
                self._scope.assignments.setdefault(target.target.value, []).append(node.value)
            else:  # a, b = ...: the names are rebound to something unknown
                for name in _names_in(target.target):
                    self._scope.assignments.setdefault(name, []).extend([node.value, node.value])

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.target, cst.Name):
            self._scope.assignments.setdefault(node.target.value, []).extend([node.value, node.value])

    def visit_Call(self, node: cst.Call) -> None:
        if self._invariant_on:
            return
        sides = self._compared(node)
        if sides is not None:
            self._scope.comparisons.append((node, *sides))

    def finish(self) -> None:
        self._check(self._scope)

    # -- what is compared ------------------------------------------------------------
    def _compared(self, call: cst.Call) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
        """The two sides of an exact comparison, or None."""
        qualname = self.facts.names.resolve(call.func)
        positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        keywords = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
        if qualname in _EXACT_COMPARISONS and len(positional) >= 2:
            if _EXACT_COMPARISONS[qualname] and not (_is_zero(keywords.get("atol")) and _is_zero(keywords.get("rtol"))):
                return None
            return positional[0], positional[1]
        if qualname in _ALL_OF and len(positional) == 1:
            return _equality(positional[0])
        if isinstance(call.func, cst.Attribute) and qualname is None:
            method = call.func.attr.value
            if method == "equal" and len(positional) == 1:
                return call.func.value, positional[0]
            if method == "all" and not call.args:
                return _equality(call.func.value)
        return None

    def _check(self, scope: _Scope) -> None:
        for call, left, right in scope.comparisons:
            for batch_side, part_side in ((left, right), (right, left)):
                whole = self._producer(batch_side, scope)
                part = self._producer(part_side, scope)
                # f(x)[i] vs f(x[i:i+1]); f(x) or f(x)[i] vs the rows f(x[i:i+1]) joined
                if whole is None or part is None or whole[1] == _ROWS or part[1] == _SLICED:
                    continue
                if whole[1] == _WHOLE and part[1] == _WHOLE:
                    continue
                batch = _sub_batch_arguments(whole[0], part[0])
                if batch is not None:
                    how = "row by row" if part[1] == _ROWS else "on part of it"
                    self.report(
                        call,
                        f"`{_code(whole[0].func)}` runs on the batch `{batch}` and {how}, and the results are "
                        "compared bit for bit: kernels reduce in an order chosen by the batch size, so the bits "
                        "differ by accident of shape and device.",
                    )
                    break

    def _producer(self, expression: cst.BaseExpression, scope: _Scope, depth: int = 0) -> tuple[cst.Call, str] | None:
        """The call that produced ``expression``, and how: ``f(x)[i].cpu()``
        -> (f(x), _SLICED); ``torch.cat([f(x[i:i+1]) for i in ...])`` ->
        (f(x[i:i+1]), _ROWS)."""
        if depth > 8:
            return None
        if isinstance(expression, cst.Subscript):
            found = self._producer(expression.value, scope, depth + 1)
            return (found[0], _SLICED) if found and found[1] == _WHOLE else None
        if isinstance(expression, cst.Attribute):  # outputs.logits
            return self._producer(expression.value, scope, depth + 1)
        if isinstance(expression, cst.Name):
            value = scope.value_of(expression.value)
            return self._producer(value, scope, depth + 1) if value is not None else None
        if isinstance(expression, cst.Call):
            func = expression.func
            if isinstance(func, cst.Attribute) and func.attr.value in _TRANSPARENT_METHODS:
                return self._producer(func.value, scope, depth + 1)
            if self.facts.names.resolve(func) in _JOINS:
                rows = expression.args[0].value if expression.args else None
                if isinstance(rows, (cst.ListComp, cst.GeneratorExp)):
                    found = self._producer(rows.elt, scope, depth + 1)
                    return (found[0], _ROWS) if found and found[1] == _WHOLE else None
                return None
            return expression, _WHOLE
        return None


def _equality(node: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
        target = node.comparisons[0]
        if isinstance(target.operator, cst.Equal):
            return node.left, target.comparator
    return None


def _names_in(node: cst.CSTNode) -> list[str]:
    if isinstance(node, cst.Name):
        return [node.value]
    if isinstance(node, (cst.Tuple, cst.List)):
        return [name for element in node.elements for name in _names_in(element.value)]
    return []


def _strip_batch_of_one(node: cst.BaseExpression) -> cst.BaseExpression:
    """``x[i].unsqueeze(0)`` and ``x[i][None]`` are ``x[i]`` made a batch of one."""
    while True:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _ADD_BATCH_DIM_METHODS:
            node = node.func.value
        elif isinstance(node, cst.Subscript) and all(
            isinstance(element.slice, cst.Index) and isinstance(element.slice.value, cst.Name)
            and element.slice.value.value == "None"
            for element in node.slice
        ):
            node = node.value
        else:
            return node


def _sub_batch_arguments(whole: cst.Call, part: cst.Call) -> str | None:
    """The batch (``x``; ``ids, mask`` for several) when ``part`` is ``whole``
    called on slices of its batch arguments with everything else the same;
    else None."""
    if _code(whole.func) != _code(part.func) or len(whole.args) != len(part.args):
        return None
    differing = [(a, b) for a, b in zip(whole.args, part.args) if _argument(a) != _argument(b)]
    if not differing:
        return None
    for whole_arg, part_arg in differing:
        if _argument(whole_arg)[:2] != _argument(part_arg)[:2]:  # another keyword or unpacking
            return None
        sliced = _strip_batch_of_one(part_arg.value)
        if not (isinstance(sliced, cst.Subscript) and _code(sliced.value) == _code(whole_arg.value)):
            return None
    return ", ".join(_code(whole_arg.value) for whole_arg, _ in differing)


def _argument(arg: cst.Arg) -> tuple[str | None, str, str]:
    return (arg.keyword.value if arg.keyword else None, arg.star, _code(arg.value))
