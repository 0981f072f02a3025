"""Watch a training process from the outside: modules, optimizers, steps, loss.

Global module and optimizer hooks let detaudit follow unmodified user code: the
watcher learns the names of the models (from the user's own variable names),
the module path that is running (``model.blocks.0.c1``), how many optimizer
steps have completed, whether an optimizer step is running, and the last
tensor ``backward()`` was called on (the loss).  A forked child (a
DataLoader worker, a ``multiprocessing`` fork) is not the watched process: the
watchers close there, so it counts no step and never stops at the step limit.
Imports torch: only the child of a launch (``bootstrap.py``) and the dynamic pass load this module.
"""

from __future__ import annotations

import inspect
import os
import sys
import sysconfig
import weakref
from pathlib import Path
from typing import Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_DETAUDIT_DIR = str(Path(__file__).resolve().parents[1])  # detaudit/
_STDLIB_DIRS = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})


def is_user_file(filename: str) -> bool:
    """True for frames of the user's code: not torch, not detaudit, not the stdlib."""
    if filename.startswith("<"):
        return False
    return not (
        filename.startswith(_TORCH_DIR) or filename.startswith(_DETAUDIT_DIR) or filename.startswith(_STDLIB_DIRS)
    )


USER_FILES: dict[str, bool] = {}  # filename -> is_user_file: the tracer asks on every op


def user_frame(start=None):
    """The innermost frame of user code (None if there is none, e.g. an autograd thread)."""
    frame = start or sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        is_user = USER_FILES.get(filename)
        if is_user is None:
            is_user = USER_FILES[filename] = is_user_file(filename)
        if is_user:
            return frame
        frame = frame.f_back
    return None


# code flags of frames that can be suspended and resumed under another caller
RESUMABLE_CODE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


class UserFrames:
    """``user_frame(caller)``, remembered for the last caller frame.

    Consecutive ops are mostly dispatched from the same frame (a module's
    forward, the optimizer's loop), and while that frame runs, the frames
    above it cannot change: the user frame found once stays the answer until
    another frame dispatches (its line is read when asked, so a user frame
    that dispatches ops itself is right too).  Not when a resumable frame
    (a generator, a coroutine) lies between the two: each resumption may
    come from another caller.  Holds the last caller frame until the next
    lookup or ``forget()``; ``None`` (no Python frame dispatched the op: an
    autograd thread's) has no user frame."""

    __slots__ = ("caller", "user")

    def __init__(self):
        self.caller = self.user = None

    def find(self, caller):
        if caller is None:
            return None
        if caller is self.caller:
            return self.user
        user = user_frame(caller)
        frame = caller
        while frame is not user and not frame.f_code.co_flags & RESUMABLE_CODE:
            frame = frame.f_back
        self.caller = caller if frame is user else None
        self.user = user
        return user

    def forget(self) -> None:
        self.caller = self.user = None


def variable_name(obj: object) -> str | None:
    """The name a user frame gives ``obj`` (a local first, then a global)."""
    frame = user_frame(sys._getframe(1))
    while frame is not None:
        for scope in (frame.f_locals, frame.f_globals):
            for name, value in scope.items():
                if value is obj and not name.startswith("_"):
                    return name
        frame = frame.f_back
    return None


# attributes that wrap a module without adding a level the user wrote:
# torch.compile's OptimizedModule keeps the model as ``_orig_mod``
_WRAPPER_ATTRIBUTES = frozenset({"_orig_mod"})


def _without_wrappers(qualified_name: str) -> str:
    """``_orig_mod.blocks.0`` -> ``blocks.0``."""
    return ".".join(part for part in qualified_name.split(".") if part not in _WRAPPER_ATTRIBUTES)


#: the name of a parameter known only by its place in an optimizer
_BY_POSITION = "optimizer.param_groups"


class StopRun(BaseException):
    """Raised after the last requested optimizer step (a BaseException so that
    the user's ``except Exception`` does not swallow it)."""


_OPEN_WATCHERS: "weakref.WeakSet[TrainingWatcher]" = weakref.WeakSet()


def _close_in_forked_child() -> None:
    for watcher in list(_OPEN_WATCHERS):
        watcher.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_forked_child)


