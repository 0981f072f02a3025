"""What the ranks of a data-parallel run keep equal, and when: the digests
each rank records for ``verdict/ranks.py`` to compare across ranks.

Each parallelism keeps its own things equal at its own moments, and only
those are compared (a note in the report says what was):

* **No wrapper** (the script averages gradients itself, or a model no
  wrapper below holds): parameters, gradients, optimizer state and buffers at
  every optimizer step boundary, and parameters and buffers as the first step
  starts.
* **DistributedDataParallel with buffer sync** (``broadcast_buffers=True``,
  the default; ``forward_sync_buffers`` from torch 2.13): its parameters,
  gradients and optimizer state as above, but its buffers (BatchNorm's running
  statistics) only as a synchronised forward starts, right after DDP copied
  rank 0's to every rank: between forwards each rank's statistics come from
  its own data.  They are digested there (a hook on the wrapped module runs
  after DDP's broadcast) and filed under the last step boundary before that
  forward.
* **DistributedDataParallel without it** (``broadcast_buffers=False``): its
  buffers are each rank's own for good; not compared.
* **FSDP** (``FullyShardedDataParallel``, ``fully_shard``): every rank holds
  its own shard of the parameters, their gradients and optimizer state, and
  its own buffers; nothing of it is compared across ranks.
* Tensors of a subclass (DTensor, FSDP's FlatParameter) are shards by design
  and never compared across ranks.

Every tensor is still compared with itself run to run on each rank (the
traces and final states), whatever the wrapper.  Imports torch: the child
of a distributed run loads it (``features.ReplicaDigests``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.nn.parallel import DistributedDataParallel

from detaudit.dynamic.record.digests import host_digest
from detaudit.dynamic.record.final_state import watched_state


def _sharding_wrappers() -> tuple[type, ...]:
    """FSDP's wrapper class and fully_shard's module class, as this torch has them."""
    found = []
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        found.append(FullyShardedDataParallel)
    except ImportError:
        pass
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import FSDPModule  # torch < 2.6
        except ImportError:
            FSDPModule = None
    if FSDPModule is not None:
        found.append(FSDPModule)
    return tuple(found)


def syncs_buffers(ddp: DistributedDataParallel) -> bool:
    """Whether this DDP copies rank 0's buffers to every rank as a forward starts."""
    return bool(getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", True)))


def synced_buffers_this_forward(ddp: DistributedDataParallel) -> bool:
    """Whether the forward running now started with DDP's buffer broadcast:
    DDP decides it in its ``_pre_forward`` from state that only its
    ``_post_forward`` changes, so asking again inside the forward gives the
    same answer (a torch without the private method: its condition, read)."""
    check = getattr(ddp, "_check_sync_bufs_pre_fwd", None)
    if check is not None:
        return bool(check())
    return bool(getattr(ddp, "require_forward_param_sync", True)) and syncs_buffers(ddp)


@dataclass
class ReplicaRecorder:
    """The digests a rank records: ``boundaries[k]`` is ``{name: digest}`` at
    step boundary k (0: as the first step starts), ``notes`` what was compared
    and what was not, one line per wrapper.  ``untraced``: the session's
    context manager that keeps detaudit's own ops out of the trace."""

    watcher: object
    untraced: Callable
    boundaries: list[dict[str, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self):
        self._sharding = _sharding_wrappers()
        self._seen: set[int] = set()  # ids of the modules looked at
        self._synced: list[DistributedDataParallel] = []  # DDPs whose buffers are compared after their broadcast
        self._own_buffers: list[torch.nn.Module] = []  # DDPs whose buffers are each rank's own
        self._sharded: list[torch.nn.Module] = []  # FSDP roots
        self._filed: set[tuple[int, int]] = set()  # (id of a DDP, step boundary) its buffers were digested for
        self._pending: dict[int, dict[str, int]] = {}  # step boundary -> buffers broadcast before it was recorded
        self._handles = [torch.nn.modules.module.register_module_forward_pre_hook(self._look_at)]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # -- the wrappers, found as they first run ----------------------------
    def _look_at(self, module, args) -> None:
        if id(module) in self._seen:
            return
        self._seen.add(id(module))
        if isinstance(module, DistributedDataParallel) and any(True for _ in module.module.buffers()):
            if syncs_buffers(module):
                self._synced.append(module)
                self._handles.append(module.module.register_forward_pre_hook(self._after_broadcast(module)))
                self._note(module, "its buffers as each synchronised forward starts, after DDP copies rank 0's to "
                           "every rank; its parameters, gradients and optimizer state at every step boundary")
            else:
                self._own_buffers.append(module)
                self._note(module, "its parameters, gradients and optimizer state at every step boundary; not its "
                           "buffers (broadcast_buffers=False: each rank keeps its own running statistics, so the "
                           "ranks evaluate with different ones)")
        elif self._sharding and isinstance(module, self._sharding) and not self._inside_sharded(module):
            self._sharded.append(module)
            self._note(module, "nothing (each rank holds its own shard of the parameters, gradients and optimizer "
                       "state, and its own buffers; each rank is compared with itself run to run)")

    def _inside_sharded(self, module) -> bool:
        return any(module is sub for root in self._sharded for sub in root.modules())

    def _note(self, module, compared: str) -> None:
        name = self.watcher.module_name(module) or type(module).__name__
        self.notes.append(f"replicas: {type(module).__name__} at {name}, compared across ranks: {compared}.")

    def _after_broadcast(self, ddp: DistributedDataParallel):
        def hook(module, args) -> None:
            step = self.watcher.steps
            if (id(ddp), step) in self._filed or not synced_buffers_this_forward(ddp):
                return
            self._filed.add((id(ddp), step))  # the first broadcast after a boundary stands for it
            with self.untraced():
                names = {id(tensor): name for name, tensor in watched_state(self.watcher).items()}
                digests = {
                    names[id(buffer)]: host_digest(buffer.detach().cpu())
                    for buffer in ddp.module.buffers()
                    if id(buffer) in names
                }
            if step < len(self.boundaries):
                self.boundaries[step].update(digests)
            else:
                self._pending.setdefault(step, {}).update(digests)

        return hook

    # -- the step boundaries ----------------------------------------------
    def record_boundary(self, trained: bool = True) -> None:
        """Digests of what every rank holds alike at this step boundary.
        Before the first update (``trained=False``) the parameters and
        buffers only: the first step's gradients are still being averaged."""
        left_out = self._left_out()
        with self.untraced():
            digests = {
                name: host_digest(tensor.detach().cpu())
                for name, tensor in watched_state(self.watcher).items()
                if name != "loss"
                and id(tensor) not in left_out
                and type(tensor) in (torch.Tensor, torch.nn.Parameter)
                and (trained or not (name.endswith(".grad") or name.startswith("optimizer.")))
            }
        digests.update(self._pending.pop(len(self.boundaries), {}))
        self.boundaries.append(digests)

    def _left_out(self) -> set[int]:
        """Ids of the tensors not compared at a step boundary (see the module's doc)."""
        left_out = {id(buffer) for ddp in (*self._synced, *self._own_buffers) for buffer in ddp.module.buffers()}
        for root in self._sharded:
            params = list(root.parameters())
            left_out.update(id(tensor) for tensor in (*params, *root.buffers()))
            left_out.update(id(param.grad) for param in params if param.grad is not None)
            for optimizer in self.watcher.optimizers:
                for param in params:
                    left_out.update(id(value) for value in optimizer.state.get(param, {}).values())
        return left_out
