"""Uninitialised memory read as data (DET021 uninitialized-memory).

``x = torch.empty(...)`` is followed through the statements after it in the same
block (any block of the file: ``analyses.execution.every_block``), in order,
until something decides it: a full write (``copy_``, ``fill_``, ``out=x``,
``nn.init.*``) ends the check; a read (a reduction, arithmetic, a torch
function) after no write, or after writes that visibly leave a part unwritten,
is reported.  Anything the linter cannot see through (a loop or
branch that touches ``x``, passing it to an unknown function, returning it,
aliasing it) ends the check silently: precision before recall.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from detaudit.findings import Severity
from detaudit.static.analyses.execution import every_block, is_line
from detaudit.static.engine.walk import child_nodes
from detaudit.static.rule import Invalid, Rule


#: Allocators whose result holds whatever the memory held before.
EMPTY_ALLOCATORS = frozenset(
    {"torch.empty", "torch.empty_like", "torch.empty_strided", "torch.empty_permuted"}
)
EMPTY_ALLOCATOR_METHODS = frozenset({"new_empty", "new_empty_strided"})

#: In-place methods that overwrite every element without reading it.
FULL_WRITE_METHODS = frozenset(
    {"copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_",
     "cauchy_", "log_normal_", "geometric_", "set_"}
)

#: In-place methods that write only some elements.
PARTIAL_WRITE_METHODS = frozenset(
    {"masked_fill_", "index_fill_", "index_copy_", "index_put_", "scatter_", "masked_scatter_",
     "fill_diagonal_", "index_add_", "scatter_add_", "scatter_reduce_", "put_"}
)

#: Methods that read only metadata, never element values.
METADATA_METHODS = frozenset(
    {"size", "dim", "numel", "nelement", "stride", "element_size", "data_ptr", "is_contiguous",
     "storage_offset", "untyped_storage", "get_device", "type", "ndimension", "new_empty", "new_zeros",
     "new_ones", "new_full", "new_empty_strided", "is_floating_point", "is_complex"}
)

#: ``torch.*_like`` factories: they take only the shape, dtype and device of their
#: argument (``torch.empty_like(a)`` reads no element of ``a``).
METADATA_FUNCTIONS = frozenset(
    f"torch.{name}_like" for name in ("empty", "zeros", "ones", "full", "rand", "randn", "randint")
)

#: Functions that initialise a tensor in place (``nn.init.*``, the full write of a parameter).
IN_PLACE_INIT_PREFIX = "torch.nn.init."

#: Tensor methods and ``torch.*`` functions returning a view (an alias that may
#: then be written): the linter stops following a tensor once it is viewed.
TENSOR_VIEW_FUNCTIONS = frozenset(
    {"view", "view_as", "reshape", "reshape_as", "narrow", "select", "chunk", "split", "tensor_split",
     "unbind", "unsqueeze", "squeeze", "transpose", "t", "permute", "flatten", "unflatten", "expand",
     "expand_as", "as_strided", "diagonal", "movedim", "moveaxis", "swapaxes", "swapdims", "unfold",
     "contiguous", "detach", "view_as_real", "view_as_complex", "split_with_sizes", "hsplit", "vsplit",
     "dsplit", "real", "imag", "to", "type_as", "untyped_storage", "storage", "data_ptr"}
)

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
        # a *_like factory reads only the shape, dtype and device of its argument
        "import torch\na = torch.empty(3, 4)\nb = torch.empty_like(a)\nc = torch.zeros_like(a)\n",
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

    def finish(self) -> None:
        if not any(call.qualname in EMPTY_ALLOCATORS or call.method in EMPTY_ALLOCATOR_METHODS for call in self.facts.calls):
            return  # the usual case: no block needs a look
        for block in every_block(self.context.module):
            for index, statement in enumerate(block.statements):
                tensor = self._allocation(statement)
                if tensor is not None:
                    self._follow(tensor, block.statements[index + 1 :])

    def _allocation(self, statement: cst.CSTNode) -> _Tensor | None:
        """``x = torch.empty(...)`` as the only statement of its line."""
        if not (is_line(statement) and len(statement.body) == 1):
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
                if not is_line(statement):
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
        if callee in METADATA_FUNCTIONS and _is_first_argument(arg, call):
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


def _is_first_argument(arg: cst.Arg, call: cst.Call) -> bool:
    return arg is call.args[0] if arg.keyword is None else arg.keyword.value == "input"


def _uses(node: cst.CSTNode, name: str, parents: list[cst.CSTNode]):
    """Parent chains (ending with the Name) of every load or store of ``name`` in
    ``node``, in source order."""
    if isinstance(node, cst.Name):
        if node.value == name:
            yield [*parents, node]
        return
    parents.append(node)
    for child in child_nodes(node):
        yield from _uses(child, name, parents)
    parents.pop()