class TrainingWatcher:
    """Installs global hooks; ``close()`` removes them."""

    def __init__(
        self,
        max_steps: int = 0,
        on_step_end: Callable[[], None] | None = None,
        on_step_start: Callable[[torch.optim.Optimizer], None] | None = None,
        on_update_start: Callable[[torch.optim.Optimizer], None] | None = None,
    ):
        self.max_steps = max_steps
        self.on_step_end = on_step_end  # after each optimizer step, before the step limit stops the run
        self.on_step_start = on_step_start  # as each optimizer step starts (with its optimizer), its parameters named
        # once the step's forward and backward are done, as its update starts: at step() without a closure,
        # after the closure's first call with one (Lightning's automatic optimization runs them in it)
        self.on_update_start = on_update_start
        self.steps = 0  # completed optimizer steps
        self.in_optimizer = False
        self.training_started = False  # a module ran forward, or backward or an optimizer step did: setup is over
        self.roots: list[tuple[str, torch.nn.Module]] = []  # (name, module) in first-use order
        self.optimizers: list[torch.optim.Optimizer] = []
        self.param_names: dict[int, str] = {}  # id(parameter) -> "model.fc.weight"
        self.last_loss: torch.Tensor | None = None
        self._module_names: dict[int, str] = {}  # id(module) -> "model.fc"
        self._module_stack: list[str] = []
        self._original_backward = torch.Tensor.backward
        self._handles = [
            torch.nn.modules.module.register_module_forward_pre_hook(self._enter_module),
            torch.nn.modules.module.register_module_forward_hook(self._leave_module, always_call=True),
            register_optimizer_step_pre_hook(self._before_step),
            register_optimizer_step_post_hook(self._after_step),
        ]
        watcher = self

        def backward(tensor, *args, **kwargs):
            watcher.last_loss = tensor
            watcher.training_started = True
            return watcher._original_backward(tensor, *args, **kwargs)

        torch.Tensor.backward = backward
        _OPEN_WATCHERS.add(self)

    def close(self) -> None:
        _OPEN_WATCHERS.discard(self)
        for handle in self._handles:
            handle.remove()
        torch.Tensor.backward = self._original_backward

    # -- modules ---------------------------------------------------------
    @property
    def current_module(self) -> str:
        return self._module_stack[-1] if self._module_stack else ""

    def _enter_module(self, module, args):
        if torch.compiler.is_compiling():
            # dynamo is tracing a compiled function that calls the module: this hook would be
            # inlined into its graph and break it at each module (sys._getframe), where a plain
            # run compiles one graph; the graph's own nodes name their modules instead
            return
        self.training_started = True
        name = self._module_names.get(id(module))
        if name is None:
            name = self.add_root(module, variable_name(module) or type(module).__name__.lower())
        self._module_stack.append(name)

    def _leave_module(self, module, args, output):
        if self._module_stack and not torch.compiler.is_compiling():  # (see _enter_module)
            self._module_stack.pop()

    def module_name(self, module: torch.nn.Module) -> str | None:
        """``model.fc``: the module's name, once it or a module holding it has run."""
        return self._module_names.get(id(module))

    def add_root(self, module: torch.nn.Module, name: str) -> str:
        taken = {root_name for root_name, _ in self.roots}
        unique, n = name, 1
        while unique in taken:
            n += 1
            unique = f"{name}{n}"
        self.roots.append((unique, module))
        for sub_name, sub in module.named_modules():
            sub_name = _without_wrappers(sub_name)
            self._module_names.setdefault(id(sub), f"{unique}.{sub_name}" if sub_name else unique)
        for param_name, param in module.named_parameters():
            # a module's name for its parameter beats the position an optimizer that stepped first gave it
            if self.param_names.get(id(param), _BY_POSITION).startswith(_BY_POSITION):
                self.param_names[id(param)] = f"{unique}.{_without_wrappers(param_name)}"
        return unique

    # -- optimizers ------------------------------------------------------
    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        if any(known is optimizer for known in self.optimizers):
            return
        self.optimizers.append(optimizer)
        for group_index, group in enumerate(optimizer.param_groups):
            for param_index, param in enumerate(group["params"]):
                if id(param) not in self.param_names:
                    self.param_names[id(param)] = (
                        variable_name(param) or f"{_BY_POSITION}[{group_index}][{param_index}]"
                    )

    def _before_step(self, optimizer, args, kwargs):
        self.add_optimizer(optimizer)
        self.in_optimizer = self.training_started = True
        if self.on_step_start:
            self.on_step_start(optimizer)
        # args: the optimizer, then step()'s own
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if closure is None:
            if self.on_update_start:
                self.on_update_start(optimizer)
            return None
        # The closure is the step's forward and backward (LBFGS, Lightning's
        # automatic optimization), run from inside step(): its ops are not the
        # optimizer's
        watcher = self
        calls = 0

        def training_closure():
            nonlocal calls
            watcher.in_optimizer = False
            try:
                return closure()
            finally:
                watcher.in_optimizer = True
                calls += 1
                if calls == 1 and watcher.on_update_start:  # (LBFGS calls it again: the update has started)
                    watcher.on_update_start(optimizer)

        if "closure" in kwargs:
            return args, {**kwargs, "closure": training_closure}
        return (args[0], training_closure, *args[2:]), kwargs

    def _after_step(self, optimizer, args, kwargs):
        self.in_optimizer = False
        self.steps += 1
        if self.on_step_end:
            self.on_step_end()
        if self.max_steps and self.steps >= self.max_steps:
            raise StopRun()
