"""Uninitialised memory read as data (DET021 uninitialized-memory).

``x = torch.empty(...)`` is followed through the statements after it in the same
block, in order, until something decides it: a full write (``copy_``, ``fill_``,
``out=x``, ``nn.init.*``) ends the check; a read (a reduction, arithmetic, a
torch function) after no write, or after writes that visibly leave a part
unwritten, is reported.  Anything the linter cannot see through (a loop or
branch that touches ``x``, passing it to an unknown function, returning it,
aliasing it) ends the check silently: precision before recall.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.apis import (
    EMPTY_ALLOCATOR_METHODS,
    EMPTY_ALLOCATORS,
    FULL_WRITE_METHODS,
    IN_PLACE_INIT_PREFIX,
    METADATA_METHODS,
    PARTIAL_WRITE_METHODS,
    TENSOR_VIEW_FUNCTIONS,
)
from detaudit.static.rule import Invalid, Rule

_EMPTY_MODULE = cst.Module(body=[])


def _code(node: cst.CSTNode) -> str:
    return _EMPTY_MODULE.code_for_node(node)


class _Undecided(Exception):
    """The linter cannot tell what a use does to the tensor: stop following it."""


@dataclass
class _Tensor:
    """What is known about one ``empty`` allocation so far."""

    name: str
    allocation: cst.Call
    written_slices: list[tuple[str, ...]] = field(default_factory=list)  # ``x[:5] = ...`` -> (":5",)
    partly_written: bool = False
    done: bool = False


#: Tensor attributes that read no element.
_METADATA_ATTRIBUTES = frozenset({"shape", "dtype", "device", "ndim", "layout", "is_cuda", "requires_grad"})


def _is_full_slice(element: cst.SubscriptElement) -> bool:
    index = element.slice
    if isinstance(index, cst.Slice):
        return index.lower is None and index.upper is None and index.step is None
    return isinstance(index, cst.Index) and isinstance(index.value, cst.Ellipsis)


class UninitializedMemory(Rule):
    code = "DET021"
    name = "uninitialized-memory"
    severity = Severity.ERROR
    summary = "A tensor from `torch.empty*` is read before all of it was written."
    rationale = """
        `torch.empty`, `empty_like`, `empty_strided` and `Tensor.new_empty` return
        memory holding whatever was there before: leftovers of earlier tensors,
        which differ between runs, devices and allocator states.  Reading such a
        tensor before every element was written (a reduction after writing only
        a slice, arithmetic on a buffer that was never filled) feeds garbage into
        the result, so two runs with the same seed differ.  Deterministic mode
        only helps when `torch.utils.deterministic.fill_uninitialized_memory` is
        on, and then it hides the bug behind NaNs.
        """
    fix_hint = "Allocate with `torch.zeros`/`torch.full`, or write every element (`copy_`, `fill_`, `out=`) before reading."
    VALID = (
        "import torch\nfrom torch import nn\nw = torch.empty(3, 4)\nnn.init.kaiming_uniform_(w)\ny = w.sum()\n",
        "import torch\nbuf = torch.empty(8)\nbuf.copy_(torch.arange(8.0))\ntotal = buf.sum()\n",
        "import torch\nout = torch.empty(4)\ntorch.add(torch.ones(4), 1, out=out)\nm = out.mean()\n",
        "import torch\nx = torch.empty(2, 3)\nx.normal_()\ny = x * 2\n",
        # complementary slices cover every element
        "import torch\nn = 5\nx = torch.empty(10)\nx[:n] = 1.0\nx[n:] = 2.0\ns = x.sum()\n",
        "import torch\nx = torch.empty(2)\nx[0] = 1.0\nx[1] = 2.0\ns = x.sum()\n",
        # filled in a loop (the linter cannot count iterations, so it stays quiet)
        "import torch\nrows = torch.empty(3, 4)\nfor i in range(3):\n    rows[i] = torch.ones(4)\ntotal = rows.sum()\n",
        # metadata only
        "import torch\nx = torch.empty(3, 4)\nshape = x.shape\nn = x.numel()\n",
        # written through views (aliases the linter does not follow)
        "import torch\nout = torch.empty(2, 4)\nfirst, second = out.unbind(0)\nfirst.fill_(0)\nsecond.fill_(1)\ntotal = out.sum()\n",
    )
    INVALID = (
        Invalid("import torch\nx = torch.empty(10)\nx[:5] = 1.0\ns = x.sum()\n", line=2, message="only partly written"),
        Invalid("import torch\nacc = torch.empty(4)\nacc += torch.ones(4)\n", line=2, message="before any write"),
        Invalid("import torch\ndef f(y):\n    z = torch.empty_like(y)\n    z[:, 0] = y[:, 0]\n    return torch.softmax(z, dim=1)\n", line=3),
        Invalid("import torch\ndef f(t):\n    buf = t.new_empty(t.shape)\n    buf[t > 0] = 1.0\n    return buf.mean()\n", line=3),
        Invalid("import torch\nx = torch.empty(3)\ny = x + 1\n", line=2),
    )

    def __init__(self, context) -> None:
        super().__init__(context)
        self._blocks: list[cst.CSTNode] = [context.module]
        self._marked: dict[int, cst.CSTNode] = {}

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._blocks.append(node)

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        self._blocks.pop()

    def visit_Call(self, node: cst.Call) -> None:
        call = self.facts.calls[-1]  # just recorded by the fact collector, first in the walk
        if call.node is node and (call.qualname in EMPTY_ALLOCATORS or call.method in EMPTY_ALLOCATOR_METHODS):
            block = self._blocks[-1]
            self._marked[id(block)] = block

    def finish(self) -> None:
        for block in self._marked.values():
            statements = list(block.body)
            for index, statement in enumerate(statements):
                tensor = self._allocation(statement)
                if tensor is not None:
                    self._follow(tensor, statements[index + 1 :])

    def _allocation(self, statement: cst.CSTNode) -> _Tensor | None:
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
            return None
        assign = statement.body[0]
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.value, cst.Call)):
            return None
        target, call = assign.targets[0].target, assign.value
        if not isinstance(target, cst.Name):
            return None
        qualname = self.facts.names.resolve(call.func)
        method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
        if qualname in EMPTY_ALLOCATORS or (qualname is None and method in EMPTY_ALLOCATOR_METHODS):
            return _Tensor(target.value, call)
        return None

    def _follow(self, tensor: _Tensor, statements) -> None:
        try:
            for statement in statements:
                uses = list(_uses(statement, tensor.name, []))
                if not uses:
                    continue
                if not isinstance(statement, cst.SimpleStatementLine):
                    raise _Undecided  # a loop or branch: how much it writes is not visible
                for parents in uses:
                    self._use(tensor, parents)
                    if tensor.done:
                        return
        except _Undecided:
            return

    def _use(self, tensor: _Tensor, parents: list[cst.CSTNode]) -> None:
        """Classify one occurrence of the tensor's name; ``parents`` ends with the Name."""
        name, parent = parents[-1], parents[-2]
        grandparent = parents[-3] if len(parents) > 2 else None
        if any(isinstance(p, (cst.FunctionDef, cst.Lambda, cst.ClassDef)) for p in parents):
            raise _Undecided  # a nested function may run at any time
        if isinstance(parent, cst.AssignTarget):
            raise _Undecided  # rebound
        if isinstance(parent, cst.Subscript) and parent.value is name:
            self._subscript(tensor, parent, grandparent)
            return
        if isinstance(parent, cst.Attribute) and parent.value is name:
            if isinstance(grandparent, cst.Call) and grandparent.func is parent:
                self._method(tensor, parent.attr.value, parents[-4] if len(parents) > 3 else None)
            elif parent.attr.value not in _METADATA_ATTRIBUTES:
                raise _Undecided
            return
        if isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison, cst.ComparisonTarget)):
            self._read(tensor, "used in arithmetic")
            return
        if isinstance(parent, cst.AugAssign) and parent.target is name:
            self._read(tensor, "updated in place")
            return
        if isinstance(parent, cst.Arg) and isinstance(grandparent, cst.Call):
            self._argument(tensor, parent, grandparent)
            return
        raise _Undecided  # returned, aliased, stored, ...

    def _subscript(self, tensor: _Tensor, subscript: cst.Subscript, around: cst.CSTNode | None) -> None:
        full = all(_is_full_slice(e) for e in subscript.slice)
        if isinstance(around, cst.AssignTarget):
            self._write(tensor, subscript, full)
            return
        raise _Undecided  # reading or writing through a view of a part

    def _method(self, tensor: _Tensor, method: str, call_parent: cst.CSTNode | None) -> None:
        if method in FULL_WRITE_METHODS:
            tensor.done = True
        elif method in PARTIAL_WRITE_METHODS:
            tensor.partly_written = True
        elif method in METADATA_METHODS:
            return
        elif method in TENSOR_VIEW_FUNCTIONS:
            raise _Undecided  # an alias that may be written through
        elif method.endswith("_") or isinstance(call_parent, cst.Attribute) and call_parent.attr.value.endswith("_"):
            raise _Undecided  # other in-place updates, or a view that is then written
        else:
            self._read(tensor, f"read by `.{method}()`")

    def _argument(self, tensor: _Tensor, arg: cst.Arg, call: cst.Call) -> None:
        callee = self.facts.names.resolve(call.func) or ""
        if arg.keyword is not None and arg.keyword.value == "out" or callee.startswith(IN_PLACE_INIT_PREFIX):
            tensor.done = True
            return
        function = callee[len("torch.") :]
        if callee.startswith("torch.") and "." not in function and not function.startswith("_") and function not in TENSOR_VIEW_FUNCTIONS:
            self._read(tensor, f"read by `{callee}`")
            return
        raise _Undecided  # an unknown function may fill it

    def _write(self, tensor: _Tensor, subscript: cst.Subscript, full: bool) -> None:
        if full:
            tensor.done = True
            return
        tensor.partly_written = True
        tensor.written_slices.append(tuple(_code(e.slice) for e in subscript.slice))
        if self._covered(tensor):
            tensor.done = True

    def _read(self, tensor: _Tensor, how: str) -> None:
        if tensor.partly_written:
            message = f"`{tensor.name}` comes from {_code(tensor.allocation.func)}() and is {how} while only partly written."
        else:
            message = f"`{tensor.name}` comes from {_code(tensor.allocation.func)}() and is {how} before any write."
        self.report(tensor.allocation, message)
        tensor.done = True

    @staticmethod
    def _covered(tensor: _Tensor) -> bool:
        """Whether the partial writes visibly cover everything: complementary
        slices (``[:n]`` + ``[n:]``), a mask and its complement, or every index
        of a literal first dimension."""
        keys = tensor.written_slices
        written = set(keys)
        for key in keys:
            if len(key) == 1 and key[0].startswith(":") and (f"{key[0][1:]}:",) in written:
                return True
            if len(key) == 1 and (f"~{key[0]}",) in written:
                return True
        size = tensor.allocation.args[0].value if tensor.allocation.args else None
        if isinstance(size, cst.Integer) and len(tensor.allocation.args) == 1:
            return {str(i) for i in range(int(size.value))} <= {k[0] for k in keys if len(k) == 1}
        return False


def _uses(node: cst.CSTNode, name: str, parents: list[cst.CSTNode]):
    """Parent chains (ending with the Name) of every load or store of ``name`` in
    ``node``, in source order."""
    if isinstance(node, cst.Name):
        if node.value == name:
            yield [*parents, node]
        return
    parents.append(node)
    for child in node.children:
        yield from _uses(child, name, parents)
    parents.pop()
