"""The state a run ends with: every tensor once, under the name users know it by."""

from __future__ import annotations

import torch
from torch import nn

from detaudit.dynamic.record.final_state import watched_state
from detaudit.launch.watcher import TrainingWatcher


class Wrapper(nn.Module):
    """Like a LightningModule: its training code calls a layer it holds, never its own forward."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def forward(self, x):
        return self.layer(x)


def test_a_parameter_stepped_before_its_module_ran_is_named_by_the_module_once():
    watcher = TrainingWatcher()
    try:
        wrapper = Wrapper()
        optimizer = torch.optim.SGD(wrapper.parameters(), lr=0.1)
        for param in wrapper.parameters():
            param.grad = torch.zeros_like(param)
        optimizer.step()  # a warm-up step before any forward: the optimizer knows the parameters by position
        wrapper.layer(torch.ones(1, 2)).sum().backward()  # the layer runs first, on its own
        optimizer.step()
        wrapper(torch.ones(1, 2))  # then the wrapper itself: a second root that holds the first
        state = watched_state(watcher)
    finally:
        watcher.close()
    weights = [name for name, tensor in state.items() if tensor is wrapper.layer.weight]
    assert len(weights) == 1 and not weights[0].startswith("optimizer."), sorted(state)
    assert len(state) == len({id(tensor) for tensor in state.values()}), sorted(state)
    assert all("optimizer.param_groups" not in name for name in state), sorted(state)
