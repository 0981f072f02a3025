"""The torch RNG drawn from when the file runs, and seeded nowhere (DET001 missing-torch-seed)."""

from __future__ import annotations

from detaudit.knowledge.apis import TORCH
from detaudit.static.rule import Invalid
from detaudit.static.rules.seeding._common import NON_TRAINING_SCRIPTS, MissingSeed


class MissingTorchSeed(MissingSeed):
    code = "DET001"
    name = "missing-torch-seed"
    rng = TORCH
    summary = "The script draws from the torch RNG but never seeds it."
    rationale = """
        Initial weights of `torch.nn` layers, dropout masks, `torch.rand*`,
        `torch.randperm`, `DataLoader(shuffle=True)` and random transforms all
        draw from torch's global generator.  Unseeded, it starts from a
        different state in every process, so two runs of the same script train
        different models and nothing downstream (determinism flags included)
        can make them agree.
        """ + NON_TRAINING_SCRIPTS
    fix_hint = "Call `torch.manual_seed(SEED)` (or `detaudit.seed_everything(SEED)`, which seeds every RNG) at the start of the script."
    VALID = (
        "import torch\nfrom torch import nn\ntorch.manual_seed(0)\nmodel = nn.Linear(4, 2)\n",
        # seeding through a known third-party helper
        "import lightning as L\nimport torch\nL.seed_everything(42)\nx = torch.randn(3)\n",
        "from transformers import set_seed\nimport torch\nset_seed(0)\nnoise = torch.rand(3)\n",
        "import torch\nimport zero\nzero.set_randomness(0)\nmodel = torch.nn.Embedding(10, 4)\n",
        # seeding in the file's own helper, called from the main guard
        "import torch\nfrom torch import nn\n\ndef set_seed(seed):\n    torch.manual_seed(seed)\n\n"
        "def main():\n    set_seed(1)\n    model = nn.Linear(2, 2)\n\nif __name__ == '__main__':\n    main()\n",
        # a library module: nothing runs at import, the caller seeds
        "import torch\nfrom torch import nn\n\ndef build():\n    return nn.Linear(2, 2)\n",
        # a module that only binds names (example inputs of a registry), and a deferred lambda
        "import torch\nexample_args = (torch.randn(3, 4),)\n",
        "import torch\nmake_input = lambda: torch.rand(3)\nprint(make_input)\n",
        # draws from an explicit generator, loads pretrained weights, no shuffling
        "import torch\ng = torch.Generator().manual_seed(0)\nx = torch.randn(3, generator=g)\n",
        "import torchvision\nmodel = torchvision.models.resnet18(weights='DEFAULT')\n",
        "import torch\nloader = torch.utils.data.DataLoader(range(10), batch_size=2, shuffle=False)\n",
        # a script that never trains: the init a checkpoint replaces and a dummy input are setup
        "import torch\nmodel = torch.nn.Linear(4, 2)\nmodel.load_state_dict(torch.load('w.pt'))\n"
        "print(model(torch.ones(1, 4)))\n",
        "import torch\n\nclass Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 2)\n\nif __name__ == '__main__':\n    print(Net()(torch.randn(1, 4)).shape)\n",
        # resuming restores the RNG state
        "import torch\ntorch.set_rng_state(torch.load('rng.pt'))\nx = torch.rand(2)\n",
        # the spawned function seeds its own process
        "import torch\nimport torch.multiprocessing as mp\n\ndef main(rank):\n    torch.manual_seed(rank)\n"
        "    model = torch.nn.Linear(2, 2)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\nif __name__ == '__main__':\n"
        "    mp.spawn(main, nprocs=2)\n",
        # a forked process inherits the parent's seeded RNG state
        "import torch\nimport multiprocessing\n\ndef train():\n    model = torch.nn.Linear(2, 2)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\nif __name__ == '__main__':\n    torch.manual_seed(0)\n"
        "    multiprocessing.Process(target=train).start()\n",
    )
    INVALID = (
        Invalid("import torch\nfrom torch import nn\nmodel = nn.Linear(4, 2)\nmodel(torch.ones(4)).sum().backward()\n", line=3, message="torch.nn.Linear"),
        Invalid("import torch as T\nx = T.randn(3)\nprint(x.sum())\n", line=2),
        Invalid(
            "import torch\nfrom torch import nn\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.fc = nn.Linear(2, 2)\n\ndef main():\n    model = Net()\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\n"
            "if __name__ == '__main__':\n    main()\n",
            line=10,
            message="Net()",
        ),
        Invalid(
            "import torch\nloader = torch.utils.data.DataLoader(range(10), batch_size=2, shuffle=True)\nfor batch in loader:\n    print(batch)\n",
            line=2,
            message="DataLoader(shuffle=True)",
        ),
        # the shuffling loader is named in the one finding (not a second finding at the loader)
        Invalid(
            "import torch\nmodel = torch.nn.Linear(2, 2)\nloader = torch.utils.data.DataLoader(range(10), shuffle=True)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor batch in loader:\n    model(batch)\n",
            line=2,
            message="It also decides the data order of `torch.utils.data.DataLoader(range(10)...`",
        ),
        Invalid("import torch\nimport random\nrandom.seed(0)\nw = torch.empty(3).normal_()\n", line=4),
        # a sampling script: it never trains, but draws noise for every sample it writes
        Invalid(
            "import torch\nmodel = torch.load('model.pt')\nfor i in range(10):\n    torch.save(model(torch.randn(1, 4)), f'{i}.pt')\n",
            line=4,
            message="torch.randn",
        ),
        # training in a function the module calls at top level (no main guard) is the script's code
        Invalid(
            "import torch\n\ndef main():\n    model = torch.nn.Linear(2, 2)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\nmain()\n",
            line=4,
        ),
        # a spawned process starts a fresh interpreter: the parent's seed never reaches it
        Invalid(
            "import torch\nimport torch.multiprocessing as mp\n\ndef main(rank):\n    model = torch.nn.Linear(2, 2)\n"
            "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\nif __name__ == '__main__':\n    torch.manual_seed(0)\n"
            "    mp.spawn(main, nprocs=2)\n",
            line=5,
            message="in a process started by `mp.spawn(main, nprocs=2)`",
        ),
        # seeding the CUDA generators only leaves the CPU generator (weight init) unseeded
        Invalid("import torch\ntorch.cuda.manual_seed_all(0)\nlayer = torch.nn.Conv2d(3, 8, 3)\nopt = torch.optim.SGD(layer.parameters(), lr=0.1)\n", line=3),
    )
