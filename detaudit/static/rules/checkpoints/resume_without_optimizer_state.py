"""A resume that puts back the weights and not the optimizer's state (DET051 resume-without-optimizer-state).

A load is a resume when it continues a run: it reads the epoch, step or
iteration back from the loaded checkpoint (``start_epoch = checkpoint['epoch']``),
runs under a ``resume`` option (``if args.resume:``) or in a function named for
resuming.  Loading pretrained weights to fine-tune from is none of these and is
never reported.  The file must train and step an optimizer that keeps state
(any but plain SGD without momentum), and restore it nowhere: no
``optimizer.load_state_dict(...)``, no load or resume helper handed the
optimizer (``load_checkpoint(path, model, optimizer)``).

Where the fix starts decides where the finding is: at the save when the
checkpoint holds no optimizer state (it must be saved first), else at the load.
Framework resumes (Lightning's ``ckpt_path``, transformers'
``resume_from_checkpoint``) and loads inside project helpers are not read.
"""

from __future__ import annotations

from detaudit.findings import Severity
from detaudit.static.rule import Invalid, Rule

_RESUMED_ADAM = """\
import torch

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
try:
    checkpoint = torch.load('checkpoints/best_model.pth')
    start_epoch = checkpoint['epoch']
    model.load_state_dict(checkpoint['model_state_dict'])MORE
except FileNotFoundError:
    start_epoch = 0
for epoch in range(start_epoch, 100):
    model(torch.ones(8, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    torch.save({'epoch': epoch, 'model_state_dict': model.state_dict(),
                'optimizer_state_dict': optimizer.state_dict()}, 'checkpoints/best_model.pth')
"""

_RESUME_FLAG = """\
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument('--resume', action='store_true')
args = parser.parse_args()
model = torch.nn.Linear(4, 2)
if args.resume:
    model.load_state_dict(torch.load('model.pt'))
optimizer = torch.optim.OPTIMIZER
for step in range(1000):
    model(torch.ones(8, 4)).sum().backward()
    optimizer.step()
    if step % 100 == 0:
        torch.save(model.state_dict(), 'model.pt')
"""


class ResumeWithoutOptimizerState(Rule):
    code = "DET051"
    name = "resume-without-optimizer-state"
    severity = Severity.WARNING
    summary = "A resume loads the model's weights but not the optimizer's state."
    rationale = """
        An optimizer carries state from step to step: Adam's and AdamW's moment
        estimates, SGD's momentum buffers.  A run resumed from weights alone
        starts that state over: the first updates after the resume are those
        of a fresh optimizer (Adam's bias correction from step 1 again, no
        momentum), so the resumed run leaves the trajectory of the
        uninterrupted one at its first step and never comes back to it.  It
        still converges, so nothing says the experiment changed; `detaudit
        resume` measures it.  A load counts as a resume when it reads the
        epoch or step back from the checkpoint, runs under a `resume` option or
        in a function named for resuming; loading pretrained weights to
        fine-tune is not reported.  The finding is at the save when the
        checkpoint holds no optimizer state (it has to be saved first), else at
        the load.  Framework resumes (Lightning's `ckpt_path`, transformers'
        `resume_from_checkpoint`) and loads inside project helpers are not read.
        """
    fix_hint = (
        "Save `optimizer.state_dict()` in the checkpoint and call `optimizer.load_state_dict(checkpoint[...])` "
        "when resuming (with the LR scheduler's and GradScaler's state, if the script has them)."
    )
    VALID = (
        # the optimizer's state is saved and loaded back
        _RESUMED_ADAM.replace("MORE", "\n    optimizer.load_state_dict(checkpoint['optimizer_state_dict'])"),
        # a helper handed the optimizer restores it
        "import torch\nfrom utils import load_checkpoint\nmodel = torch.nn.Linear(4, 2)\n"
        "optimizer = torch.optim.AdamW(model.parameters())\nstart_epoch = load_checkpoint('last.pt', model, optimizer)\n"
        "for epoch in range(start_epoch, 10):\n    model(torch.ones(2, 4)).sum().backward()\n    optimizer.step()\n",
        # fine-tuning from pretrained weights: no position read back, no resume option
        "import torch\nmodel = torch.nn.Linear(4, 2)\nmodel.load_state_dict(torch.load('pretrained.pt'))\n"
        "optimizer = torch.optim.Adam(model.parameters())\nfor step in range(10):\n"
        "    model(torch.ones(2, 4)).sum().backward()\n    optimizer.step()\n",
        # plain SGD keeps no state between steps
        _RESUME_FLAG.replace("OPTIMIZER", "SGD(model.parameters(), lr=0.1)"),
        # an evaluation script resumes nothing
        "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--resume')\nargs = p.parse_args()\n"
        "model = torch.nn.Linear(4, 2)\nif args.resume:\n    model.load_state_dict(torch.load(args.resume))\n"
        "with torch.no_grad():\n    print(model(torch.ones(1, 4)))\n",
    )
    INVALID = (
        # Pointnet++'s automatic resume: the optimizer state is saved, never loaded
        Invalid(_RESUMED_ADAM.replace("MORE", ""), line=8, message="never loads the optimizer state"),
        # makemore's --resume: weights saved and loaded, AdamW's moments never
        Invalid(
            _RESUME_FLAG.replace("OPTIMIZER", "AdamW(model.parameters(), lr=5e-4)"),
            line=15,
            message="holds no optimizer state",
        ),
        # pytorch-cifar's --resume: the checkpoint dict leaves out SGD's momentum buffers
        Invalid(
            "import torch\nmodel = torch.nn.Linear(4, 2)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)\n"
            "checkpoint = torch.load('./checkpoint/ckpt.pth')\nmodel.load_state_dict(checkpoint['net'])\n"
            "start_epoch = checkpoint['epoch']\nfor epoch in range(start_epoch, 200):\n"
            "    model(torch.ones(2, 4)).sum().backward()\n    optimizer.step()\n"
            "    state = {\n        'net': model.state_dict(),\n        'epoch': epoch,\n    }\n"
            "    torch.save(state, './checkpoint/ckpt.pth')\n",
            line=10,
        ),
    )

    def finish(self) -> None:
        for resume in self.analyses.checkpoints.weights_only_resumes:
            optimizer = f"`{resume.optimizer}` ({resume.optimizer_kind})"
            if resume.weights_save is not None:
                load = " ".join(self.context.module.code_for_node(resume.load.node).split())
                load = load if len(load) <= 50 else load[:47] + "..."
                self.report(
                    resume.weights_save,
                    f"this checkpoint, which the resume `{load}` loads ({resume.evidence}), holds no optimizer "
                    f"state: the resumed run starts {optimizer} over, so it leaves the uninterrupted run's trajectory "
                    "at its first step.",
                )
            else:
                self.report(
                    resume.load.node,
                    f"this resume ({resume.evidence}) puts back the model's weights but never loads the optimizer "
                    f"state: {optimizer} starts over, so the resumed run leaves the uninterrupted run's trajectory "
                    "at its first step.",
                )
