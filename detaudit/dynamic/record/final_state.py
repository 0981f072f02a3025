"""The training state at the end of a run, as the child saves it.

State is a flat ``{name: tensor}`` dict (CPU copies): parameters by name,
their gradients (``<param>.grad``), buffers (BatchNorm running stats),
optimizer state (``optimizer.state[<param>].exp_avg``) and the loss.  A saved
state comes with each tensor's digest, so that the parent of ``detaudit run``
compares states without torch and loads tensors only where digests differ
(``detaudit.dynamic.compare.state_diff``).
"""

from __future__ import annotations

from pathlib import Path

import torch


def module_state(name: str, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = {}
    for param_name, param in module.named_parameters():
        state[f"{name}.{param_name}"] = param
        if param.grad is not None:
            state[f"{name}.{param_name}.grad"] = param.grad
    for buffer_name, buffer in module.named_buffers():
        state[f"{name}.{buffer_name}"] = buffer
    return state


def optimizer_state(optimizer: torch.optim.Optimizer, param_names: dict[int, str]) -> dict[str, torch.Tensor]:
    state = {}
    for param, per_param in optimizer.state.items():
        owner = param_names.get(id(param), "?")
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor):
                state[f"optimizer.state[{owner}].{key}"] = value
    return state


def watched_state(watcher) -> dict[str, torch.Tensor]:
    """Everything a script trained, found through the watcher's hooks."""
    state: dict[str, torch.Tensor] = {}
    named: set[int] = set()  # each tensor once, by the first name found: a later root may hold an earlier one
    for name, module in watcher.roots:
        for key, tensor in module_state(name, module).items():
            if id(tensor) not in named:
                named.add(id(tensor))
                state[key] = tensor
    for optimizer in watcher.optimizers:
        for group in optimizer.param_groups:
            for param in group["params"]:
                name = watcher.param_names.get(id(param))
                if name and name not in state and id(param) not in named:  # a bare tensor trained without a module
                    state[name] = param
                    if param.grad is not None:
                        state[f"{name}.grad"] = param.grad
        state.update(optimizer_state(optimizer, watcher.param_names))
    if watcher.last_loss is not None:
        state["loss"] = watcher.last_loss
    return state


def returned_state(value, name: str | None = None) -> dict[str, torch.Tensor]:
    """State of whatever an ``audit()`` step returned: a module, an optimizer,
    a tensor, or a dict (keys become names), list or tuple of them."""
    if isinstance(value, torch.nn.Module):
        return module_state(name or "model", value)
    if isinstance(value, torch.optim.Optimizer):
        param_names = {
            id(param): f"param_groups[{group_index}][{param_index}]"
            for group_index, group in enumerate(value.param_groups)
            for param_index, param in enumerate(group["params"])
        }
        return optimizer_state(value, param_names)
    if isinstance(value, torch.Tensor):
        name = name or "output"
        state = {name: value}
        if value.grad is not None:
            state[f"{name}.grad"] = value.grad
        return state
    if isinstance(value, dict):
        children = [(str(key) if name is None else f"{name}.{key}", item) for key, item in value.items()]
    elif isinstance(value, (list, tuple)):
        children = [(f"{name or 'result'}[{index}]", item) for index, item in enumerate(value)]
    else:
        return {}
    state = {}
    for child_name, item in children:
        state.update(returned_state(item, child_name))
    return state


def cpu_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}


def state_digests(state: dict[str, torch.Tensor]) -> dict[str, list]:
    """Each tensor's [dtype, shape, digest] (``state_diff.SavedState.digests``)."""
    from detaudit.dynamic.record.digests import host_digest

    digests = {}
    for name, tensor in state.items():
        try:
            digest = host_digest(tensor.detach().to("cpu"))
        except (RuntimeError, TypeError, NotImplementedError):  # sparse and other layouts: compared by loading
            digest = None
        digests[name] = [str(tensor.dtype).removeprefix("torch."), list(tensor.shape), digest]
    return digests


def save_state(state: dict[str, torch.Tensor], path: Path) -> dict:
    """Write the state's CPU copies to ``path``; returns the payload entries:
    the file, and each tensor's digest (``state_digests``)."""
    copies = cpu_copy(state)
    torch.save(copies, path)
    return {"state_file": str(path), "state_digests": state_digests(copies)}


def load_state(path: str | Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)
