"""Asynchronous collectives read before they finish (DET023 async-collective-not-waited):
``async_op=True`` (and ``isend``/``irecv``) whose handle is dropped, never used,
or waited only after the result is read.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import libcst as cst

from detaudit.findings import Severity
from detaudit.static.analyses.distributed import callee_names
from detaudit.static.analyses.execution import every_block, is_line
from detaudit.static.engine.facts import CallFact
from detaudit.static.engine.names import dotted_name
from detaudit.static.engine.walk import child_nodes
from detaudit.static.rule import Invalid, Rule

#: torch.distributed collectives taking ``async_op``, with where the tensor they
#: write goes (keyword, position); ``barrier`` writes none and is left out.
_ASYNC_COLLECTIVES: dict[str, tuple[str, int]] = {
    "all_reduce": ("tensor", 0), "broadcast": ("tensor", 0), "reduce": ("tensor", 0),
    "all_gather": ("tensor_list", 0), "all_gather_into_tensor": ("output_tensor", 0),
    "_all_gather_base": ("output_tensor", 0), "reduce_scatter": ("output", 0),
    "reduce_scatter_tensor": ("output", 0), "_reduce_scatter_base": ("output", 0),
    "all_to_all": ("output_tensor_list", 0), "all_to_all_single": ("output", 0),
    "gather": ("gather_list", 1), "scatter": ("tensor", 0),
    "all_reduce_coalesced": ("tensors", 0), "all_gather_coalesced": ("output_tensor_lists", 0),
}
#: Point-to-point calls that always return a handle; ``isend``'s tensor is read,
#: not written, so only its handle is followed.
_ALWAYS_ASYNC: dict[str, tuple[str, int] | None] = {"irecv": ("tensor", 0), "isend": None, "batch_isend_irecv": None}
_DISTRIBUTED_NAMESPACES = frozenset({"torch.distributed", "torch.distributed.distributed_c10d"})
#: Calls after which every issued collective has finished on the device (the
#: NCCL stream is synchronised) or every rank met again: the linter stops there.
_SYNCHRONISERS = frozenset({"synchronize", "barrier", "wait_all"})


class AsyncCollectiveNotWaited(Rule):
    code = "DET023"
    name = "async-collective-not-waited"
    severity = Severity.WARNING
    summary = "An asynchronous collective's handle is dropped, never used, or waited only after its result is read."
    rationale = """
        With `async_op=True` a collective (`all_reduce`, `all_gather`,
        `broadcast`, `reduce_scatter`, ...) returns at once with a work handle,
        and so do `isend`/`irecv`; the tensor it writes holds its result only
        after `handle.wait()` (or `torch.futures.wait_all`, or the handle's
        future) returns.  Reading the tensor before that reads whatever has
        arrived so far: the old values, a partial sum, or the result, depending
        on how fast the other ranks and the network were this time.  The
        outcome changes from run to run and from rank to rank.  Under NCCL the
        collective runs on a stream of its own, and `wait()` is what makes the
        current stream wait for it: without it nothing orders the read after
        the result.  A dropped handle (the call used as a statement, assigned
        to `_` or to a name never used again) can never be waited on.
        """
    fix_hint = (
        "Keep the handle and call `handle.wait()` before reading or writing the tensor "
        "(`handles.append(...)` then `for h in handles: h.wait()` to overlap several), or drop `async_op=True`."
    )
    VALID = (
        "import torch, torch.distributed as dist\n\ndef sync(t):\n    work = dist.all_reduce(t, async_op=True)\n"
        "    work.wait()\n    return t / dist.get_world_size()\n",
        # handles kept in a list and waited later
        "import torch.distributed as dist\n\ndef sync(grads):\n    handles = []\n    for g in grads:\n"
        "        handles.append(dist.all_reduce(g, async_op=True))\n    for h in handles:\n        h.wait()\n",
        "from torch.distributed import all_reduce\n\ndef sync(t):\n    all_reduce(t, async_op=True).wait()\n    return t.sum()\n",
        # other work overlaps the collective; the result is read after the wait
        "import torch, torch.distributed as dist\n\ndef step(t, x):\n    work = dist.all_reduce(t, async_op=True)\n"
        "    y = x * 2\n    work.wait()\n    return t + y\n",
        "import torch.distributed as dist\n\ndef sync(t, overlap):\n    dist.all_reduce(t, async_op=overlap)\n",
    )
    INVALID = (
        Invalid(
            "import torch, torch.distributed as dist\n\ndef sync(t):\n    dist.all_reduce(t, async_op=True)\n"
            "    return t / dist.get_world_size()\n",
            line=4,
            message="discarded",
        ),
        Invalid(
            "import torch, torch.distributed as dist\n\ndef sync(t):\n    work = dist.all_reduce(t, async_op=True)\n"
            "    print(t.sum())\n    work.wait()\n",
            line=4,
            message="`t` is used by `print(t.sum())` before `work.wait()`",
        ),
        Invalid(
            "import torch\nfrom torch.distributed import irecv\nbuf = torch.zeros(4)\nreq = irecv(buf, src=0)\nprint(buf)\n",
            line=4,
            message="never used",
        ),
        Invalid(
            "import torch.distributed as dist\n\ndef gather(out, t):\n    _ = dist.all_gather_into_tensor(out, t, async_op=True)\n"
            "    return out\n",
            line=4,
        ),
    )

    def finish(self) -> None:
        pending = {id(call.node): (call, written) for call in self.facts.calls if (written := self._async_output(call)) is not False}
        if not pending:
            return
        for block in every_block(self.context.module):
            for index, statement in enumerate(block.statements):
                if not is_line(statement):
                    continue
                for small in statement.body:
                    target, node = _issued(small)
                    if node is not None and id(node) in pending:
                        self._check(*pending[id(node)], target, block.statements[index + 1:])

    def _async_output(self, call: CallFact) -> cst.BaseExpression | None | bool:
        """The tensor an asynchronous collective writes (None: none to follow);
        False when ``call`` is not an asynchronous collective."""
        namespace, _, function = (call.qualname or "").rpartition(".")
        if namespace not in _DISTRIBUTED_NAMESPACES or _expected_to_raise(call):
            return False
        if function in _ALWAYS_ASYNC:
            output = _ALWAYS_ASYNC[function]
        elif function in _ASYNC_COLLECTIVES and self.facts.evaluate(call.value_node("async_op")).truthy:
            output = _ASYNC_COLLECTIVES[function]
        else:
            return False
        return call.value_node(*output) if output is not None else None

    def _check(
        self, fact: CallFact, written: cst.BaseExpression | None, target: cst.Name | None, after: Sequence[cst.CSTNode]
    ) -> None:
        """Report the collective ``fact`` whose handle is assigned to ``target``
        (None: dropped) when nothing waits for it before ``written`` is used in
        ``after``, the statements that follow it in its block."""
        call = fact.node
        described = f"`{dotted_name(call.func)}`"
        handle = target.value if target is not None else "_"
        if handle == "_":
            synchronised = any(
                c.scope.function == fact.scope.function and c.order > fact.order and callee_names(c) & _SYNCHRONISERS
                for c in self.facts.calls
            )
            if not synchronised:
                self.report(
                    call,
                    f"The handle of the asynchronous {described} is discarded, so nothing waits for it: what reads the "
                    "result may see it before it arrives, differently on every run; keep the handle and call `.wait()`.",
                )
            return
        scope = self.facts.functions.get(fact.scope.function or "", self.context.module)
        if not any(name.value == handle for name in _names_in(scope) if name is not target):
            self.report(
                call,
                f"The handle `{handle}` of the asynchronous {described} is never used, so nothing waits for it: "
                f"call `{handle}.wait()` before reading the result.",
            )
            return
        written_name = dotted_name(written) if written is not None else None
        if written_name is None:
            return
        for statement in after:
            if _calls_synchroniser(statement) or any(name.value == handle for name in _names_in(statement)):
                return  # the handle (or everything) is waited here, or handed on
            if _mentions(statement, written_name):
                code = self.context.module.code_for_node(statement).strip().splitlines()[0]
                self.report(
                    call,
                    f"`{written_name}` is used by `{code[:60]}` before `{handle}.wait()`: the asynchronous "
                    f"{described} may not have written it yet, so what is read differs from run to run; "
                    f"call `{handle}.wait()` first.",
                )
                return


def _expected_to_raise(call: CallFact) -> bool:
    """Inside ``with pytest.raises(...)`` or ``with self.assertRaises...(...)``: a
    test that the call fails, so it returns no handle."""
    return any(
        isinstance(condition, cst.With)
        and any(
            isinstance(item.item, cst.Call) and "raises" in (dotted_name(item.item.func) or "").lower()
            for item in condition.items
        )
        for condition in call.scope.conditions
    )


def _issued(small: cst.BaseSmallStatement) -> tuple[cst.Name | None, cst.Call | None]:
    """(the name the handle is assigned to, or None when it is dropped; the call)
    for a statement that issues a call and keeps or drops its result; (None,
    None) when the result goes anywhere else (a list, a return, an argument)."""
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        return None, small.value
    if isinstance(small, cst.Assign) and isinstance(small.value, cst.Call) and len(small.targets) == 1:
        target = small.targets[0].target
        if isinstance(target, cst.Name):
            return target, small.value
    if isinstance(small, cst.AnnAssign) and isinstance(small.value, cst.Call) and isinstance(small.target, cst.Name):
        return small.target, small.value
    return None, None


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``node`` and what it refers to: an attribute's name (``x.t``) and a keyword
    (``f(t=1)``) are not references to ``t``."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if isinstance(current, cst.Attribute):
            stack.append(current.value)
        elif isinstance(current, cst.Arg):
            stack.append(current.value)
        else:
            stack.extend(child_nodes(current))


def _names_in(node: cst.CSTNode) -> Iterator[cst.Name]:
    return (n for n in _walk(node) if isinstance(n, cst.Name))


def _mentions(statement: cst.CSTNode, dotted: str) -> bool:
    """Whether ``statement`` names ``dotted`` (``t``, ``p.grad``) or something in it."""
    return any(
        isinstance(n, (cst.Name, cst.Attribute)) and dotted_name(n) == dotted for n in _walk(statement)
    )


def _calls_synchroniser(statement: cst.CSTNode) -> bool:
    return any(
        isinstance(n, cst.Call) and (dotted_name(n.func) or "").rpartition(".")[2] in _SYNCHRONISERS
        for n in _walk(statement)
    )
