"""The tracer's records of torch.distributed's communication ops.

Collectives and point-to-point ops reach the dispatcher as ops of the
``c10d`` namespace (``c10d.allreduce_``, ``broadcast_``, ``allgather_``,
``reduce_scatter_``, ``send``, ``recv_``, ``recv_any_source_``, ``barrier``
...) and, for the functional collectives, ``_c10d_functional``
(``all_reduce``, ``all_gather_into_tensor`` ...).  They return before the
data has arrived: gloo works on threads of its own, NCCL on a stream.  So a
communication record takes its inputs (what this rank *sent*) when the op is
called, and its outputs (what it *received*) when the work is waited on
(``Work.wait()``); the record keeps its place in the trace.  A functional
collective's result waits for itself when it is read, so it is waited on
(``wait_tensor``) and digested at once.

A tensor read by an op while the communication that writes it has not been
waited on is an *early read* (``async_op=True`` whose result is used before
``wait()``): recorded with the site of the read and of the collective.

Imports torch: only the traced child loads this module.
"""

from __future__ import annotations

import re
import sys

import torch

#: what an early read records: the reading op and where, and the collective
EARLY_READ_FIELDS = ("op", "phase", "path", "line", "module", "step", "collective", "collective_line")
# ops whose written arguments are outputs only (their old contents are not sent)
_RECEIVES_INTO = re.compile(r"recv|gather|scatter|alltoall")
# functional ops that move no data: the wait, and the wrapper that gives the result autograd
_NOT_COMMUNICATING = frozenset({"wait_tensor", "_wrap_tensor_autograd"})
_SEND_ONLY = frozenset({"send", "barrier", "monitored_barrier"})


def work_type():
    """torch's Work class (None when torch has no distributed support)."""
    try:
        return torch._C._distributed_c10d.Work
    except AttributeError:
        return None


