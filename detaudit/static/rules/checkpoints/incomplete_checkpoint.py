"""A resume checkpoint that leaves out state the script goes on using (DET050 incomplete-checkpoint).

A checkpoint is a resume checkpoint when it holds optimizer state (weights
alone are an export: ``torch.save(model.state_dict(), path)`` is never
reported).  It is reported when the same file

- steps an LR scheduler whose state is not in it (built from
  ``torch.optim.lr_scheduler``, timm's schedulers or a ``get_*_schedule*``-style
  builder; one rebuilt with ``last_epoch=``, given ``last_epoch`` or the epoch at
  each step, or loaded with ``load_state_dict`` is restored another way);
- uses a GradScaler whose state is not in it (one built ``enabled=False`` keeps none);
- seeds an RNG (so its runs are meant to repeat), keeps drawing from it while
  it trains (dropout, a shuffling loader or random sampler, random transforms,
  draws repeated in a loop) and saves the checkpoint again and again from its
  loop, and no RNG state at all is in the checkpoint.  One RNG state saved
  (``torch.get_rng_state()``, a ``get_rng_state`` helper, an ``"rng"`` key)
  counts for all: the author thought of it.  A file that reseeds in its loop
  restores the state by construction.

A dict a save helper of a project module builds from its parameters is read
(what the call passes counts as saved).  What it does not see: a dict another
file adds to after it is built, a scheduler or scaler built in another
module, dropout in a model class of another module, augmentation or sampling
in project modules (a ``build_dataset``/``create_transform`` elsewhere),
checkpoints saved by a method of an object (timm's ``CheckpointSaver``) or
that are not dicts (``accelerator.save_state``, Lightning's, an optimizer's
``state_dict()`` saved to its own file), and whether the load side restores
what was saved.
"""

from __future__ import annotations

from detaudit.findings import Severity
from detaudit.knowledge.apis import RNG_LABELS, RNGS
from detaudit.static.analyses.checkpoints import GRAD_SCALER, SCHEDULER, Checkpoint, TrainingState
from detaudit.static.rule import Invalid, Rule

#: What a resumed run gets wrong without each.
_EFFECTS = {
    SCHEDULER: "the schedule starts over",
    GRAD_SCALER: "the loss scale starts over",
    "rng": "the draws after it repeat those of the run's start, so dropout masks, augmentations or batch order differ",
}

_NANOGPT_LOOP = """\
import torch

torch.manual_seed(1337)
data = torch.arange(10000)

def get_batch():
    ix = torch.randint(len(data) - 64, (12,))
    return torch.stack([data[i:i + 64] for i in ix]).float()

model = torch.nn.Linear(64, 64)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
iter_num = 0
while iter_num < 5000:
    if iter_num % 250 == 0:
        checkpoint = {
            'model': model.state_dict(),
            'optimizer': optimizer.state_dict(),
            'iter_num': iter_num,MORE
        }
        torch.save(checkpoint, 'ckpt.pt')
    loss = model(get_batch()).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
"""

_IMAGENET_EPOCHS = """\
import torch
import torchvision.transforms as transforms
from torch.optim.lr_scheduler import StepLR

def save_checkpoint(state, filename='checkpoint.pth.tar'):
    torch.save(state, filename)

def main_worker(model, train_dataset, epochs):
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    scheduler = StepLR(optimizer, step_size=30, gamma=0.1)
    augment = transforms.RandomResizedCrop(224)
    for epoch in range(epochs):
        train(train_dataset, model, optimizer, epoch)
        scheduler.step()
        save_checkpoint({
            'epoch': epoch + 1,
            'state_dict': model.state_dict(),
            'optimizer': optimizer.state_dict(),MORE
        })
"""


