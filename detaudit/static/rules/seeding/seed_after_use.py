"""An RNG drawn from before it is seeded (DET005 seed-after-use)."""

from __future__ import annotations

from detaudit.findings import Severity
from detaudit.knowledge.apis import RNG_LABELS
from detaudit.static.rule import Invalid, Rule
from detaudit.static.rules.seeding._common import NON_TRAINING_SCRIPTS, call_code, seeding_fix, what_draws


class SeedAfterUse(Rule):
    code = "DET005"
    name = "seed-after-use"
    severity = Severity.WARNING
    summary = "The RNG is drawn from before it is seeded."
    rationale = """
        Seeding fixes only the draws that come after it.  A model built (its
        weights initialised), a dataset split or a shuffle made before
        `torch.manual_seed` uses the unseeded generator: those draws differ in
        every run while the code looks seeded.
        """ + NON_TRAINING_SCRIPTS
    fix_hint = "Move the seeding call to the start of the script, before the first model, split or shuffle."
    VALID = (
        "import torch\nfrom torch import nn\ntorch.manual_seed(0)\nmodel = nn.Linear(2, 2)\n",
        "import torch\nfrom torch import nn\n\ndef main():\n    torch.manual_seed(0)\n    model = nn.Linear(2, 2)\n\n"
        "if __name__ == '__main__':\n    main()\n",
        # drawing the seed itself (printed, so a run can be repeated) is not a use
        "import random\nseed = random.randint(1, 10000)\nprint('seed', seed)\nrandom.seed(seed)\nrandom.shuffle([1, 2])\n",
        # building a shuffling loader draws nothing: its sampler draws when the loader is iterated
        "import torch\nloader = torch.utils.data.DataLoader(range(10), shuffle=True)\ntorch.manual_seed(0)\n"
        "model = torch.nn.Linear(1, 1)\nfor batch in loader:\n    model(batch)\n",
        # a numpy draw before the torch seed does not make the torch seed late
        "import numpy as np, torch\nnp.random.seed(0)\nx = np.random.rand(3)\ntorch.manual_seed(0)\ny = torch.rand(3)\n",
        # loaded weights are not drawn
        "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
        "model = AutoModelForCausalLM.from_pretrained('gpt2')\n"
        "Trainer(model=model, args=TrainingArguments('out', seed=0)).train()\n",
    )
    INVALID = (
        Invalid(
            "import torch\nfrom torch import nn\nmodel = nn.Linear(2, 2)\ntorch.manual_seed(0)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
            line=3,
            message="torch.manual_seed(0)",
        ),
        Invalid(
            "import torch\nfrom torch import nn\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.fc = nn.Linear(2, 2)\n\ndef main():\n    model = Net()\n    torch.manual_seed(0)\n    model(1).sum().backward()\n\n"
            "if __name__ == '__main__':\n    main()\n",
            line=10,
        ),
        Invalid("import random\nrandom.shuffle([1, 2])\nrandom.seed(0)\n", line=2),
        # a transformers model built from a config initialises its weights: Trainer seeds only afterwards
        Invalid(
            "from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments\n"
            "model = GPT2LMHeadModel(GPT2Config(n_layer=2))\n"
            "Trainer(model=model, args=TrainingArguments('out', seed=0)).train()\n",
            line=2,
            message="transformers.GPT2LMHeadModel",
        ),
    )

    def finish(self) -> None:
        for rng, (draw, seed) in self.analyses.seeding.drawn_before_seeded.items():
            self.report(
                draw.call.node,
                f"the {RNG_LABELS[rng]} is drawn from here {what_draws(self, draw)}, before "
                f"`{call_code(self, seed)}` seeds it: move the seeding above this point.",
                # unsafe: the early draws get the default seed, not the one the late call passes
                fix=seeding_fix(self, draw.call, frozenset({rng}), safe=False),
            )
