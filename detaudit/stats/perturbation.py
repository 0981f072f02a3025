"""The launch feature behind ``detaudit instability``'s one-ULP run.

``PerturbOneUlp`` moves one element (chosen by ``seed``) of the first
optimizer's first parameter by one ULP, in a direction chosen by ``seed``,
as the first optimizer step starts: Summers & Dinneen's probe, hooked in
without editing the script.  Imports torch only in the child.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from detaudit.launch.features import ChildFeature


@dataclass
class PerturbOneUlp(ChildFeature):
    key: ClassVar[str] = "perturb"
    seed: int

    def prepare(self, session) -> None:
        self.done = False

    def before_step(self, session, optimizer) -> None:
        if self.done:
            return
        self.done = True
        session.payload["perturbed"] = {
            "param": session.watcher.param_names.get(id(optimizer.param_groups[0]["params"][0]), ""),
            **perturb_one_ulp(optimizer, self.seed),
        }


def perturb_one_ulp(optimizer, seed: int) -> dict:
    """Move one element (chosen by ``seed``) of the optimizer's first parameter
    by one ULP, in a direction chosen by ``seed``."""
    import torch

    choose = random.Random(seed)
    param = optimizer.param_groups[0]["params"][0]
    index = choose.randrange(param.numel())
    toward = float("inf") if choose.random() < 0.5 else float("-inf")
    with torch.no_grad():
        flat = param.view(-1)
        old = flat[index].item()
        flat[index] = torch.nextafter(flat[index], torch.tensor(toward, dtype=param.dtype, device=param.device))
        return {"index": index, "old": old, "new": flat[index].item()}