class IncompleteCheckpoint(Rule):
    code = "DET050"
    name = "incomplete-checkpoint"
    severity = Severity.WARNING
    summary = "A resume checkpoint leaves out training state the script uses: an LR scheduler, a GradScaler or the RNG state."
    rationale = """
        A checkpoint that holds the optimizer's state is there to resume
        training.  A resumed run continues as the uninterrupted run would only
        if everything the training loop carries from step to step comes back:
        without the LR scheduler's `state_dict()` the schedule starts over
        (warmup again, the rate of epoch 0 at epoch 60); without the
        GradScaler's the loss scale starts over and the first steps are
        skipped or scaled differently; without the RNG state a seeded script
        draws, after the resume, the numbers it drew at its start: other dropout
        masks, augmentations and batch order than the uninterrupted run.  The
        run still converges, so nothing says the experiment changed;
        `detaudit resume` measures it.  Only what the file itself shows is
        reported: the scheduler and scaler it builds and steps, and RNG draws it
        keeps making (dropout layers, shuffling loaders, random samplers and
        transforms, repeated draws) in a script that seeds that RNG and saves
        the checkpoint from its loop; one RNG state saved counts for all.  A
        dict built by a save helper of a project module is read there, and what
        the call hands it counts as saved.  A dict another file adds to, a
        scheduler built in a project module, dropout inside a model defined
        elsewhere, augmentation and sampling set up in project modules, and
        checkpoints that are not dicts (`accelerator.save_state`, Lightning's,
        timm's `CheckpointSaver`) are not seen.  Weights saved without optimizer
        state are an export, not a resume checkpoint (a resume from weights
        alone loses the optimizer's state too: resume-without-optimizer-state reports that).
        """
    fix_hint = (
        "Put `scheduler.state_dict()`, `scaler.state_dict()` and the RNG states (`torch.get_rng_state()`, "
        "`torch.cuda.get_rng_state_all()`, `np.random.get_state()`, `random.getstate()`) in the checkpoint, and "
        "restore each on resume (`load_state_dict`, `torch.set_rng_state`, ...)."
    )
    VALID = (
        # nanoGPT's loop with the torch RNG state in the checkpoint
        _NANOGPT_LOOP.replace("MORE", "\n            'rng_state': torch.get_rng_state(),"),
        # weights only: an export, not a resume checkpoint
        "import torch\nfrom torch.optim.lr_scheduler import CosineAnnealingLR\ntorch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1))\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nscheduler = CosineAnnealingLR(optimizer, T_max=200)\n"
        "for epoch in range(200):\n    model(torch.ones(2, 4)).sum().backward()\n    optimizer.step()\n    scheduler.step()\n"
        "    torch.save(model.state_dict(), f'model_{epoch}.pt')\n",
        # pytorch/examples imagenet: the scheduler is saved; the script never seeds torch, so the RNG
        # state is missing-torch-seed's business, not this rule's
        _IMAGENET_EPOCHS.replace("MORE", "\n            'scheduler': scheduler.state_dict(),"),
        # the scheduler is rebuilt at the resumed epoch (deep-high-resolution-net)
        "import torch\nmodel = torch.nn.Linear(4, 4)\noptimizer = torch.optim.Adam(model.parameters())\nbegin_epoch = 0\n"
        "scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [90, 120], 0.1, last_epoch=begin_epoch - 1)\n"
        "for epoch in range(begin_epoch, 140):\n    scheduler.step()\n"
        "    torch.save({'epoch': epoch + 1, 'state_dict': model.state_dict(), 'optimizer': optimizer.state_dict()}, 'checkpoint.pth')\n",
        # the scaler's state is added to the dict before the save (MAE's misc.save_model)
        "import torch\nmodel = torch.nn.Linear(4, 4)\noptimizer = torch.optim.AdamW(model.parameters())\n"
        "scaler = torch.cuda.amp.GradScaler()\nfor epoch in range(10):\n    scaler.scale(model(torch.ones(1, 4)).sum()).backward()\n"
        "    scaler.step(optimizer)\n    scaler.update()\n"
        "    to_save = {'model': model.state_dict(), 'optimizer': optimizer.state_dict(), 'epoch': epoch}\n"
        "    to_save['scaler'] = scaler.state_dict()\n    torch.save(to_save, 'checkpoint.pth')\n",
        # a scaler that is off keeps no state
        "import torch\nmodel = torch.nn.Linear(4, 4)\noptimizer = torch.optim.AdamW(model.parameters())\n"
        "scaler = torch.cuda.amp.GradScaler(enabled=False)\nfor step in range(10):\n"
        "    scaler.scale(model(torch.ones(1, 4)).sum()).backward()\n    scaler.step(optimizer)\n    scaler.update()\n"
        "    torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict()}, 'ckpt.pt')\n",
        # the dict goes through a helper before the save: it may add what is missing
        "import torch\nfrom utils import add_rng_state\ntorch.manual_seed(0)\nmodel = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1))\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nfor epoch in range(10):\n"
        "    model(torch.ones(2, 4)).sum().backward()\n    optimizer.step()\n"
        "    state = {'model': model.state_dict(), 'optimizer': optimizer.state_dict()}\n"
        "    add_rng_state(state)\n    torch.save(state, 'ckpt.pt')\n",
        # reseeded every epoch: the RNG state at each epoch's start follows from the epoch
        "import torch\nfrom torch.utils.data import DataLoader\nmodel = torch.nn.Linear(4, 4)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nloader = DataLoader(torch.ones(8, 4), shuffle=True)\n"
        "for epoch in range(10):\n    torch.manual_seed(epoch)\n    for x in loader:\n        model(x).sum().backward()\n"
        "    torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict(), 'epoch': epoch}, 'ckpt.pt')\n",
        # saved once, after training: nothing draws after it
        "import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1))\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(100):\n"
        "    model(torch.ones(2, 4)).sum().backward()\n    optimizer.step()\n"
        "torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict()}, 'final.pt')\n",
    )
    INVALID = (
        # nanoGPT's train.py: seeded, get_batch draws every step, no RNG state in the checkpoint
        Invalid(_NANOGPT_LOOP.replace("MORE", ""), line=20, message="torch RNG"),
        # pytorch/examples imagenet with the scheduler left out
        Invalid(_IMAGENET_EPOCHS.replace("MORE", ""), line=15, message="LR scheduler `scheduler`"),
        # a GradScaler stepped every step and never saved
        Invalid(
            "import torch\nmodel = torch.nn.Linear(4, 4).cuda()\noptimizer = torch.optim.AdamW(model.parameters())\n"
            "scaler = torch.cuda.amp.GradScaler()\nfor step in range(1000):\n"
            "    with torch.autocast('cuda', dtype=torch.float16):\n        loss = model(torch.ones(2, 4, device='cuda')).sum()\n"
            "    scaler.scale(loss).backward()\n    scaler.step(optimizer)\n    scaler.update()\n    optimizer.zero_grad()\n"
            "    if step % 100 == 0:\n"
            "        torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict(), 'step': step}, 'ckpt.pt')\n",
            line=13,
            message="GradScaler `scaler`",
        ),
        # DINO-style dict built in the loop; dropout and a shuffling loader draw every epoch
        Invalid(
            "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader\ntorch.manual_seed(0)\n"
            "model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1))\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "loader = DataLoader(torch.ones(8, 4), batch_size=2, shuffle=True)\nfor epoch in range(10):\n"
            "    for x in loader:\n        model(x).sum().backward()\n        optimizer.step()\n"
            "    save_dict = {'model': model.state_dict(), 'optimizer': optimizer.state_dict(), 'epoch': epoch + 1}\n"
            "    torch.save(save_dict, 'checkpoint.pth')\n",
            line=13,
            message="torch.nn.Dropout",
        ),
    )

    def finish(self) -> None:
        analysis = self.analyses.checkpoints
        checkpoints = analysis.saved
        if not checkpoints:
            return
        state = [s for s in analysis.training_state if not s.restored and not s.disabled and self._used(s)]
        for checkpoint in checkpoints:
            left_out = [s for s in state if not self._saved(checkpoint, s)]
            rng_draws = []
            if analysis.repeats(checkpoint.save) and not analysis.rng_state_saved(checkpoint):
                rng_draws = self._rng_draws(checkpoint)
            if not left_out and not rng_draws:
                continue
            missing = [self._describe(s) for s in left_out]
            missing += [f"the {RNG_LABELS[rng]} state (`{api}` keeps drawing from it)" for rng, api in rng_draws]
            effects = [_EFFECTS[kind] for kind in (SCHEDULER, GRAD_SCALER) if any(s.kind == kind for s in left_out)]
            effects += [_EFFECTS["rng"]] if rng_draws else []
            self.report(
                checkpoint.save.node,
                f"this checkpoint holds the optimizer's state but not {_join(missing)}: a run resumed from it "
                f"does not continue as the uninterrupted run would: {'; '.join(effects)}. "
                "Save each in the checkpoint and restore it on resume.",
            )

    @staticmethod
    def _used(state: TrainingState) -> bool:
        if state.kind == SCHEDULER:
            return any(call.method == "step" for call in state.uses)
        return any(call.method != "load_state_dict" for call in state.uses)

    @staticmethod
    def _saved(checkpoint: Checkpoint, state: TrainingState) -> bool:
        if state.kind == SCHEDULER:
            return checkpoint.mentions(state.name) or checkpoint.has_key_with("sched")
        return checkpoint.mentions(state.name) or checkpoint.has_key_with("scaler") or "amp" in checkpoint.keys

    @staticmethod
    def _describe(state: TrainingState) -> str:
        if state.kind == SCHEDULER:
            return f"the LR scheduler `{state.name}` ({state.callee.rpartition('.')[2]}, stepped with `{state.name}.step()`)"
        assert state.kind == GRAD_SCALER
        return f"the GradScaler `{state.name}` ({state.callee.rpartition('.')[2]})"

    def _rng_draws(self, checkpoint: Checkpoint) -> list[tuple[str, str]]:
        """(RNG, the first API that keeps drawing from it) for each RNG the file seeds
        (on the default path or behind an option) and draws from while it trains
        and saves ``checkpoint``."""
        seeding = self.analyses.seeding
        seeded = set(seeding.seeded) | {rng for off in seeding.off_by_default for rng in off.rngs}
        analysis = self.analyses.checkpoints
        found = []
        for rng in RNGS:
            if rng not in seeded or analysis.reseeded_while_training(rng):
                continue
            draws = analysis.draws_while_training(rng, checkpoint.save)
            if draws:
                found.append((rng, draws[0][1]))
        return found


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
