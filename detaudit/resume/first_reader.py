"""The first op that reads a component that differs after the resume (the
child of the resumed run; imports torch).

At the resumed run's first forward (the point it continues from) the state
is digested as the straight run's was at its first forward of the same step,
and what differs is watched for the rest of that step, under a
``TorchDispatchMode``: the first op given one of its tensors (parameters,
buffers, optimizer state, the batch), the first op that draws from the torch
generator (``torch.Tag.nondeterministic_seeded``) where an RNG state differs,
the first op of the optimizer's update where the learning rate differs.
Views (``detach``, ``t``, ...) read no data and are passed over.  Each is named as ``detaudit run`` names a
cause: the op, the script's line, the module running.  One step under the
mode costs little, and only a resume that differs pays it.  Generators that
no op reads (NumPy's, Python's, a DataLoader's) are not named.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from detaudit.dynamic.record.tracer import relative_path
from detaudit.launch.watcher import user_frame

#: components read by the optimizer's update (not as tensors): their first reader is its first op that reads data
UPDATE_COMPONENTS = frozenset({"lr"})
#: components whose differences an op drawing from the torch generator (on that device) reads
RNG_DEVICES = {"torch-rng": "cpu", "cuda-rng": "cuda"}
NO_STORAGE = -1


class FirstReaders(TorchDispatchMode):
    def __init__(self, watcher, differing: dict[str, list], tensors: dict[str, dict], cwd: str):
        """``differing``: {component: names that differ}; ``tensors``: {component: {name: tensor}} of this point."""
        super().__init__()
        self.watcher = watcher
        self.cwd = cwd
        self.storages: dict[int, str] = {}  # storage address -> component
        for component, names in differing.items():
            for name in names:
                tensor = tensors.get(component, {}).get(name)
                if isinstance(tensor, torch.Tensor) and tensor.numel() and _storage(tensor) != NO_STORAGE:
                    self.storages.setdefault(_storage(tensor), component)
        self.pending = {c for c in differing if c in UPDATE_COMPONENTS or c in RNG_DEVICES} | set(self.storages.values())
        self.found: dict[str, dict] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.pending and not _is_view(func):
            self._look(func, args, kwargs)
        return func(*args, **kwargs)

    def _look(self, func, args, kwargs) -> None:
        tensors = [leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
        reads = {self.storages.get(_storage(t)) for t in tensors} - {None}
        if torch.Tag.nondeterministic_seeded in func.tags:
            devices = {t.device.type for t in tensors} or {"cpu"}
            reads |= {component for component, device in RNG_DEVICES.items() if device in devices}
        if self.watcher.in_optimizer:
            reads |= UPDATE_COMPONENTS
        for component in reads & self.pending:
            self.pending.discard(component)
            frame = user_frame()
            path = frame.f_code.co_filename if frame else ""
            self.found[component] = {
                "op": func._schema.name,
                "path": relative_path(path, self.cwd),
                "line": frame.f_lineno if frame else 0,
                "module": self.watcher.current_module,
            }


def _is_view(func) -> bool:
    return any(ret.alias_info is not None and not ret.alias_info.is_write for ret in func._schema.returns)


def _storage(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage (a wrapper subclass, meta)
        return NO_STORAGE
