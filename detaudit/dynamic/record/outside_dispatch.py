"""What the tracer sees outside the dispatcher, by patching torch while it traces.

Calls that change the torch generator state (``torch.seed()``,
``torch.manual_seed``, ``torch.set_rng_state``..., named by the knowledge
base) are recorded with their user line (``OpTracer.note_rng_state_change``),
so an RNG root cause can say where the state came to differ.  Python reads of
tensor data that dispatch no aten op (``PYTHON_READS``: ``tolist``,
``numpy``, ``torch.save``) are records of their own
(``OpTracer.note_python_read``), so every value that leaves the trace for
Python is seen.  A tensor received from another process is rebuilt whenever
the data happens to arrive, so the rebuilding runs untraced: the tensor
enters the trace as an external input where it is first read.  Calls of
``torch.compile`` (and ``nn.Module.compile``) are noted with their line
(``OpTracer.note_compile``): while the tracer's mode is active dynamo
compiles nothing, so the report says that compiled regions ran eagerly.
``torch.utils.swap_tensors`` first lets go of the tracer's weak references to
the last op's outputs, which it would refuse.
"""

from __future__ import annotations

import functools
import importlib
import sys

import torch

from detaudit.dynamic.compare.trace_format import PYTHON_READS
from detaudit.knowledge.apis import RESEED_FROM_ENTROPY, RNG_STATE_RESTORERS, SEED_PARAMETERS

# torch functions that set the global torch generators' state, as "module.function"
_RNG_STATE_SETTERS = tuple(
    sorted(
        name
        for name in {*RESEED_FROM_ENTROPY, *SEED_PARAMETERS, *RNG_STATE_RESTORERS}
        if name.startswith("torch.")
    )
)

# torch's ``rebuild_*`` functions here make the tensors received from other processes
_RECEIVING_MODULE = "torch.multiprocessing.reductions"


def _flatten_tensors(value, into: list) -> list:
    """The tensors in a (nested) dict, list or tuple, as ``torch.save`` is usually given them."""
    if isinstance(value, torch.Tensor):
        into.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _flatten_tensors(item, into)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _flatten_tensors(item, into)
    return into


class OutsideDispatch:
    """The patches one tracer installs on entering and removes on leaving."""

    def __init__(self, tracer):
        self.tracer = tracer
        self.patched: list[tuple] = []  # (module, attribute, original), undone in reverse order
        self.in_rng_setter = False  # torch.manual_seed calls torch.cuda.manual_seed_all: record the outer call only

    def install(self) -> None:
        self._patch_rng_setters()
        self._patch_receivers()
        self._patch_python_reads()
        self._patch_compile()
        self._patch_swap_tensors()

    def remove(self) -> None:
        while self.patched:
            module, attribute, original = self.patched.pop()
            setattr(module, attribute, original)

    def _patch_rng_setters(self) -> None:
        for name in _RNG_STATE_SETTERS:
            module_name, attribute = name.rsplit(".", 1)
            module = importlib.import_module(module_name)
            original = getattr(module, attribute, None)
            if original is not None:
                self.patched.append((module, attribute, original))
                setattr(module, attribute, self._recording_setter(name, original))

    def _patch_receivers(self) -> None:
        module = importlib.import_module(_RECEIVING_MODULE)
        for attribute, original in list(vars(module).items()):
            if attribute.startswith("rebuild_") and callable(original):
                self.patched.append((module, attribute, original))
                setattr(module, attribute, self._untraced(original))

    def _patch_python_reads(self) -> None:
        """Record the Python calls that read tensor data outside the dispatcher (``PYTHON_READS``)."""
        for call in PYTHON_READS:
            owner = torch.Tensor if call.startswith("Tensor.") else torch
            attribute = call.rsplit(".", 1)[1]
            original = getattr(owner, attribute)
            self.patched.append((owner, attribute, original))
            setattr(owner, attribute, self._recording_read(call, original))

    def _patch_compile(self) -> None:
        for owner, attribute, call in ((torch, "compile", "torch.compile"), (torch.nn.Module, "compile", "Module.compile")):
            original = getattr(owner, attribute, None)
            if original is not None:
                self.patched.append((owner, attribute, original))
                setattr(owner, attribute, self._noting_compile(call, original))

    def _patch_swap_tensors(self) -> None:
        """``torch.utils.swap_tensors`` refuses a tensor with a weak reference; the
        tracer holds one to the last op's outputs until the next op reads their
        ``grad_fn`` (``Module._apply`` swaps a parameter with the copy an op just
        made): read it now, and let go of them."""
        original = torch.utils.swap_tensors
        tracer = self.tracer

        @functools.wraps(original)
        def swapping(*args, **kwargs):
            tracer.note_forward_sites()
            return original(*args, **kwargs)

        self.patched.append((torch.utils, "swap_tensors", original))
        torch.utils.swap_tensors = swapping

    def _noting_compile(self, call: str, original):
        tracer = self.tracer

        @functools.wraps(original)
        def noting(*args, **kwargs):
            if not tracer.paused:
                tracer.note_compile(call, sys._getframe(1))
            return original(*args, **kwargs)

        return noting

    def _recording_read(self, call: str, original):
        tracer = self.tracer

        @functools.wraps(original)
        def recording(obj, *args, **kwargs):
            if tracer.paused:
                return original(obj, *args, **kwargs)
            tracer.note_python_read(call, _flatten_tensors(obj, []))
            # the read is recorded; inside, the call may run ops of its own (and
            # come back here through a torch function mode): not the user's
            with tracer.untraced():
                return original(obj, *args, **kwargs)

        return recording

    def _untraced(self, function):
        tracer = self.tracer

        @functools.wraps(function)  # keeps its name: pickle refers to it by name
        def untraced(*args, **kwargs):
            with tracer.untraced():
                return function(*args, **kwargs)

        return untraced

    def _recording_setter(self, name: str, setter):
        tracer = self.tracer

        @functools.wraps(setter)
        def recording_setter(*args, **kwargs):
            if self.in_rng_setter or tracer.paused:
                return setter(*args, **kwargs)
            self.in_rng_setter = True
            try:
                result = setter(*args, **kwargs)
            finally:
                self.in_rng_setter = False
            tracer.note_rng_state_change(name, sys._getframe(1))
            return result

        return recording_setter