class Communications:
    """Pending communications of one tracer; ``record`` is called by the
    tracer for every op of a communication namespace."""

    def __init__(self, tracer):
        self.tracer = tracer
        self.pending: dict[int, tuple] = {}  # id(storage) -> (key, record index) of a pending communication
        self._by_key: dict[int, tuple] = {}  # id(work) -> (record index, received tensors, issued from Python, work)
        self.early_reads: list[tuple] = []  # EARLY_READ_FIELDS

    @staticmethod
    def handles(func) -> bool:
        return func.namespace == "c10d" or (func.namespace == "_c10d_functional" and func._opname not in _NOT_COMMUNICATING)

    # -- Work.wait, patched while tracing ---------------------------------
    def patch_wait(self, patched: list) -> None:
        work = work_type()
        if work is None:
            return
        original = work.wait
        communications = self

        def wait(work_object, *args, **kwargs):
            result = original(work_object, *args, **kwargs)
            communications.complete(id(work_object))
            return result

        patched.append((work, "wait", original))
        work.wait = wait

    # -- the records --------------------------------------------------------
    def record(self, func, info, args, kwargs, caller):
        """Trace a communication op; ``caller``: the frame that dispatched it."""
        tracer = self.tracer
        record_index = len(tracer.records)
        phase, filename, line, module = tracer._site(caller)
        # the schemas mark no argument as written: the first one is the
        # buffer received into (in place for allreduce_, broadcast_ ...)
        receives = func._opname not in _SEND_ONLY and func.namespace == "c10d"
        receives_into = bool(_RECEIVES_INTO.search(func._opname))
        sent, received = [], []
        for position, value in enumerate([*args, *kwargs.values()]):
            tensors = list(_tensors(value))
            if position == 0 and receives:
                received += tensors
            if position != 0 or not (receives and receives_into):
                sent += tensors
        inputs = [tracer._input_ref(tensor, record_index)[0] for tensor in sent]
        tracer.dispatching = (phase, filename, line, module)
        try:
            result = func(*args, **kwargs)
        finally:
            tracer.dispatching = None
        results = list(_flatten(result))
        received += [value for value in results if isinstance(value, torch.Tensor) and not _is_alias(value, received)]
        work = next((value for value in results if isinstance(value, torch.ScriptObject)), None)
        out_meta = tuple(tracer._meta(tensor) for tensor in received)
        tracer.records.append(
            (info.name, phase, filename, line, module, tracer.watcher.steps + 1 if tracer.watcher else 1, out_meta,
             0, tuple(inputs), (), (), False)
        )
        if func.namespace != "c10d" or work is None:
            # a functional collective's result waits for itself when read
            # (AsyncCollectiveTensor): waiting now changes no value, only overlap
            for tensor in received:
                torch.ops._c10d_functional.wait_tensor(tensor)
            self._digest_received(record_index, received)
            return result
        work = work_type().unbox(work)  # the object Python's wait() is called on
        # a work issued by C++ (DistributedDataParallel's reducer) is waited on
        # there, unseen: its first reader completes it.  (Holding the work keeps
        # its Python object, the one wait() is called on, and so its id.)
        self._by_key[id(work)] = (record_index, received, _issued_from_python(), work)
        for tensor in received:
            self.pending[id(tensor.untyped_storage())] = (id(work), record_index)
        return result

    def first_waiting(self, default: int) -> int:
        """The record of the oldest communication that has not arrived (its
        received digests are still to go into it); ``default`` if none."""
        return min((entry[0] for entry in self._by_key.values()), default=default)

    def complete(self, key: int) -> None:
        """The communication ``key`` (its work's id) has arrived."""
        entry = self._by_key.pop(key, None)
        if entry is not None:
            self._digest_received(entry[0], entry[1])

    def _digest_received(self, record_index: int, received: list) -> None:
        """Digest what a communication received into its record."""
        tracer = self.tracer
        outputs = []
        for tensor in received:
            self.pending.pop(id(tensor.untyped_storage()), None)
            outputs.append(tracer._output_ref(tensor, _RECEIVED, record_index, True, None))
        record = tracer.records[record_index]
        tracer.records[record_index] = (*record[:9], tuple(o for o in outputs if o is not None), *record[10:])

    def before_op(self, func, flat_args: list, caller) -> None:
        """Called for every other op while communications are pending: an op
        of the script reading a pending tensor is an early read (of a work
        C++ issued, it completes it).  ``caller``: the frame that dispatched the op."""
        for value in flat_args:
            if not isinstance(value, torch.Tensor):
                continue
            try:
                pending = self.pending.get(id(value.untyped_storage()))
            except (RuntimeError, NotImplementedError):
                continue
            if pending is None:
                continue
            key, record_index = pending
            if not self._by_key[key][2]:
                self.complete(key)
                continue
            if _issued_from_python():  # torch.distributed's own code (a detach before wait()), not the script
                continue
            tracer = self.tracer
            phase, filename, line, module = tracer._site(caller)
            collective = tracer.records[record_index]
            step = tracer.watcher.steps + 1 if tracer.watcher else 1
            self.early_reads.append((str(func), phase, filename, line, module, step, collective[0], collective[3]))
            self.pending.pop(id(value.untyped_storage()), None)  # reported once


def _issued_from_python() -> bool:
    """Whether torch.distributed's Python API issued the op being dispatched
    (it hands its work to Python, where wait() is seen)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_C10D_PYTHON_API):
            return True
        frame = frame.f_back
    return False


_C10D_PYTHON_API = ("distributed_c10d.py", "_functional_collectives.py")


class _ReceivedInfo:
    """What ``OpTracer._output_ref`` asks of an op's info, for received tensors."""

    is_allocation = is_view = returns_inputs = False


_RECEIVED = _ReceivedInfo()


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _flatten(value):
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _flatten(item)
    else:
        yield value


def _is_alias(tensor: torch.Tensor, tensors: list) -> bool:
    return any(tensor.untyped_storage().data_ptr() == other.untyped_storage().data_ptr() for other in tensors)
