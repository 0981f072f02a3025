"""Keeping torch.compile's dynamo out of detaudit's own dispatch handlers."""

from __future__ import annotations

try:  # torch 2.6+: how dynamo treats a code object
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
except ImportError:
    set_code_exec_strategy = None


def never_compiled(function):
    """Make dynamo skip ``function`` and everything it calls (a decorator).

    A mode's handler runs inside whatever frame dispatched the op; when dynamo
    is evaluating that frame (a ``torch.compile``'d function, which runs
    eagerly while a dispatch mode is active), it would compile the handler and
    every tracer helper it calls, one graph each: seconds per helper, then
    recompile limits.  torch's own guard, ``_should_skip_dynamo()`` wrapping
    every call in ``torch._dynamo.disable``, costs about 0.5 us per op and
    imports dynamo; marking the code object costs nothing per op.  On a torch
    without the marking, ``skips_dynamo_per_call`` keeps torch's guard."""
    if set_code_exec_strategy is not None:
        set_code_exec_strategy(function.__code__, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
    return function


def skips_dynamo_per_call() -> bool:
    """What a mode's ``_should_skip_dynamo`` returns: torch's per-call guard only when ``never_compiled`` cannot work."""
    return set_code_exec_strategy is None

