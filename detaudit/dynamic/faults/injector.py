"""The test-only fault injector: the mode that perturbs one op call's output.

``FaultInjector`` is a ``TorchDispatchMode`` entered *below* the tracer's (the
bootstrap enters it first), so the tracer digests the perturbed output as the
op's own: in a dispatch mode stack the mode entered last sees an op first,
and its ``func(...)`` call is what reaches the modes under it.  With a tracer,
only the ops the tracer itself dispatches are counted (not the ops it runs to
take digests or captures), and a call's site is the tracer's own
attribution, so a spec (``spec.py``) names an op exactly as the report
does.  Ops run inside a dispatch handler are below autograd: perturbing an
output there bumps no version counter, so autograd's checks of saved tensors
are not disturbed.  Imports torch.
"""

from __future__ import annotations

import math
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from detaudit.dynamic.compare.trace_format import FORWARD
from detaudit.dynamic.faults.spec import FAULT_ENV, FaultSpecError
from detaudit.dynamic.record.dynamo import never_compiled, skips_dynamo_per_call
from detaudit.launch.watcher import user_frame

_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def next_up(element: torch.Tensor) -> None:
    """Change a 0-dim tensor in place: the next representable value toward
    +inf (floats, and the real part of a complex), +1 (integers, wrapping),
    or the other value (bool).  Works on the bits, so it covers every dtype
    (bfloat16, float8, unsigned) whether or not torch has arithmetic for it."""
    if element.is_complex():
        element = torch.view_as_real(element.resolve_conj())[0]
    if element.dtype == torch.bool:
        bits = element.view(torch.uint8)
        bits.fill_(1 - int(bits.item()))
        return
    size = element.element_size()
    bits = element.view(_INT_OF_SIZE[size])
    value = int(bits.item())
    if element.is_floating_point():
        number = float(element.to(torch.float64).item())
        if number == 0:
            value = 1  # -0 and +0 both go to the smallest positive subnormal
        elif not math.isfinite(number):
            value ^= 1  # +inf has no next value up, NaN none at all: other bits will do
        else:
            value += 1 if number > 0 else -1  # sign and magnitude: toward +inf
    else:
        value += 1
    half = 1 << (8 * size - 1)
    bits.fill_((value + half) % (2 * half) - half)  # wrap into the signed range of the bits


def _tensors(values) -> list[torch.Tensor]:
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (tuple, list)):
            found.extend(_tensors(value))
    return found


class FaultInjector(TorchDispatchMode):
    """Perturbs the output of the op call that ``spec`` selects (see the module doc)."""

    def __init__(self, spec: dict, tracer=None):
        super().__init__()
        self.spec = spec
        self.tracer = tracer
        self.matched = 0  # calls that matched the selectors so far
        self.done: dict | None = None  # what was perturbed: op, site, output, element, old and new value

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return skips_dynamo_per_call()

    @never_compiled
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if self.done is not None or (self.tracer is not None and self.tracer.dispatching is None):
            return result  # injected already, or an op the tracer runs for itself (digests, captures)
        site = self._site()
        if self._matches(func, site):
            if self.matched == self.spec["occurrence"]:
                self._perturb(func, site, args, kwargs or {}, result)
            self.matched += 1
        return result

    def _site(self) -> tuple[str, str, int]:
        """(phase, file, line) of the op being dispatched, as the report will name it."""
        if self.tracer is not None:
            phase, path, line, _ = self.tracer.dispatching
            return phase, path, line
        frame = user_frame(sys._getframe(2))
        return FORWARD, frame.f_code.co_filename if frame else "", frame.f_lineno if frame else 0

    def _matches(self, func, site: tuple[str, str, int]) -> bool:
        spec = self.spec
        phase, path, line = site
        name = str(func)
        return (
            ("op" not in spec or spec["op"] in (name, name.rsplit(".", 1)[0]))
            and ("phase" not in spec or spec["phase"] == phase)
            and ("line" not in spec or spec["line"] == line)
            and ("path" not in spec or path.endswith(spec["path"]))
        )

    def _perturb(self, func, site, args, kwargs, result) -> None:
        written = [
            value
            for index, argument in enumerate(func._schema.arguments)
            if argument.alias_info is not None and argument.alias_info.is_write
            for value in ([args[index]] if index < len(args) else [kwargs.get(argument.name)])
        ]
        # every tensor the op returned or wrote, lists (the _foreach_ ops) flattened, each once
        outputs = list({id(t): t for t in _tensors((result, *written))}.values())
        position = self.spec["output"]
        if position is None:
            position = next((i for i, t in enumerate(outputs) if t.numel()), None)
        if position is None or position >= len(outputs) or not outputs[position].numel():
            raise FaultSpecError(f"{FAULT_ENV}: {func} has no such non-empty output to perturb")
        tensor = outputs[position]
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(self.spec["element"]), tensor.shape))
        element = tensor[index]
        old = element.to(torch.float64 if not element.is_complex() else torch.complex128).item()
        next_up(element)
        phase, path, line = site
        self.done = {
            "op": str(func),
            "phase": phase,
            "path": path,
            "line": line,
            "output": position,
            "element": list(index),
            "old": repr(old),
            "new": repr(element.to(torch.float64 if not element.is_complex() else torch.complex128).item()),
        }
